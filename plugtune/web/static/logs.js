// plugtune console: live tail of Logs › Custom plugin logs while the job runs (polls the JSON API).
"use strict";

(function () {
  const PT = window.PT;
  const POLL_MS = 3000;
  const MAX_ROWS = 500;

  // UTC with milliseconds, as the server renders the page: lines of one burst stay apart.
  function fmtTime(seconds) {
    const ms = Math.floor(seconds * 1000) % 1000;
    return `${PT.fmtTime(seconds)}.${String(ms).padStart(3, "0")}`;
  }

  // Where the live tail left lines out (more arrived than one poll shows): say how many, and link
  // to them, oldest first from the last line shown before.
  function skippedRow(table, count, after) {
    const query = new URLSearchParams({ order: "oldest", after: String(after) });
    for (const key of ["plugin", "level", "trajectory", "q"]) {
      if (table.dataset[key]) query.set(key, table.dataset[key]);
    }
    return PT.el("tr", { class: "skip-row" }, [
      PT.el("td", { colspan: "5", class: "muted" }, [
        `⋯ ${count.toLocaleString()} more lines arrived here than the live tail shows at once; `,
        PT.el("a", { href: `?${query}`, text: "read them oldest first" }),
      ]),
    ]);
  }

  function row(job, line) {
    const trajectory = line.trajectory_id
      ? PT.el("a", { href: `/jobs/${encodeURIComponent(job)}/trajectories?t=${encodeURIComponent(line.trajectory_id)}`, text: line.trajectory_id })
      : null;
    return PT.el("tr", { "data-id": line.id }, [
      PT.el("td", { class: "mono", text: fmtTime(line.time) }),
      PT.el("td", {}, [
        PT.badge("level", line.level),
        line.source && line.source !== "logger" ? PT.el("span", { class: "muted small-tag", text: ` ${line.source}` }) : null,
      ]),
      PT.el("td", { class: "mono", text: line.plugin }),
      PT.el("td", { class: "mono" }, [trajectory]),
      PT.clipped("td", { class: "msg-text" }, line.message),
    ]);
  }

  // The page sends a long line's head only: "show more" loads that one line from the API.
  function loadLine(job, id) {
    return async () => {
      const answer = await PT.api(`/api/jobs/${encodeURIComponent(job)}/logs`, { before: id + 1, limit: 1 });
      const line = answer.items.find((l) => l.id === id);
      if (!line) throw new Error(`line ${id} is gone (reclaimed?)`);
      return line.message;
    };
  }

  document.addEventListener("DOMContentLoaded", () => {
    const table = document.getElementById("log-table");
    if (!table) return;
    for (const button of table.querySelectorAll("button.show-more[data-line]")) {
      const cell = button.closest("td");
      const fresh = PT.showMore(cell, button.textContent, loadLine(table.dataset.job, Number(button.dataset.line)));
      button.replaceWith(fresh);
    }
    const toggle = document.getElementById("live-tail");
    if (!toggle) return;
    const job = table.dataset.job;
    const body = table.tBodies[0];
    let latest = Number(table.dataset.latest) || 0;
    let skipped = 0;
    let busy = false;

    async function poll() {
      if (!toggle.checked || busy) return;
      busy = true;
      try {
        const answer = await PT.api(`/api/jobs/${encodeURIComponent(job)}/logs`, {
          after: latest, plugin: table.dataset.plugin, level: table.dataset.level,
          trajectory: table.dataset.trajectory, q: table.dataset.q, limit: 200,
        });
        // The API answers newest first; the newest goes on top.
        const fresh = answer.items.filter((line) => line.id > latest);
        if (fresh.length) {
          body.querySelector(".empty-row")?.remove();
          if (answer.skipped > 0) {
            body.prepend(skippedRow(table, answer.skipped, latest));
            skipped += answer.skipped;
            const note = document.getElementById("tail-skipped");
            if (note) {
              note.textContent = `The live tail skipped ${skipped.toLocaleString()} lines (marked ⋯ where): more arrived between two polls than it shows at once. "Oldest first" reads every line.`;
              note.hidden = false;
            }
          }
          body.prepend(...fresh.map((line) => row(job, line)));
          latest = Math.max(latest, ...fresh.map((line) => line.id));
          if (body.rows.length > MAX_ROWS) {
            while (body.rows.length > MAX_ROWS) body.deleteRow(-1);
            const note = document.getElementById("tail-cap");
            if (note) note.hidden = false;
          }
        }
        if (answer.job_status && answer.job_status !== "running" && answer.job_status !== "queued") {
          toggle.checked = false;
          toggle.disabled = true;
          toggle.parentElement.append(` (job ${answer.job_status})`);
        }
      } catch (err) {
        /* keep polling: the server may be restarting */
      } finally {
        busy = false;
      }
    }
    window.setInterval(poll, POLL_MS);
  });
})();
