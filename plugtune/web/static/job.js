// plugtune console: the job page's training curves, from /api/jobs/{id}/curves.
"use strict";

(function () {
  const PT = window.PT;

  async function drawCurves(grid) {
    try {
      const answer = await PT.api(`/api/jobs/${encodeURIComponent(grid.dataset.job)}/curves`);
      PT.drawCharts(grid, answer.charts, "No training step recorded yet.");
    } catch (err) {
      grid.replaceChildren(PT.el("div", { class: "notice", text: `Could not load the curves: ${err.message}` }));
    }
  }

  // While the job is active, reload the page when its status changes (e.g. the failure banner appears).
  function watchStatus(job, shown) {
    const timer = window.setInterval(async () => {
      try {
        const answer = await PT.api(`/api/jobs/${encodeURIComponent(job)}`);
        if (answer.job.status !== shown) {
          window.clearInterval(timer);
          window.location.reload();
        }
      } catch (err) {
        /* the server may be restarting: try again on the next tick */
      }
    }, 10000);
  }

  document.addEventListener("DOMContentLoaded", () => {
    const grid = document.getElementById("curves");
    if (!grid) return;
    drawCurves(grid);
    const status = document.getElementById("job-status").textContent.trim();
    if (["queued", "validating", "running"].includes(status)) {
      window.setInterval(() => drawCurves(grid), 30000);
      watchStatus(grid.dataset.job, status);
    }
  });
})();
