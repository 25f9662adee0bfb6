// The job page's "Retry with new code": the picked archive (or folder, one `project_files` part per
// file named by its path inside the folder) goes to POST /api/jobs/{id}/retry, which validates, lints
// and replays it on the job's failed groups before queueing the retry; refused, its problems are listed.
"use strict";

(function () {
  const form = document.getElementById("retry-code-form");
  if (!form) return;
  const result = document.getElementById("retry-code-result");
  const skipped = new Set([".git", ".venv", "__pycache__", ".plugtune", "node_modules"]);

  function show(detail, problems) {
    result.replaceChildren(PT.el("div", { class: "notice", text: detail }));
    if (!problems || !problems.length) return;
    const list = PT.el("ul", { id: "retry-code-problems" });
    for (const p of problems) {
      const where = p.file ? `${p.file}${p.line ? ":" + p.line : ""}${p.field ? " [" + p.field + "]" : ""}: ` : "";
      list.append(PT.el("li", { class: "mono", text: where + p.message }));
    }
    result.append(list);
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = new FormData();
    const archive = document.getElementById("retry-code-archive").files[0];
    const folder = Array.from(document.getElementById("retry-code-folder").files);
    if (archive) body.append("project", archive, archive.name);
    for (const file of folder) {
      const path = file.webkitRelativePath || file.name;
      const parts = path.includes("/") ? path.split("/").slice(1) : [path]; // inside the picked folder
      if (parts.some((part) => skipped.has(part))) continue;
      body.append("project_files", file, parts.join("/") || file.name);
    }
    if (!archive && !folder.length) {
      show("Pick the project's archive or its folder first.");
      return;
    }
    const button = document.getElementById("retry-code-button");
    button.disabled = true;
    show("Checking the new code: validation, lint, then a replay of this job's failed groups…");
    try {
      const { status, data } = await PT.send("POST", `/api/jobs/${form.dataset.job}/retry`, body);
      if (status === 200) {
        window.location.assign(`/jobs/${form.dataset.job}?retried=1`);
        return;
      }
      show(data.detail || `refused (${status})`, data.problems);
    } catch (e) {
      show(`The console could not be reached: ${e}`);
    } finally {
      button.disabled = false;
    }
  });
})();
