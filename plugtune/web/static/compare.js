// plugtune console: the compare view draws its curves (one series per job) from GET /api/compare.
"use strict";

(function () {
  const PT = window.PT;

  document.addEventListener("DOMContentLoaded", async () => {
    const grid = document.getElementById("compare-charts");
    if (!grid) return;
    try {
      const answer = await PT.api("/api/compare", { ids: grid.dataset.ids });
      PT.drawCharts(grid, answer.charts, "No job recorded it.");
      grid.dataset.loaded = "1";
    } catch (err) {
      grid.replaceChildren(PT.el("div", { class: "notice", text: `Could not load the curves: ${err.message}` }));
    }
  });
})();
