// plugtune console: the job page's training curves, from /api/jobs/{id}/curves.
"use strict";

(function () {
  const PT = window.PT;
  const POLL_MS = 5000;

  async function drawCurves(grid) {
    try {
      const answer = await PT.api(`/api/jobs/${encodeURIComponent(grid.dataset.job)}/curves`);
      PT.drawCharts(grid, answer.charts, "No training step recorded yet.");
    } catch (err) {
      grid.replaceChildren(PT.el("div", { class: "notice", text: `Could not load the curves: ${err.message}` }));
    }
  }

  function setText(id, text) {
    const node = document.getElementById(id);
    if (node) node.textContent = text;
  }

  // While the job is active: steps, duration, ETA and queue position stay current; the page reloads
  // when its status changes (e.g. the failure banner appears).
  function watchStatus(job, shown) {
    const timer = window.setInterval(async () => {
      try {
        const answer = await PT.api(`/api/jobs/${encodeURIComponent(job)}`);
        const j = answer.job;
        if (j.status !== shown) {
          window.clearInterval(timer);
          window.location.reload();
          return;
        }
        setText("steps-done", `${j.steps_done}${j.total_steps ? " / " + j.total_steps : ""}`);
        setText("job-status-text", j.status + (j.queue_position ? ` · position ${j.queue_position} in the queue` : ""));
        if (j.duration_s !== null) setText("job-duration", PT.fmtDuration(j.duration_s));
        setText("job-eta", j.eta_s !== null ? `about ${PT.fmtDuration(j.eta_s)} to the last step` : "after the first step");
        setText("job-updated", PT.fmtTime(j.updated_at));
      } catch (err) {
        /* the server may be restarting: try again on the next tick */
      }
    }, POLL_MS);
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
