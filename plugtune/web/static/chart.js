// plugtune console: small SVG line charts, drawn from the JSON API's {title, unit, series} specs.
"use strict";

(function () {
  const PT = window.PT;
  const SVG = "http://www.w3.org/2000/svg";
  const COLORS = ["#2f5bd3", "#c0352b", "#1a7f4b", "#a15c00", "#8a2be2", "#0b6e99", "#b3306f", "#5b6b00"];
  const W = 460;
  const H = 190;
  const PAD = { left: 48, right: 10, top: 10, bottom: 26 };

  function svgEl(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // Round tick values (1, 2, 2.5 or 5 times a power of ten) between lo and hi; whole numbers for steps.
  function niceStep(raw) {
    const power = Math.pow(10, Math.floor(Math.log10(raw)));
    return [1, 2, 2.5, 5, 10].map((m) => m * power).find((s) => s >= raw) || raw;
  }

  function ticks(lo, hi, count, whole) {
    if (hi === lo) return [lo];
    let step = niceStep((hi - lo) / count);
    if (whole) step = Math.max(1, Math.round(step));
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9 && out.length < 20; v += step) {
      out.push(Math.round(v / step) * step);
    }
    return out;
  }

  // Time ticks on whole minutes, hours or days.
  function timeTicks(lo, hi, count) {
    const raw = (hi - lo) / count;
    const steps = [60, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800];
    const step = steps.find((s) => s >= raw) || raw;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi && out.length < 20; v += step) out.push(v);
    return out;
  }

  function fmtX(value, xKind, span) {
    if (xKind !== "time") return PT.fmtNumber(value);
    const d = new Date(value * 1000);
    const hm = `${String(d.getUTCHours()).padStart(2, "0")}:${String(d.getUTCMinutes()).padStart(2, "0")}`;
    if (span > 2 * 86400) return `${d.getUTCMonth() + 1}/${d.getUTCDate()} ${hm}`;
    return hm;
  }

  function bounds(series, spec) {
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    for (const s of series) {
      for (const [x, y] of s.points) {
        if (y === null || !Number.isFinite(y)) continue;
        x0 = Math.min(x0, x); x1 = Math.max(x1, x);
        y0 = Math.min(y0, y); y1 = Math.max(y1, y);
      }
    }
    if (spec.x_min !== undefined && spec.x_min !== null) x0 = spec.x_min;
    if (spec.x_max !== undefined && spec.x_max !== null) x1 = spec.x_max;
    if (y0 > 0 && spec.zero_based !== false) y0 = 0;
    if (y1 === y0) { y1 = y0 + 1; }
    if (x1 === x0) { x1 = x0 + 1; }
    return { x0, x1, y0, y1 };
  }

  // Draws one chart into `container` (replacing its content). spec: {key, title, unit, x: "time"|"step",
  // series: [{name, points: [[x, y], ...]}], empty: "text when there is nothing to draw"}.
  PT.lineChart = function (container, spec) {
    const series = (spec.series || []).filter((s) => s.points && s.points.length);
    const head = PT.el("div", { class: "chart-title" }, [
      spec.title || "",
      spec.unit ? PT.el("span", { class: "chart-unit", text: ` (${spec.unit})` }) : null,
    ]);
    const box = PT.el("div", { class: "chart", "data-chart": spec.key || "" }, [head]);
    if (!series.length) {
      box.append(PT.el("div", { class: "empty", text: spec.empty || "No data in this range." }));
      container.replaceChildren(box);
      return box;
    }
    const b = bounds(series, spec);
    const yStep = niceStep((b.y1 - b.y0) / 4);
    b.y1 = Math.ceil(b.y1 / yStep - 1e-9) * yStep;
    if (b.y0 < 0) b.y0 = Math.floor(b.y0 / yStep + 1e-9) * yStep;
    const sx = (x) => PAD.left + ((x - b.x0) / (b.x1 - b.x0)) * (W - PAD.left - PAD.right);
    const sy = (y) => H - PAD.bottom - ((y - b.y0) / (b.y1 - b.y0)) * (H - PAD.top - PAD.bottom);
    const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img" });
    svg.append(svgEl("title", {}, `${spec.title || ""} ${spec.unit ? "(" + spec.unit + ")" : ""}`));
    for (const y of ticks(b.y0, b.y1, 4, false)) {
      svg.append(svgEl("line", { class: "gridline", x1: PAD.left, x2: W - PAD.right, y1: sy(y), y2: sy(y) }));
      svg.append(svgEl("text", { x: PAD.left - 4, y: sy(y) + 3, "text-anchor": "end" }, PT.fmtNumber(y)));
    }
    const xs = spec.x === "time" ? timeTicks(b.x0, b.x1, 5) : ticks(b.x0, b.x1, 5, spec.x === "step");
    for (const x of xs) {
      const px = sx(x);
      const anchor = px < PAD.left + 20 ? "start" : px > W - PAD.right - 20 ? "end" : "middle";
      svg.append(svgEl("text", { x: px, y: H - 8, "text-anchor": anchor }, fmtX(x, spec.x, b.x1 - b.x0)));
    }
    svg.append(svgEl("line", { class: "axis", x1: PAD.left, x2: PAD.left, y1: PAD.top, y2: H - PAD.bottom }));
    svg.append(svgEl("line", { class: "axis", x1: PAD.left, x2: W - PAD.right, y1: H - PAD.bottom, y2: H - PAD.bottom }));
    const legend = PT.el("div", { class: "legend" });
    series.forEach((s, i) => {
      const color = COLORS[i % COLORS.length];
      const parts = [];
      let pen = "M";
      for (const [x, y] of s.points) {
        if (y === null || !Number.isFinite(y)) { pen = "M"; continue; }
        parts.push(`${pen}${sx(x).toFixed(1)},${sy(y).toFixed(1)}`);
        pen = "L";
      }
      svg.append(svgEl("path", { class: "series", d: parts.join(" "), stroke: color, "data-series": s.name }));
      if (s.points.length === 1) {
        const [x, y] = s.points[0];
        svg.append(svgEl("circle", { cx: sx(x), cy: sy(y), r: 2.5, fill: color }));
      }
      const last = s.points[s.points.length - 1][1];
      const item = PT.el("span", { text: `${s.name}: ${PT.fmtNumber(last)}` });
      item.style.setProperty("--swatch", color);
      legend.append(item);
    });
    addHover(svg, series, spec, sx, sy, b);
    box.append(svg, legend);
    container.replaceChildren(box);
    return box;
  };

  // A vertical guide and the values of every series at the point nearest to the mouse.
  function addHover(svg, series, spec, sx, sy, b) {
    const guide = svgEl("line", { class: "axis", y1: PAD.top, y2: H - PAD.bottom, visibility: "hidden" });
    const label = svgEl("text", { y: PAD.top + 10, visibility: "hidden", class: "hover-label" });
    const overlay = svgEl("rect", {
      x: PAD.left, y: PAD.top, width: W - PAD.left - PAD.right, height: H - PAD.top - PAD.bottom,
      fill: "transparent",
    });
    svg.append(guide, label, overlay);
    overlay.addEventListener("mousemove", (event) => {
      const box = svg.getBoundingClientRect();
      const px = ((event.clientX - box.left) / box.width) * W;
      const x = b.x0 + ((px - PAD.left) / (W - PAD.left - PAD.right)) * (b.x1 - b.x0);
      let nearest = null;
      const parts = [];
      for (const s of series) {
        let best = s.points[0];
        for (const p of s.points) if (Math.abs(p[0] - x) < Math.abs(best[0] - x)) best = p;
        nearest = nearest === null || Math.abs(best[0] - x) < Math.abs(nearest - x) ? best[0] : nearest;
        parts.push(`${s.name} ${PT.fmtNumber(best[1])}`);
      }
      const at = spec.x === "time" ? PT.fmtTime(nearest) : `step ${PT.fmtNumber(nearest)}`;
      guide.setAttribute("x1", sx(nearest));
      guide.setAttribute("x2", sx(nearest));
      label.textContent = `${at} · ${parts.join(" · ")}`;
      const right = sx(nearest) > W / 2;
      label.setAttribute("x", right ? sx(nearest) - 4 : sx(nearest) + 4);
      label.setAttribute("text-anchor", right ? "end" : "start");
      guide.setAttribute("visibility", "visible");
      label.setAttribute("visibility", "visible");
    });
    overlay.addEventListener("mouseleave", () => {
      guide.setAttribute("visibility", "hidden");
      label.setAttribute("visibility", "hidden");
    });
  }

  // Draws every chart of an API answer {charts: [...]} into `grid`, one cell per chart.
  // A chart with a section (a plugin's ctx.metric curves) goes under that section's heading.
  PT.drawCharts = function (grid, charts, emptyText) {
    grid.replaceChildren();
    let section = "";
    for (const spec of charts) {
      if (spec.section && spec.section !== section) {
        section = spec.section;
        grid.append(PT.el("h3", { class: "chart-section", "data-section": section, text: `${section} — ctx.metric per step` }));
      }
      const cell = PT.el("div");
      grid.append(cell);
      PT.lineChart(cell, Object.assign({}, spec, { empty: spec.empty || emptyText }));
    }
  };
})();
