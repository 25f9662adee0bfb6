// plugtune console: a trajectory's response as tokens (the Tokens section of the trajectory detail).
// Each token: its text, policy-sampled or tool/environment (the loss mask), the sampler's and the
// trainer's log-prob and their gap (background colour), the spans history rewrites cut, and where a
// reply was cut at its token limit. Token text is model and plugin output: it goes in with
// textContent only. A long reply is drawn in blocks of BLOCK tokens, each when it nears the
// viewport (a jump link draws its block first), so a 4,000-token reply opens at once.
"use strict";

(function () {
  const PT = window.PT;
  const BLOCK = 400;
  const cache = new Map(); // "job/id" -> the API's token view: the last CACHED trajectories shown
  const CACHED = 20;
  const linked = new URLSearchParams(window.location.search).get("view") === "tokens";
  const state = { open: linked, scroll: linked }; // a link to the view opens it and shows it once

  const num = (v) => (v === null || v === undefined ? "–" : PT.fmtNumber(v));

  function gapClass(gap, scale) {
    if (gap === null || gap === undefined) return "gap-none";
    let k = 0;
    while (k < scale.length && gap >= scale[k]) k += 1;
    return `gap-${k}`;
  }

  // What a token's text looks like on the page: whitespace made visible, bidi controls revealed.
  function shown(text) {
    if (text === "") return "∅";
    return PT.reveal(text).replace(/\n/g, "↵\n").replace(/\t/g, "⇥").replace(/^ +$/, (s) => "·".repeat(s.length));
  }

  function tokenSpan(v, i) {
    const policy = v.mask[i] === 1;
    const span = document.createElement("span");
    span.id = `tok-${i}`;
    span.className = `tok ${policy ? "pol" : "env"} ${policy ? gapClass(v.gaps[i], v.gap_scale) : ""}`;
    span.textContent = shown(v.texts[i]);
    const lp = policy
      ? ` · sampler ${num(v.sampler_logprobs[i])} · trainer ${v.trainer_logprobs ? num(v.trainer_logprobs[i]) : "not recorded"} · gap ${num(v.gaps[i])}`
      : "";
    span.title = `#${i} · id ${v.ids[i]} · ${policy ? "policy-sampled" : "tool / environment"}${lp}`;
    return span;
  }

  function dropMarker(d) {
    return PT.el("span", {
      class: "tok-drop", id: `tok-drop-${d.rewrite}`,
      text: `⌫ rewrite ${d.rewrite} cut ${d.tokens} tokens here (${d.policy_tokens} policy-sampled, never trained on)`,
    });
  }

  function fillBlock(block, v, drops) {
    const start = Number(block.dataset.start);
    const end = Math.min(v.count, start + BLOCK);
    const frag = document.createDocumentFragment();
    for (let i = start; i < end; i += 1) {
      for (const d of drops.get(i) || []) frag.append(dropMarker(d));
      frag.append(tokenSpan(v, i));
    }
    block.replaceChildren(frag);
    block.dataset.filled = "true";
    block.style.minHeight = "";
  }

  function body(v) {
    const drops = new Map();
    for (const d of v.dropped_spans) drops.set(d.at, [...(drops.get(d.at) || []), d]);
    const root = PT.el("div", { class: "token-body", id: "token-body" });
    const blocks = [];
    for (let start = 0; start < Math.max(v.count, 1); start += BLOCK) {
      const block = PT.el("div", { class: "token-block", "data-start": start });
      block.style.minHeight = `${Math.ceil(Math.min(BLOCK, v.count - start) / 12) * 1.6}em`; // until drawn
      blocks.push(block);
      root.append(block);
    }
    for (const d of drops.get(v.count) || []) root.append(dropMarker(d));
    if (v.truncated_at !== null) {
      const limit = v.max_new_tokens !== null ? ` (max_new_tokens ${v.max_new_tokens})` : "";
      root.append(PT.el("span", { class: "tok-cut", id: "token-truncation", text: `✂ reply cut at its token limit${limit}: finish_reason length` }));
    }
    // A jump draws its token's block and every one before it: blocks drawn above it later would
    // move it out of sight.
    const ensure = (i) => {
      for (const block of blocks.slice(0, Math.floor(i / BLOCK) + 1)) {
        if (!block.dataset.filled) fillBlock(block, v, drops);
      }
    };
    if (blocks.length) fillBlock(blocks[0], v, drops);
    const observer = new IntersectionObserver((entries) => {
      for (const e of entries) {
        if (e.isIntersecting && !e.target.dataset.filled) { fillBlock(e.target, v, drops); observer.unobserve(e.target); }
      }
    }, { rootMargin: "600px" });
    for (const block of blocks.slice(1)) observer.observe(block);
    return { root, ensure };
  }

  function jumpLink(label, i, ensure, target) {
    return PT.el("a", {
      href: `#${target || `tok-${i}`}`, class: "mono", "data-jump": i, text: label,
      onclick: (event) => {
        event.preventDefault();
        ensure(i);
        const node = document.getElementById(target || `tok-${i}`);
        if (!node) return;
        node.scrollIntoView({ block: "center" });
        node.classList.remove("flash");
        void node.offsetWidth; // restart the highlight
        node.classList.add("flash");
      },
    });
  }

  function legend(v) {
    const steps = v.gap_scale;
    const labels = [`< ${steps[0]}`, ...steps.map((s, k) => (k + 1 < steps.length ? `${s}–${steps[k + 1]}` : `≥ ${s}`))];
    return PT.el("div", { class: "token-legend" }, [
      PT.el("span", { class: "tok pol gap-0", text: "policy-sampled (trained on)" }), " ",
      PT.el("span", { class: "tok env", text: "tool / environment (mask 0)" }), " · |trainer − sampler| (nats): ",
      ...labels.map((l, k) => PT.el("span", { class: `tok pol gap-${k}`, text: l })),
      v.trainer_logprobs ? null : PT.el("span", { class: "tok pol gap-none", text: "no trainer log-prob" }),
    ]);
  }

  function render(container, v) {
    const { root, ensure } = body(v);
    const summary = `${v.count.toLocaleString("en")} tokens · ${v.policy_tokens.toLocaleString("en")} policy-sampled · ` +
      `${v.environment_tokens.toLocaleString("en")} tool / environment · mean gap ${num(v.mean_gap)}` +
      (v.trainer_logprobs ? "" : " · the trainer's log-probs were not recorded for this trajectory (not trained on, or stored before they were kept)");
    const above = v.largest_gaps.filter((g) => g.gap >= v.gap_scale[0]); // the rest is float noise
    const gaps = above.length
      ? PT.el("ol", { class: "token-gaps", id: "token-gaps" }, above.map((g) => PT.el("li", {}, [
          jumpLink(`#${g.index}`, g.index, ensure), " ",
          PT.el("span", { class: "mono tok-text", text: shown(g.text) }),
          ` gap ${num(g.gap)} (sampler ${num(g.sampler)}, trainer ${num(g.trainer)})`,
        ])))
      : null;
    const drops = v.dropped_spans.length
      ? PT.el("ul", { id: "token-dropped" }, v.dropped_spans.map((d) => PT.el("li", {}, [
          jumpLink(`rewrite ${d.rewrite}`, Math.min(d.at, Math.max(v.count - 1, 0)), ensure, `tok-drop-${d.rewrite}`),
          ` cut ${d.tokens} tokens at #${d.at} (${d.policy_tokens} policy-sampled)`,
        ])))
      : null;
    const cut = v.truncated_at !== null ? jumpLink("truncation point", Math.max(v.count - 1, 0), ensure, "token-truncation") : null;
    container.replaceChildren(...[
      PT.el("div", { class: "muted", id: "token-summary", text: summary }),
      PT.el("div", { class: "muted", id: "token-tokenizer", text: v.tokenizer }),
      legend(v),
      gaps ? PT.el("h4", { text: "Largest gaps (trainer vs sampler)" }) : null, gaps,
      v.trainer_logprobs && !gaps ? PT.el("div", { class: "muted", id: "token-gaps-none", text: `No token's gap is above numerical noise (${v.gap_scale[0]}).` }) : null,
      drops ? PT.el("h4", { text: "Spans cut by history rewrites" }) : null, drops,
      cut ? PT.el("div", {}, ["Reply cut at its token limit: ", cut]) : null,
      root,
    ].filter(Boolean));
  }

  async function load(details, job, id) {
    const content = details.querySelector(".token-content");
    const key = `${job}/${id}`;
    try {
      if (!cache.has(key)) {
        cache.set(key, await PT.api(`/api/jobs/${encodeURIComponent(job)}/trajectories/${encodeURIComponent(id)}/tokens`));
        if (cache.size > CACHED) cache.delete(cache.keys().next().value);
      }
      render(content, cache.get(key));
      details.dataset.ready = "true";
      details.dataset.readyMs = String(Math.round(performance.now()));
    } catch (err) {
      content.replaceChildren(PT.el("div", { class: "notice", text: `Could not load the tokens: ${err.message}` }));
    }
  }

  // The Tokens section for trajectory `t` of `job`: open when it was open for the last trajectory
  // shown, or when the page's URL asks for it (?view=tokens, as the job page's warnings link).
  PT.tokenView = function (job, t) {
    const details = PT.el("details", { class: "token-view", id: "token-view" }, [
      PT.el("summary", { text: `Tokens (${(t.response_ids || []).length.toLocaleString("en")}): mask, sampler vs trainer log-prob, rewrites, truncation` }),
      PT.el("div", { class: "token-content" }, [PT.el("div", { class: "muted", text: "Loading tokens…" })]),
    ]);
    let loaded = false;
    details.addEventListener("toggle", () => {
      state.open = details.open;
      if (details.open && !loaded) { loaded = true; load(details, job, t.id); }
    });
    if (state.open) details.open = true; // fires "toggle", which loads
    if (state.scroll) {
      state.scroll = false;
      window.requestAnimationFrame(() => details.scrollIntoView({ block: "start" }));
    }
    return details;
  };
})();
