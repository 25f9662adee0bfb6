// plugtune console: the jobs list. Keeps its rows (statuses, queue positions, Steps done, new jobs)
// current from GET /api/jobs with the page's search, every few seconds while a job on it is queued
// or running (slower otherwise); the checkboxes pick 2-5 jobs for /compare (kept across pages).
"use strict";

(function () {
  const PT = window.PT;
  const ACTIVE_MS = 3000;
  const IDLE_MS = 20000;
  const ACTIVE = ["queued", "validating", "running"];
  const PICKED = "plugtune.compare.picked";
  const NAME_CLIP = 200;

  function picked() {
    try {
      const ids = JSON.parse(window.sessionStorage.getItem(PICKED) || "[]");
      return Array.isArray(ids) ? ids.filter((id) => Number.isInteger(id)) : [];
    } catch (e) {
      return [];
    }
  }

  function savePicked(ids) {
    try {
      window.sessionStorage.setItem(PICKED, JSON.stringify(ids));
    } catch (e) {
      /* storage off: the pick still works on this page */
    }
  }

  function updateCompare(form) {
    const ids = picked();
    const max = Number(form.dataset.max);
    const button = form.querySelector("#compare-button");
    const hint = form.querySelector("#compare-hint");
    form.querySelector("#compare-ids").value = ids.join(",");
    button.disabled = ids.length < 2 || ids.length > max;
    if (!ids.length) hint.textContent = `pick 2 to ${max} jobs with the checkboxes`;
    else if (ids.length > max) hint.textContent = `${ids.length} picked: at most ${max} can be compared`;
    else hint.textContent = `picked: ${ids.map((id) => "#" + id).join(", ")}${ids.length < 2 ? " (pick one more)" : ""}`;
    if (ids.length) {
      hint.append(" ", PT.el("button", { type: "button", class: "show-more", id: "compare-clear", text: "clear", onclick: () => {
        savePicked([]);
        for (const box of document.querySelectorAll("#jobs input.pick")) box.checked = false;
        updateCompare(form);
      } }));
    }
  }

  function statusCell(job) {
    const parts = [PT.badge("status", job.status)];
    if (job.queue_position) parts.push(" ", PT.el("span", { class: "muted queue-position", text: `#${job.queue_position} in queue` }));
    return parts;
  }

  function steps(job) {
    return `${job.steps_done}${job.total_steps ? " / " + job.total_steps : ""}`;
  }

  function cell(name, content) {
    const td = PT.el("td", { "data-cell": name });
    if (Array.isArray(content)) td.append(...content);
    else td.textContent = PT.reveal(content);
    return td;
  }

  function row(job, chosen) {
    const box = PT.el("input", { type: "checkbox", class: "pick", value: job.id, "aria-label": `compare job ${job.id}` });
    box.checked = chosen.includes(job.id);
    const name = job.name.length > NAME_CLIP ? PT.clipped("td", { "data-cell": "name" }, job.name) : cell("name", job.name);
    return PT.el("tr", { "data-job": job.id, "data-status": job.status }, [
      PT.el("td", {}, [box]),
      PT.el("td", { class: "mono" }, [PT.el("a", { href: `/jobs/${job.id}`, text: String(job.id) })]),
      name,
      cell("status", statusCell(job)),
      cell("type", job.error ? job.error.type : ""),
      cell("owner", job.error ? job.error.owner : ""),
      cell("steps", steps(job)),
      cell("created", PT.fmtTime(job.created_at)),
      cell("updated", PT.fmtTime(job.updated_at)),
    ]);
  }

  function isActive(table) {
    return [...table.querySelectorAll("tbody tr[data-status]")].some((tr) => ACTIVE.includes(tr.dataset.status));
  }

  // Rows still there are updated in place (a checkbox being clicked keeps its focus); the body is
  // rebuilt only when the page's set of jobs changed (a new job, one that left this search).
  function render(table, items) {
    const body = table.tBodies[0];
    const shown = [...body.querySelectorAll("tr[data-job]")].map((tr) => Number(tr.dataset.job));
    const same = shown.length === items.length && items.every((job, i) => job.id === shown[i]);
    if (!same) {
      const chosen = picked();
      const empty = PT.el("tr", { class: "empty-row" }, [
        PT.el("td", { colspan: 9, class: "muted", text: table.dataset.searched ? "No jobs match this search." : "No jobs." }),
      ]);
      body.replaceChildren(...(items.length ? items.map((job) => row(job, chosen)) : [empty]));
      return;
    }
    for (const job of items) {
      const tr = body.querySelector(`tr[data-job="${job.id}"]`);
      const old = (name) => tr.querySelector(`[data-cell="${name}"]`);
      tr.dataset.status = job.status;
      old("status").replaceChildren(...statusCell(job));
      old("type").textContent = job.error ? job.error.type : "";
      old("owner").textContent = job.error ? job.error.owner : "";
      old("steps").textContent = steps(job);
      old("updated").textContent = PT.fmtTime(job.updated_at);
    }
  }

  async function refresh(table) {
    const d = table.dataset;
    const size = Number(d.pageSize);
    const params = {
      q: d.q, status: d.status, cause: d.cause,
      limit: size, offset: (Number(d.page) - 1) * size,
      page: d.page, page_size: size,
    };
    try {
      const answer = await PT.api("/api/jobs", params);
      render(table, answer.items);
      const label = document.querySelector(".pager .muted");
      const pages = Math.max(1, Math.ceil(answer.total / size));
      const noun = answer.total === 1 ? "job" : "jobs";
      if (label) label.textContent = `page ${d.page} of ${pages} · ${answer.total} ${noun}${d.searched ? " found" : ""}`;
    } catch (err) {
      /* the server may be restarting: try again on the next tick */
    }
  }

  function schedule(table, note) {
    const active = isActive(table);
    note.hidden = !active;
    window.setTimeout(async () => {
      await refresh(table);
      schedule(table, note);
    }, active ? ACTIVE_MS : IDLE_MS);
  }

  document.addEventListener("DOMContentLoaded", () => {
    const table = document.getElementById("jobs");
    const form = document.getElementById("compare-form");
    if (!table || !form) return;
    const chosen = picked();
    for (const box of table.querySelectorAll("input.pick")) box.checked = chosen.includes(Number(box.value));
    table.addEventListener("change", (event) => {
      const box = event.target;
      if (!box.classList || !box.classList.contains("pick")) return;
      const id = Number(box.value);
      const ids = picked().filter((x) => x !== id);
      if (box.checked) ids.push(id);
      savePicked(ids);
      updateCompare(form);
    });
    updateCompare(form);
    schedule(table, document.getElementById("jobs-live"));
  });
})();
