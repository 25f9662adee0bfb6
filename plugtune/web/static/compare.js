// plugtune console: the compare view draws its curves (one series per job), and draws them again
// from GET /api/compare every few seconds while a compared job is queued or running.
"use strict";

(function () {
  const PT = window.PT;
  const POLL_MS = 5000;
  const ACTIVE = ["queued", "validating", "running"];

  // The page carries its first curves (<script type="application/json">); later ones come from the API.
  function carried() {
    const node = document.getElementById("compare-curves");
    if (!node) return null;
    node.remove();
    return JSON.parse(node.textContent);
  }

  async function draw(grid) {
    try {
      const answer = carried() || (await PT.api("/api/compare", { ids: grid.dataset.ids }));
      PT.drawCharts(grid, answer.charts, "No job recorded it.");
      grid.dataset.loaded = String(Number(grid.dataset.loaded || 0) + 1);
      return answer.jobs.some((job) => ACTIVE.includes(job.status));
    } catch (err) {
      grid.replaceChildren(PT.el("div", { class: "notice", text: `Could not load the curves: ${err.message}` }));
      return true; /* the server may be restarting: try again */
    }
  }

  async function loop(grid) {
    if (await draw(grid)) window.setTimeout(() => loop(grid), POLL_MS);
  }

  document.addEventListener("DOMContentLoaded", () => {
    const grid = document.getElementById("compare-charts");
    if (grid) loop(grid);
  });
})();
