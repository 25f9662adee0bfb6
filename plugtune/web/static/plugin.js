// plugtune console: the Plugin tab's selector, resource-monitoring charts and dependency panels.
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

  const NO_DEPENDENCY =
    "This plugin declares no dependency. A service its code calls (an LLM judge, an API) is declared in " +
    "job.yaml dependencies: (name: URL, with rpm and concurrency if it has limits); each then has a panel " +
    "here: requests/s, latency p50/p99, errors by cause, the budget in use and the 429 share.";

  function budgetText(dep) {
    const parts = [
      `rpm ${dep.rpm === null ? "not declared" : dep.rpm}`,
      `concurrency ${dep.concurrency === null ? "not declared" : dep.concurrency}`,
    ];
    if (dep.timeout_s !== null) parts.push(`timeout_s ${dep.timeout_s}`);
    return parts.join(" · ");
  }

  function summaryText(summary) {
    if (summary.peak_requests_per_s === undefined) return "Nothing measured in this range.";
    if (summary.peak_requests_per_s === 0) return "No request in this range.";
    const parts = [
      `up to ${PT.fmtNumber(summary.peak_requests_per_s)} requests/s`,
      `${PT.fmtNumber(Math.round(summary.rate_limited_share * 1000) / 10)}% of requests rate limited (429)`,
    ];
    if (summary.peak_latency_p99_ms !== undefined) parts.push(`p99 up to ${PT.fmtNumber(summary.peak_latency_p99_ms)} ms`);
    return `In this range: ${parts.join(" · ")}.`;
  }

  // A panel per declared dependency (name, URL, declared budget, its charts), or the empty state.
  function drawDependencies(root, panels, emptyText) {
    if (!panels.length) {
      root.replaceChildren(PT.el("div", { class: "notice", id: "no-dependencies", text: NO_DEPENDENCY }));
      return;
    }
    root.replaceChildren();
    for (const dep of panels) {
      const grid = PT.el("div", { class: "charts" });
      root.append(
        PT.el("section", { class: "panel dependency", "data-dependency": dep.name }, [
          PT.el("h3", { class: "mono dep-name", text: dep.name }),
          PT.el("dl", { class: "kv" }, [
            PT.el("dt", { text: "URL" }),
            PT.el("dd", { class: "mono dep-url", text: dep.url }),
            PT.el("dt", { text: "Declared budget" }),
            PT.el("dd", { class: "mono dep-budget", text: budgetText(dep) }),
          ]),
          dep.note ? PT.el("div", { class: "notice dep-note", text: dep.note }) : null,
          PT.el("p", { class: "dep-summary", text: summaryText(dep.summary || {}) }),
          grid,
        ]),
      );
      PT.drawCharts(grid, dep.charts, emptyText);
    }
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
        drawDependencies(document.getElementById("plugin-dependencies"), answer.dependencies || [], empty);
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
