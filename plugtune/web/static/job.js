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

  document.addEventListener("DOMContentLoaded", () => {
    const grid = document.getElementById("curves");
    if (!grid) return;
    drawCurves(grid);
    if (grid.dataset.running === "true") window.setInterval(() => drawCurves(grid), 30000);
  });
})();
