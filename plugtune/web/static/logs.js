// plugtune console: live tail of Logs › Custom plugin logs while the job runs (polls the JSON API).
"use strict";

(function () {
  const PT = window.PT;
  const POLL_MS = 3000;
  const MAX_ROWS = 500;

  function row(job, line) {
    const trajectory = line.trajectory_id
      ? PT.el("a", { href: `/jobs/${encodeURIComponent(job)}/trajectories?t=${encodeURIComponent(line.trajectory_id)}`, text: line.trajectory_id })
      : null;
    return PT.el("tr", { "data-id": line.id }, [
      PT.el("td", { class: "mono", text: PT.fmtTime(line.time) }),
      PT.el("td", {}, [
        PT.badge("level", line.level),
        line.source && line.source !== "logger" ? PT.el("span", { class: "muted small-tag", text: ` ${line.source}` }) : null,
      ]),
      PT.el("td", { class: "mono", text: line.plugin }),
      PT.el("td", { class: "mono" }, [trajectory]),
      PT.el("td", { class: "msg-text", text: line.message }),
    ]);
  }

  document.addEventListener("DOMContentLoaded", () => {
    const table = document.getElementById("log-table");
    const toggle = document.getElementById("live-tail");
    if (!table || !toggle) return;
    const job = table.dataset.job;
    const body = table.tBodies[0];
    let latest = Number(table.dataset.latest) || 0;
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
          body.prepend(...fresh.map((line) => row(job, line)));
          latest = Math.max(latest, ...fresh.map((line) => line.id));
          while (body.rows.length > MAX_ROWS) body.deleteRow(-1);
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
