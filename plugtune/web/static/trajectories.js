// plugtune console: Trajectory analysis detail panel, its log area and the full-screen navigation.
// Everything shown here came from a plugin or a dataset: it goes in with textContent only.
"use strict";

(function () {
  const PT = window.PT;

  function section(title, children) {
    return PT.el("section", {}, [PT.el("h3", { text: title }), ...children]);
  }

  function renderMessages(messages) {
    return messages.map((m) => {
      const calls = (m.tool_calls || []).map((call) =>
        PT.clipped("div", { class: "toolcall" }, `→ ${call.name}(${call.arguments})${call.id ? "  [" + call.id + "]" : ""}`),
      );
      const role = m.role + (m.name ? ` · ${m.name}` : "") + (m.tool_call_id ? ` · reply to ${m.tool_call_id}` : "");
      return PT.el("div", { class: `msg role-${m.role}` }, [
        PT.el("div", { class: "role", text: role }),
        m.content ? PT.clipped("div", { class: "content" }, m.content) : null,
        ...calls,
      ]);
    });
  }

  function renderRewards(t) {
    const rows = [["reward", t.reward], ["advantage", t.advantage]];
    for (const [grader, value] of Object.entries(t.reward_components || {})) rows.push([`grader ${grader}`, value]);
    return PT.el("dl", { class: "kv", id: "reward-components" }, rows.flatMap(([k, v]) => [
      PT.el("dt", { text: k }),
      PT.el("dd", { text: PT.fmtNumber(v) }),
    ]));
  }

  // The trajectory's own values: its rollout's ctx.metric by name, each grader's as <grader>/<name>.
  function renderMetrics(metrics) {
    const names = Object.keys(metrics).sort();
    if (!names.length) return PT.el("div", { class: "muted", text: "No metric." });
    return PT.el("dl", { class: "kv", id: "trajectory-metrics" }, names.flatMap((k) => [
      PT.el("dt", { class: "mono", text: k }),
      PT.el("dd", { text: PT.fmtNumber(metrics[k]) }),
    ]));
  }

  function renderErrors(errors) {
    if (!errors.length) return [PT.el("div", { class: "muted", text: "No error." })];
    return errors.map((e) => PT.el("div", { class: "error-item" }, [
      PT.el("strong", { text: `${e.type}${e.cause ? " · " + e.cause : ""}${e.plugin ? " [" + e.plugin + "]" : ""}` }),
      PT.clipped("span", {}, ` attempt ${e.attempt}: ${e.message}`),
      e.traceback ? PT.el("pre", { text: e.traceback }) : null,
    ]));
  }

  // How the reply ended: the model's own finish reasons in words, any other reason as it is.
  function stopText(reason) {
    if (!reason) return "";
    if (reason === "stop") return " · the model ended its reply";
    if (reason === "length") return " · reply cut at max_new_tokens";
    return ` · ended: ${reason}`;
  }

  function renderLogs(t, job) {
    const open = t.status === "failed" || t.status === "discard";
    const details = PT.el("details", { class: "logs", id: "trajectory-logs" });
    details.open = open;
    const count = t.logs.items.length + (t.logs.truncated ? "+" : "");
    details.append(PT.el("summary", { text: `Log lines (${count})` }));
    const plugins = [...new Set(t.logs.items.map((l) => l.plugin))].sort();
    const select = PT.el("select", { id: "log-plugin-filter", "aria-label": "plugin" }, [
      PT.el("option", { value: "", text: "all plugins" }),
      ...plugins.map((p) => PT.el("option", { value: p, text: p })),
    ]);
    const body = PT.el("tbody");
    const fill = () => {
      const wanted = select.value;
      const rows = t.logs.items
        .filter((l) => !wanted || l.plugin === wanted)
        .map((l) => PT.el("tr", { "data-plugin": l.plugin }, [
          PT.el("td", { class: "mono", text: PT.fmtTime(l.time) }),
          PT.el("td", {}, [PT.badge("level", l.level)]),
          PT.el("td", { class: "mono", text: l.plugin }),
          PT.clipped("td", { class: "msg-text" }, l.message),
        ]));
      body.replaceChildren(...(rows.length ? rows : [PT.el("tr", {}, [PT.el("td", { class: "muted", colspan: 4, text: "No log line." })])]));
    };
    select.addEventListener("change", fill);
    fill();
    const table = PT.el("table", { class: "grid loglines" }, [
      PT.el("thead", {}, [PT.el("tr", {}, ["Time (UTC)", "Level", "Plugin", "Detail"].map((h) => PT.el("th", { text: h })))]),
      body,
    ]);
    const cap = t.logs.truncated
      ? PT.el("div", { class: "muted", id: "trajectory-logs-cap" }, [
          `Only the newest ${t.logs.items.length} lines are shown here; `,
          PT.el("a", { href: `/jobs/${encodeURIComponent(job)}/logs?trajectory=${encodeURIComponent(t.id)}`, text: "the Logs page has every line" }),
          ".",
        ])
      : null;
    // append() would write a null as the text "null": leave the cap out when there is none.
    details.append(...[PT.el("div", { class: "toolbar" }, [PT.el("label", {}, ["Plugin ", select])]), cap, table].filter(Boolean));
    return details;
  }

  function setup(panel) {
    const job = panel.dataset.job;
    const filters = new URLSearchParams(panel.dataset.filters || "");
    const state = { id: panel.dataset.selected || null, prev: null, next: null, loading: false };

    function enterFullscreen() {
      panel.classList.add("fullscreen");
      if (panel.requestFullscreen) panel.requestFullscreen().catch(() => {});
    }
    function exitFullscreen() {
      panel.classList.remove("fullscreen");
      if (document.fullscreenElement && document.exitFullscreen) document.exitFullscreen().catch(() => {});
    }
    document.addEventListener("fullscreenchange", () => {
      if (!document.fullscreenElement) panel.classList.remove("fullscreen");
    });

    function navBar(t) {
      const isFull = panel.classList.contains("fullscreen");
      return PT.el("div", { class: "nav-fs" }, [
        PT.el("button", { type: "button", id: "traj-prev", title: "previous (↑)", disabled: !state.prev, text: "↑ Previous", onclick: () => move(-1) }),
        PT.el("button", { type: "button", id: "traj-next", title: "next (↓)", disabled: !state.next, text: "↓ Next", onclick: () => move(1) }),
        PT.el("button", {
          type: "button", id: "fullscreen-toggle", text: isFull ? "Exit full screen" : "Full screen",
          onclick: () => { (panel.classList.contains("fullscreen") ? exitFullscreen : enterFullscreen)(); render(state.data); },
        }),
        PT.el("a", { href: `/jobs/${encodeURIComponent(job)}/groups/${encodeURIComponent(t.group_id)}`, text: "Group view" }),
        // The trajectory as grader fixture lines (plugtune fixture add appends the same): append them to fixtures.jsonl.
        PT.el("a", { href: `/api/jobs/${encodeURIComponent(job)}/trajectories/${encodeURIComponent(t.id)}/fixture`, download: `fixture-${t.id}.jsonl`, id: "fixture-line", text: "Fixture line" }),
        isFull ? PT.el("span", { class: "muted", text: "↑ / ↓ keys: previous / next trajectory · Esc: exit" }) : null,
      ]);
    }

    function render(t) {
      if (!t) return;
      const head = PT.el("h2", {}, [
        PT.el("span", { class: "mono", id: "detail-id", text: t.id }), " ", PT.badge("status", t.status),
      ]);
      const meta = PT.el("div", { class: "muted", id: "detail-meta", text: (t.phase === "eval" ? "eval (data.validation) · " : "") + `step ${t.step} · group ${t.group_id} · attempt ${t.attempt}` + stopText(t.stop_reason) });
      // Why it gave no gradient (discarded, dropped, unscorable, a step not applied), when it did not.
      const why = t.discard_reason ? PT.clipped("div", { class: "notice", id: "discard-reason" }, `No gradient: ${t.discard_reason}`) : null;
      panel.replaceChildren(...[
        navBar(t), head, meta, why,
        section("Reward per grader", [renderRewards(t)]),
        section("Errors", renderErrors(t.errors)),
        section("Metrics", [renderMetrics(t.metrics || {})]),
        renderLogs(t, job),
        PT.tokenView ? PT.tokenView(job, t) : null, // static/tokens.js
        section("Messages", renderMessages(t.messages)),
      ].filter(Boolean));
      panel.dataset.selected = t.id;
      for (const row of document.querySelectorAll("#trajectory-list tr[data-id]")) {
        row.classList.toggle("selected", row.dataset.id === t.id);
      }
    }

    async function open(id) {
      if (!id || state.loading) return;
      state.loading = true;
      try {
        const base = `/api/jobs/${encodeURIComponent(job)}/trajectories/${encodeURIComponent(id)}`;
        const [t, around] = await Promise.all([PT.api(base), PT.api(`${base}/neighbors`, Object.fromEntries(filters))]);
        Object.assign(state, { id, data: t, prev: around.prev, next: around.next });
        render(t);
        const url = new URL(window.location.href);
        url.searchParams.set("t", id);
        window.history.replaceState(null, "", url);
      } catch (err) {
        panel.replaceChildren(PT.el("div", { class: "notice", text: `Could not load ${id}: ${err.message}` }));
      } finally {
        state.loading = false;
      }
    }

    function move(delta) {
      const target = delta < 0 ? state.prev : state.next;
      if (target) open(target);
    }

    document.addEventListener("keydown", (event) => {
      const tag = (event.target && event.target.tagName) || "";
      // Outside full screen the arrow keys keep scrolling the page; the buttons still move.
      if (["INPUT", "SELECT", "TEXTAREA"].includes(tag) || !state.id || !panel.classList.contains("fullscreen")) return;
      if (event.key === "ArrowUp") { event.preventDefault(); move(-1); }
      else if (event.key === "ArrowDown") { event.preventDefault(); move(1); }
      else if (event.key === "Escape" && panel.classList.contains("fullscreen")) { exitFullscreen(); render(state.data); }
    });
    for (const link of document.querySelectorAll("#trajectory-list [data-open]")) {
      link.addEventListener("click", (event) => { event.preventDefault(); open(link.dataset.open); });
    }
    for (const row of document.querySelectorAll("#trajectory-list tr[data-id]")) {
      row.addEventListener("click", (event) => {
        if (event.target.closest("a")) return;
        open(row.dataset.id);
      });
    }
    if (state.id) open(state.id);
  }

  document.addEventListener("DOMContentLoaded", () => {
    const panel = document.getElementById("detail");
    if (panel) setup(panel);
  });
})();
