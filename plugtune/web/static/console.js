// plugtune console: shared helpers. Data is always put into the page with textContent, never
// parsed as HTML: everything a plugin or a dataset wrote is untrusted.
"use strict";

const PT = (window.PT = window.PT || {});

PT.el = function (tag, attrs, children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "text") node.textContent = PT.reveal(value);
    else if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, String(value));
  }
  for (const child of children || []) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return node;
};

// Bidi controls shown as ⟨U+202E⟩, so a right-to-left override cannot make gnp.exe read as exe.png
// (the server's templating.reveal does the same).
PT.BIDI = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;
PT.reveal = function (value) {
  return String(value).replace(PT.BIDI, (c) => `⟨U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}⟩`);
};

// Untrusted text in a <tag>: past PT.CLIP characters the rest waits behind "show more" (one 100 KB
// message must not make the page tens of thousands of pixels tall). `load` fetches the full text
// when the page only has the head.
PT.CLIP = 2000;
PT.clipped = function (tag, attrs, text, load) {
  const node = PT.el(tag, attrs);
  const full = String(text === null || text === undefined ? "" : text);
  if (full.length <= PT.CLIP) {
    node.textContent = PT.reveal(full);
    return node;
  }
  node.textContent = `${PT.reveal(full.slice(0, PT.CLIP))}… `;
  const more = Math.max(0, full.length - PT.CLIP);
  const label = load ? "show more" : `show more (${more.toLocaleString("en")} more characters)`;
  node.append(PT.showMore(node, label, load || (async () => full)));
  return node;
};

// A "show more" button that replaces its container's text with what `load()` resolves to.
PT.showMore = function (container, label, load) {
  const button = PT.el("button", { type: "button", class: "show-more", text: label });
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      container.textContent = PT.reveal(await load());
    } catch (err) {
      button.disabled = false;
      button.textContent = `could not load: ${err.message}`;
    }
  });
  return button;
};

PT.api = async function (path, params) {
  const url = new URL(path, window.location.origin);
  for (const [key, value] of Object.entries(params || {})) {
    if (value !== null && value !== undefined && value !== "") url.searchParams.set(key, value);
  }
  const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (!response.ok) {
    let detail = response.statusText;
    try {
      detail = (await response.json()).detail || detail;
    } catch (e) {
      /* not JSON */
    }
    throw new Error(`${response.status}: ${detail}`);
  }
  return response.json();
};

// A write from a page (POST/DELETE): carries the console's CSRF token (<meta name="csrf-token">) as
// the X-CSRF-Token header. Resolves to {status, data} for any answer, so callers can show a 409's or
// a 422's detail; rejects only when the server could not be reached.
PT.send = async function (method, path, body, headers, signal) {
  const meta = document.querySelector('meta[name="csrf-token"]');
  const response = await fetch(new URL(path, window.location.origin), {
    method,
    body,
    signal,
    credentials: "same-origin",
    headers: { Accept: "application/json", "X-CSRF-Token": meta ? meta.content : "", ...(headers || {}) },
  });
  let data = {};
  try {
    data = await response.json();
  } catch (e) {
    data = { detail: `${response.status} ${response.statusText}` };
  }
  return { status: response.status, data };
};

function pad(n) {
  return String(n).padStart(2, "0");
}

// Times are shown in UTC everywhere (server and browser agree).
PT.fmtTime = function (seconds) {
  if (seconds === null || seconds === undefined) return "";
  const d = new Date(seconds * 1000);
  return (
    `${d.getUTCFullYear()}-${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())} ` +
    `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}:${pad(d.getUTCSeconds())}`
  );
};

PT.fmtNumber = function (value) {
  if (value === null || value === undefined) return "–";
  if (!Number.isFinite(value)) return String(value);
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 0.001 || abs >= 1e6)) return value.toExponential(2);
  return String(Math.round(value * 1000) / 1000);
};

PT.fmtDuration = function (seconds) {
  seconds = Math.max(0, Math.round(seconds));
  const h = Math.floor(seconds / 3600);
  const m = Math.floor((seconds % 3600) / 60);
  const s = seconds % 60;
  return h > 0 ? `${h}h ${pad(m)}m ${pad(s)}s` : `${m}m ${pad(s)}s`;
};

PT.badge = function (kind, value) {
  return PT.el("span", { class: `badge ${kind}-${value}`, text: value });
};

// Countdown to a platform error's automatic retry: <span data-countdown-to="epoch seconds">.
PT.startCountdowns = function () {
  const nodes = document.querySelectorAll("[data-countdown-to]");
  if (!nodes.length) return;
  const tick = () => {
    const now = Date.now() / 1000;
    for (const node of nodes) {
      const left = Number(node.dataset.countdownTo) - now;
      node.textContent = left > 0 ? `automatic retry in ${PT.fmtDuration(left)}` : "automatic retry due now";
    }
  };
  tick();
  window.setInterval(tick, 1000);
};

// Server-rendered times carry data-time="epoch seconds"; keep them in one format.
PT.formatTimes = function (root) {
  for (const node of (root || document).querySelectorAll("[data-time]")) {
    const value = Number(node.dataset.time);
    if (Number.isFinite(value) && value > 0) node.textContent = PT.fmtTime(value);
  }
};

document.addEventListener("DOMContentLoaded", () => {
  PT.startCountdowns();
});
