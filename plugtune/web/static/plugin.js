// plugtune console: the Plugin tab's selector and resource-monitoring charts.
"use strict";

(function () {
  const PT = window.PT;
  const REFRESH_MS = 60000;

  function toUtcInput(seconds) {
    return new Date(seconds * 1000).toISOString().slice(0, 16);
  }

  function fromUtcInput(value) {
    if (!value) return null;
    const ms = Date.parse(`${value}:00Z`);
    return Number.isFinite(ms) ? ms / 1000 : null;
  }

  function setup(grid) {
    const job = grid.dataset.job;
    const plugin = grid.dataset.plugin;
    const query = new URLSearchParams(window.location.search);
    const state = {
      range: grid.dataset.range || "life",
      start: Number(query.get("start")) || null,
      end: Number(query.get("end")) || null,
    };
    if (state.range === "custom" && (state.start === null || state.end === null)) state.range = "life";
    const notice = document.getElementById("reclaimed-notice");
    const windowLabel = document.getElementById("window-label");
    const refreshed = document.getElementById("refreshed");
    const custom = document.getElementById("custom-range");

    async function load() {
      const params = { range: state.range };
      if (state.range === "custom") Object.assign(params, { start: state.start, end: state.end });
      try {
        const path = `/api/jobs/${encodeURIComponent(job)}/plugins/${encodeURIComponent(plugin)}/metrics`;
        const [answer, info] = await Promise.all([
          PT.api(path, params),
          PT.api(`/api/jobs/${encodeURIComponent(job)}/plugins/${encodeURIComponent(plugin)}`),
        ]);
        const status = document.getElementById("plugin-status");
        if (status && status.textContent !== info.status) status.replaceWith(Object.assign(PT.badge("status", info.status), { id: "plugin-status" }));
        notice.hidden = !answer.reclaimed;
        notice.textContent = answer.reclaimed ? answer.reclaimed_message : "";
        windowLabel.textContent = `${PT.fmtTime(answer.start)} – ${PT.fmtTime(answer.end)} UTC`;
        const empty = answer.reclaimed ? "Monitoring data reclaimed." : "No data in this range.";
        PT.drawCharts(grid, answer.charts, empty);
        grid.dataset.loadedRange = state.range;
        refreshed.textContent = `updated ${PT.fmtTime(Date.now() / 1000)} UTC · auto-refresh every minute`;
        if (state.range !== "custom") {
          document.getElementById("custom-start").value = toUtcInput(answer.start);
          document.getElementById("custom-end").value = toUtcInput(answer.end);
        }
      } catch (err) {
        grid.replaceChildren(PT.el("div", { class: "notice", text: `Could not load the metrics: ${err.message}` }));
      }
    }

    function remember() {
      const url = new URL(window.location.href);
      url.searchParams.set("range", state.range);
      for (const key of ["start", "end"]) {
        if (state.range === "custom") url.searchParams.set(key, String(Math.round(state[key])));
        else url.searchParams.delete(key);
      }
      window.history.replaceState(null, "", url);
      const hidden = document.getElementById("plugin-range-input");
      if (hidden) hidden.value = state.range;
    }

    for (const button of document.querySelectorAll("#range-toolbar [data-range]")) {
      button.addEventListener("click", () => {
        for (const other of document.querySelectorAll("#range-toolbar [data-range]")) {
          other.classList.toggle("active", other === button);
        }
        const range = button.dataset.range;
        custom.hidden = range !== "custom";
        if (range === "custom") return; // applied with the Apply button
        state.range = range;
        remember();
        load();
      });
    }
    document.getElementById("custom-apply").addEventListener("click", () => {
      const start = fromUtcInput(document.getElementById("custom-start").value);
      const end = fromUtcInput(document.getElementById("custom-end").value);
      if (start === null || end === null || end <= start) {
        windowLabel.textContent = "Pick a start before the end (UTC).";
        return;
      }
      Object.assign(state, { range: "custom", start, end });
      remember();
      load();
    });
    document.getElementById("refresh").addEventListener("click", load);
    window.setInterval(load, REFRESH_MS);
    load();
  }

  document.addEventListener("DOMContentLoaded", () => {
    const select = document.getElementById("plugin-select");
    if (select) {
      select.addEventListener("change", () => {
        const url = new URL(window.location.href);
        url.searchParams.set("plugin", select.value);
        window.location.assign(url);
      });
    }
    const grid = document.getElementById("plugin-charts");
    if (grid) setup(grid);
  });
})();
