// plugtune console: the New job page. The job is checked as the user edits (POST /api/jobs?dry_run=true,
// debounced) and the problems are shown with their file, line and field; Submit creates it.
//
// Without project files the job.yaml goes alone (application/x-yaml: its paths resolve on the server).
// With them it is multipart: `spec`, plus either `project` (the picked .zip / .tar.gz) or one
// `project_files` part per file of the picked folder, named by its path inside that folder.
"use strict";

(function () {
  const PT = window.PT;
  const DEBOUNCE_MS = 500;
  const SKIPPED = new Set([".git", ".venv", "__pycache__", ".plugtune", "node_modules"]);

  const state = { files: [], archive: null, checked: 0, timer: null, inflight: null };

  function $(id) {
    return document.getElementById(id);
  }

  // The picked folder's files as [relative path inside the folder, File]; tool folders are left out.
  function folderFiles(list) {
    const out = [];
    for (const file of list) {
      const parts = (file.webkitRelativePath || file.name).split("/");
      const inside = parts.length > 1 ? parts.slice(1) : parts;
      if (inside.some((p) => SKIPPED.has(p))) continue;
      out.push([inside.join("/"), file]);
    }
    return out;
  }

  function fmtBytes(n) {
    if (n < 1024) return `${n} B`;
    if (n < 1 << 20) return `${(n / 1024).toFixed(1)} KiB`;
    return `${(n / (1 << 20)).toFixed(1)} MiB`;
  }

  function showProject() {
    const summary = $("project-summary");
    $("project-clear").hidden = !state.files.length && !state.archive;
    if (state.archive) {
      summary.textContent = PT.reveal(`Archive ${state.archive.name} (${fmtBytes(state.archive.size)}) is sent with the job.`);
    } else if (state.files.length) {
      const size = state.files.reduce((sum, [, f]) => sum + f.size, 0);
      const names = state.files.slice(0, 8).map(([p]) => p).join(", ");
      const more = state.files.length > 8 ? `, … ${state.files.length - 8} more` : "";
      summary.textContent = PT.reveal(`${state.files.length} files (${fmtBytes(size)}) are sent with the job: ${names}${more}`);
    } else {
      summary.textContent = "No project files: the job's relative paths are resolved on the server, in the folder plugtune serve runs in.";
    }
  }

  function body() {
    const spec = $("spec-text").value;
    if (!state.files.length && !state.archive) return { body: spec, headers: { "Content-Type": "application/x-yaml" } };
    const form = new FormData();
    form.append("spec", spec);
    if (state.archive) form.append("project", state.archive, state.archive.name);
    for (const [path, file] of state.files) form.append("project_files", file, path);
    return { body: form, headers: {} };
  }

  function setStatus(stateName, text) {
    const node = $("validation-status");
    node.dataset.state = stateName;
    node.textContent = PT.reveal(text);
  }

  function showProblems(problems) {
    const table = $("problems");
    const rows = (problems || []).map((p) =>
      PT.el("tr", { class: "problem" }, [
        PT.el("td", { class: "mono", text: p.file || "" }),
        PT.el("td", { class: "mono", text: p.line === null || p.line === undefined ? "" : String(p.line) }),
        PT.el("td", { class: "mono", text: p.field || "" }),
        PT.el("td", { class: "wrap" }, [PT.clipped("span", {}, p.message || "")]),
        PT.el("td", { class: "wrap hint", text: p.hint || "" }),
      ])
    );
    table.tBodies[0].replaceChildren(...rows);
    table.hidden = rows.length === 0;
  }

  // The answer to a dry run or a submit, shown; true when the job is valid.
  function showAnswer(status, data) {
    if (status === 200 || status === 201) {
      showProblems([]);
      setStatus("ok", "No problems found: the job is ready to submit.");
      return true;
    }
    const problems = data.problems || [];
    showProblems(problems);
    if (status === 422 && problems.length) {
      const n = problems.length;
      setStatus("problems", `${n} problem${n > 1 ? "s" : ""} to fix before the job can run${data.detail ? ": " + data.detail : "."}`);
    } else {
      setStatus("error", `The server refused the job (${status}): ${data.detail || "no detail"}`);
    }
    return false;
  }

  async function check() {
    state.timer = null;
    if (!$("spec-text").value.trim()) {
      showProblems([]);
      setStatus("empty", "Paste or upload a job.yaml to check it.");
      return;
    }
    const ticket = ++state.checked;
    if (state.inflight) state.inflight.abort();
    const controller = new AbortController();
    state.inflight = controller;
    setStatus("checking", "Checking…");
    const { body: payload, headers } = body();
    try {
      const answer = await PT.send("POST", "/api/jobs?dry_run=true", payload, headers, controller.signal);
      if (ticket !== state.checked) return; // a newer edit is being checked
      showAnswer(answer.status, answer.data);
    } catch (err) {
      if (ticket !== state.checked || err.name === "AbortError") return;
      setStatus("error", `Could not reach the server to check the job: ${err.message}`);
    } finally {
      if (state.inflight === controller) state.inflight = null;
    }
  }

  function schedule() {
    if (state.timer !== null) window.clearTimeout(state.timer);
    state.timer = window.setTimeout(check, DEBOUNCE_MS);
  }

  async function submit(event) {
    event.preventDefault();
    if (!$("spec-text").value.trim()) {
      setStatus("empty", "Paste or upload a job.yaml first.");
      return;
    }
    if (state.timer !== null) window.clearTimeout(state.timer);
    state.checked++; // an older check's answer must not overwrite this one
    const button = $("submit-job");
    button.disabled = true;
    $("submit-status").textContent = "Submitting…";
    const { body: payload, headers } = body();
    try {
      const { status, data } = await PT.send("POST", "/api/jobs", payload, headers);
      if (status === 201 && data.url) {
        $("submit-status").textContent = `Job ${data.job_id} created.`;
        window.location.assign(data.url);
        return;
      }
      showAnswer(status, data);
      const status_ = $("submit-status");
      status_.replaceChildren();
      if (data.job_id) {
        status_.append(`The job was recorded as failed: `, PT.el("a", { href: `/jobs/${data.job_id}`, text: `job ${data.job_id}` }));
      } else {
        status_.textContent = "Not submitted: fix the problems above.";
      }
    } catch (err) {
      $("submit-status").textContent = `Could not reach the server: ${err.message}`;
    } finally {
      button.disabled = false;
    }
  }

  async function readSpecFile(file) {
    $("spec-text").value = await file.text();
    $("spec-source").textContent = PT.reveal(file.name);
  }

  document.addEventListener("DOMContentLoaded", () => {
    const form = $("newjob-form");
    if (!form) return;
    $("spec-text").addEventListener("input", () => {
      $("spec-source").textContent = "";
      schedule();
    });
    $("spec-file").addEventListener("change", async (e) => {
      const file = e.target.files[0];
      if (file) await readSpecFile(file);
      schedule();
    });
    $("project-folder").addEventListener("change", async (e) => {
      state.files = folderFiles(e.target.files);
      state.archive = null;
      $("project-archive").value = "";
      const spec = state.files.find(([p]) => p === "job.yaml");
      if (spec && !$("spec-text").value.trim()) await readSpecFile(spec[1]);
      showProject();
      schedule();
    });
    $("project-archive").addEventListener("change", (e) => {
      state.archive = e.target.files[0] || null;
      state.files = [];
      $("project-folder").value = "";
      showProject();
      schedule();
    });
    $("project-clear").addEventListener("click", () => {
      state.files = [];
      state.archive = null;
      $("project-folder").value = "";
      $("project-archive").value = "";
      showProject();
      schedule();
    });
    form.addEventListener("submit", submit);
  });
})();
