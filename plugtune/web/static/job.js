// plugtune console: the job page — training curves (/api/jobs/{id}/curves), Cancel, and live updates
// without reload: status, steps, progress, duration and ETA follow /api/jobs/{id}/events (server-sent
// events); when the job fails its banner appears. If the stream drops, EventSource reconnects; if it
// cannot (the server refused it), the page polls /api/jobs/{id} instead and tries the stream again later.
"use strict";

(function () {
  const PT = window.PT;
  const CURVES_MS = 5000; // curves refresh while the job runs
  const POLL_MS = 5000; // fallback when the event stream is unavailable
  const STREAM_RETRY_MS = 30000;
  const DETAIL_MIN_MS = 1500; // at most one /api/jobs/{id} read per this, however many events arrive
  const ACTIVE = ["queued", "validating", "running"];

  function $(id) {
    return document.getElementById(id);
  }

  function setText(id, text) {
    const node = $(id);
    if (node) node.textContent = text;
  }

  async function drawCurves(grid) {
    try {
      const answer = await PT.api(`/api/jobs/${encodeURIComponent(grid.dataset.job)}/curves`);
      PT.drawCharts(grid, answer.charts, "No training step recorded yet.");
    } catch (err) {
      grid.replaceChildren(PT.el("div", { class: "notice", text: `Could not load the curves: ${err.message}` }));
    }
  }

  function isCancellable(status, retryPending) {
    return ACTIVE.includes(status) || (status === "failed" && retryPending);
  }

  class LiveJob {
    constructor(panel, grid) {
      this.panel = panel;
      this.grid = grid;
      this.id = panel.dataset.job;
      this.status = panel.dataset.status;
      this.retryPending = panel.dataset.retryPending === "true";
      this.source = null;
      this.pollTimer = null;
      this.curvesTimer = null;
      this.detailAt = 0;
      this.detailTimer = null;
      this.duration = null; // {seconds, at}: the server's duration and when it was read
      this.steps = null; // steps done as last shown: a new step redraws the curves at once
      this.stopping = false; // the cancel's "job N is stopping" is shown until the job has ended
    }

    start() {
      drawCurves(this.grid);
      $("cancel-button")?.addEventListener("click", () => this.cancel());
      if (!this.isLive()) return;
      this.followCurves();
      this.connect();
      window.setInterval(() => this.tickDuration(), 1000);
      this.refreshDetail();
    }

    isLive() {
      return isCancellable(this.status, this.retryPending);
    }

    connect() {
      if (!window.EventSource) {
        this.poll();
        return;
      }
      const source = new EventSource(`/api/jobs/${encodeURIComponent(this.id)}/events`);
      this.source = source;
      source.addEventListener("open", () => {
        this.stopPolling();
        setText("live-state", "live");
      });
      source.addEventListener("job", (e) => {
        try {
          this.refreshDetail(this.apply(JSON.parse(e.data)));
        } catch (err) {
          /* a malformed event: the next one, or the poll, brings the state */
        }
      });
      source.addEventListener("end", () => {
        source.close();
        this.source = null;
        this.refreshDetail(true);
        setText("live-state", "");
      });
      source.addEventListener("error", () => {
        if (source.readyState === EventSource.CLOSED) {
          // refused (not a stream, or an error answer): poll, and try the stream again later
          this.source = null;
          this.poll();
          window.setTimeout(() => this.isLive() && !this.source && this.connect(), STREAM_RETRY_MS);
        } else {
          setText("live-state", "reconnecting…"); // EventSource reconnects by itself
        }
      });
    }

    poll() {
      if (this.pollTimer !== null) return;
      setText("live-state", `updating every ${POLL_MS / 1000} s`);
      this.pollTimer = window.setInterval(() => this.refreshDetail(true), POLL_MS);
    }

    stopPolling() {
      if (this.pollTimer !== null) window.clearInterval(this.pollTimer);
      this.pollTimer = null;
    }

    followCurves() {
      if (this.curvesTimer === null) this.curvesTimer = window.setInterval(() => drawCurves(this.grid), CURVES_MS);
    }

    // One `job` event (or the job part of /api/jobs/{id}): {id, status, steps_done, steps_total, ...}
    // shown; true when the status changed.
    apply(j) {
      const total = j.steps_total ?? j.total_steps ?? 0;
      const changed = j.status !== this.status;
      this.status = j.status;
      if (j.next_retry_at !== undefined) this.retryPending = j.next_retry_at !== null;
      this.panel.dataset.status = j.status;
      const badge = $("job-status");
      if (badge) {
        badge.textContent = j.status;
        badge.className = `badge status-${j.status}`;
      }
      setText("job-status-text", j.status + (j.queue_position ? ` · position ${j.queue_position} in the queue` : "") + (j.waiting ? ` · ${j.waiting}` : ""));
      setText("steps-done", `${j.steps_done}${total ? " / " + total : ""}`);
      if (this.steps !== null && j.steps_done !== this.steps) drawCurves(this.grid);
      this.steps = j.steps_done;
      const bar = $("job-progress");
      if (bar && total) {
        bar.hidden = false;
        bar.max = total;
        bar.value = Math.min(j.steps_done, total);
        bar.textContent = `${j.steps_done} / ${total}`;
      }
      if (j.updated_at) setText("job-updated", PT.fmtTime(j.updated_at));
      const running = j.status === "running";
      for (const id of ["job-eta", "job-eta-label"]) if ($(id)) $(id).hidden = !running;
      // "job N is stopping…" was true until the job ended: the cancelled panel says the rest.
      if (!this.isLive() && this.stopping) {
        this.stopping = false;
        setText("cancel-result", "");
      }
      $("cancel-bar").hidden = !this.isLive() && !$("cancel-result").textContent;
      $("cancel-button").hidden = !this.isLive();
      if (!this.isLive()) {
        this.stopPolling();
        if (this.curvesTimer !== null) window.clearInterval(this.curvesTimer);
        this.curvesTimer = null;
        setText("live-state", "");
        if (changed) drawCurves(this.grid); // its last points
      } else if (ACTIVE.includes(j.status)) {
        if (running) this.followCurves();
        $("failure-banner")?.remove(); // queued again (an automatic retry): the attempts table keeps the history
        $("cancelled-panel")?.remove();
      }
      return changed;
    }

    // Duration, ETA and, once it failed, the error come from /api/jobs/{id} (throttled).
    refreshDetail(now) {
      const wait = now ? 0 : Math.max(0, this.detailAt + DETAIL_MIN_MS - Date.now());
      if (this.detailTimer !== null) {
        if (!now) return;
        window.clearTimeout(this.detailTimer);
      }
      this.detailTimer = window.setTimeout(() => this.readDetail(), wait);
    }

    async readDetail() {
      this.detailTimer = null;
      this.detailAt = Date.now();
      let answer;
      try {
        answer = await PT.api(`/api/jobs/${encodeURIComponent(this.id)}`);
      } catch (err) {
        return; // the server may be restarting: the next event or poll tries again
      }
      const j = answer.job;
      this.apply(j);
      if (j.duration_s !== null) this.duration = { seconds: j.duration_s, at: Date.now(), ticking: j.status === "running" };
      this.tickDuration();
      setText("job-eta", j.eta_s !== null ? `about ${PT.fmtDuration(j.eta_s)} to the last step` : "after the first step");
      this.showAttempts(answer.attempts || []);
      if (j.status === "failed") this.showFailure(j, answer.retry_note);
      if (j.status === "cancelled") this.showCancelled(answer.retry_note);
    }

    // The attempts table (retry history), as the server renders it.
    showAttempts(attempts) {
      const body = document.querySelector("#attempts tbody");
      if (!body || !attempts.length) return;
      const limit = Number(document.getElementById("attempts").dataset.limit) || attempts.length;
      body.replaceChildren(
        ...attempts.slice(0, limit).map((a) => {
          const error = a.error ? a.error.type + (a.error.cause ? ` · ${a.error.cause}` : "") : "";
          const message = PT.el("td", { class: "wrap" });
          const text = a.error ? String(a.error.message || "") : "";
          message.textContent = PT.reveal(text.length > 300 ? `${text.slice(0, 300)}…` : text);
          return PT.el("tr", {}, [
            PT.el("td", { text: String(a.number) }),
            PT.el("td", { text: a.trigger }),
            PT.el("td", {}, [PT.badge("status", a.status)]),
            PT.el("td", { text: String(a.resumed_from_step) }),
            PT.el("td", { text: PT.fmtTime(a.started_at) }),
            PT.el("td", { text: PT.fmtTime(a.ended_at) }),
            PT.el("td", { text: error }),
            message,
          ]);
        })
      );
    }

    tickDuration() {
      if (!this.duration) return;
      const extra = this.duration.ticking ? (Date.now() - this.duration.at) / 1000 : 0;
      setText("job-duration", PT.fmtDuration(this.duration.seconds + extra));
    }

    retryForm(note) {
      const meta = document.querySelector('meta[name="csrf-token"]');
      return PT.el("form", { method: "post", action: `/jobs/${this.id}/retry`, class: "toolbar" }, [
        PT.el("input", { type: "hidden", name: "csrf_token", value: meta ? meta.content : "" }),
        PT.el("button", { class: "primary", type: "submit", id: "retry-button", text: "Retry" }),
        PT.el("span", { class: "muted", id: "retry-note", text: note || "" }),
      ]);
    }

    // The failure banner, built from the job's error when the job failed while the page was open.
    showFailure(j, note) {
      if ($("failure-banner") || !j.error) return;
      const e = j.error;
      const job = encodeURIComponent(this.id);
      const rows = [
        ["Owner", e.owner, "failure-owner"],
        ["Cause", e.cause, null],
        ["Plugin", e.plugin, null, e.plugin && `/jobs/${job}/plugins?plugin=${encodeURIComponent(e.plugin)}`],
        ["Trajectory", e.trajectory_id, null, e.trajectory_id && `/jobs/${job}/trajectories?t=${encodeURIComponent(e.trajectory_id)}`],
        ["Message", e.message, "failure-message"],
        ["What to do", e.hint, "failure-hint"],
      ];
      const list = PT.el("dl");
      for (const [label, value, id, href] of rows) {
        if (!value && !id) continue;
        list.append(PT.el("dt", { text: label }));
        let dd;
        if (href) dd = PT.el("dd", {}, [PT.el("a", { href, text: value })]);
        else if (id === "failure-message") dd = PT.clipped("dd", { id }, value || "");
        else dd = PT.el("dd", { id, text: value || "" });
        if (id === "failure-hint") dd.className = "hint";
        list.append(dd);
      }
      // A Loss nan step's trajectories (its evidence), as the server renders them.
      const batch = (e.evidence && e.evidence.trajectory_ids) || [];
      if (batch.length) {
        const links = batch.slice(0, 10).flatMap((t, i) => [
          i ? ", " : "",
          PT.el("a", { class: "mono", href: `/jobs/${job}/trajectories?t=${encodeURIComponent(t)}`, text: t }),
        ]);
        const more = batch.length > 10 ? ` and ${batch.length - 10} more (plugtune doctor ${this.id} lists them)` : "";
        const message = list.querySelector("#failure-message").previousElementSibling; // its <dt>
        list.insertBefore(PT.el("dt", { text: "Step's trajectories" }), message);
        list.insertBefore(PT.el("dd", { id: "failure-trajectories" }, [`step ${e.evidence.step ?? "?"}: `, ...links, more]), message);
      }
      const banner = PT.el("section", { class: "banner", id: "failure-banner" }, [
        PT.el("div", { class: "title", text: e.type }),
        list,
        e.traceback ? PT.el("details", {}, [PT.el("summary", { text: "Traceback" }), PT.clipped("pre", {}, e.traceback)]) : null,
        j.next_retry_at ? PT.el("div", { class: "countdown", text: `automatic retry at ${PT.fmtTime(j.next_retry_at)} (UTC)` }) : this.retryForm(note),
      ]);
      this.panel.before(banner);
    }

    // A job cancelled while the page was open (a retry-pending one keeps its banner, without the
    // countdown to a retry that will not come).
    showCancelled(note) {
      $("retry-countdown")?.remove();
      if ($("cancelled-panel")) return;
      const panel = PT.el("section", { class: "panel", id: "cancelled-panel" }, [
        PT.el("span", { text: "This job was cancelled." }),
        $("retry-button") ? null : this.retryForm(note),
      ]);
      this.panel.before(panel);
    }

    async cancel() {
      const button = $("cancel-button");
      if (!window.confirm(`Cancel job ${this.id}? A running attempt is stopped; Retry can queue it again later.`)) return;
      button.disabled = true;
      setText("cancel-result", "Cancelling…");
      try {
        const { status, data } = await PT.send("POST", `/api/jobs/${encodeURIComponent(this.id)}/cancel`);
        if (status === 202) {
          setText("cancel-result", data.message || `job ${this.id} is being cancelled`);
          this.stopping = true;
          if (data.status) this.apply({ ...this.current(), status: data.status, updated_at: null });
        } else {
          setText("cancel-result", `Cannot cancel (${status}): ${data.detail || "no detail"}`);
        }
      } catch (err) {
        setText("cancel-result", `Could not reach the server: ${err.message}`);
      } finally {
        button.disabled = false;
        this.refreshDetail(true);
      }
    }

    // What the page shows now, in the shape of a `job` event (so apply() can be given a new status).
    current() {
      const steps = ($("steps-done")?.textContent || "0").split("/");
      return {
        id: Number(this.id),
        status: this.status,
        steps_done: Number(steps[0]) || 0,
        steps_total: Number(steps[1]) || 0,
      };
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    const grid = $("curves");
    const panel = $("job-live");
    if (!grid || !panel) return;
    new LiveJob(panel, grid).start();
  });
})();
