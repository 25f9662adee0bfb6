// plugtune console: the jobs list keeps its statuses, queue positions and steps current (polls the API).
"use strict";

(function () {
  const PT = window.PT;
  const POLL_MS = 5000;

  function statusCell(cell, job) {
    const parts = [PT.badge("status", job.status)];
    if (job.queue_position) parts.push(" ", PT.el("span", { class: "muted queue-position", text: `#${job.queue_position} in queue` }));
    cell.replaceChildren(...parts);
  }

  async function refresh(table) {
    let answer;
    try {
      answer = await PT.api("/api/jobs", { page: table.dataset.page, status: table.dataset.status });
    } catch (err) {
      return; /* the server may be restarting: try again on the next tick */
    }
    for (const job of answer.items) {
      const row = table.querySelector(`tr[data-job="${job.id}"]`);
      if (!row) continue;
      const cell = (name) => row.querySelector(`[data-cell="${name}"]`);
      statusCell(cell("status"), job);
      cell("type").textContent = job.error ? job.error.type : "";
      cell("owner").textContent = job.error ? job.error.owner : "";
      cell("steps").textContent = `${job.steps_done}${job.total_steps ? " / " + job.total_steps : ""}`;
      cell("updated").textContent = PT.fmtTime(job.updated_at);
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    const table = document.getElementById("jobs");
    if (table) window.setInterval(() => refresh(table), POLL_MS);
  });
})();
