"""Retrying a failed or cancelled job with new plugin code: what ``plugtune jobs retry ID --code DIR``,
``POST /api/jobs/{id}/retry`` with the project uploaded, and the job page's "Retry with new code" do.

Before anything is stored the new code must pass, in order: validation against the job's stored
job.yaml and data (:func:`plugtune.jobs.revision.read`: every plugin file job.yaml names, at its
path in the folder), ``plugtune lint`` on those plugin files, and a quick test in the function
runtime's sandbox: the job's own newest failed groups (else its newest group) replayed through the
new code with the policy's recorded answers (:func:`plugtune.pretest.group_replay.replay_group`); a
job with no trajectory yet only deploys it (imports and ``setup()``). A refusal lists every problem
and changes nothing; a pass stores the code by content hash, makes it the code of the job's next
attempts and queues the retry, which resumes from the last checkpoint with the submitted job.yaml
(data, hyperparameters) and this code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from plugtune.errors import DataError, PluginCallError
from plugtune.jobs import revision
from plugtune.lint import Finding, lint_file
from plugtune.pretest.deployment import deploy_job
from plugtune.pretest.group_replay import replay_group
from plugtune.pretest.replay import ReplayError
from plugtune.runtime import LocalRuntime
from plugtune.store import Store

MAX_GROUPS = 2  # replayed by the quick test: enough to show a fix, quick enough to wait for


class CodeRefusedError(ValueError):
    """Raised when new plugin code for a retry fails a check; ``problems`` lists each (nothing was
    stored and the job is unchanged)."""

    def __init__(self, job_id: int, check: str, problems: list[str]) -> None:
        self.check = check
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"job {job_id}: the new code failed {check}; nothing was changed:\n{lines}")


@dataclass(frozen=True)
class CodeRetried:
    """A retry queued with new code: its hash, the code it replaces, and what the quick test ran."""

    job_id: int
    code_hash: str
    previous_hash: str
    tested: list[str] = field(default_factory=list)  # one line per replayed trajectory (or the deploy)
    notes: list[str] = field(default_factory=list)


def retry_with_code(
    store: Store,
    job_id: int,
    code_dir: Path,
    *,
    on_retry: Callable[[str], None] | None = None,
    source: str | None = None,
) -> CodeRetried:
    """Check ``code_dir`` (see the module) and queue the job's retry with it; ``source`` labels where
    the code came from (default: the folder). ``RevisionError`` (the job cannot be retried so),
    ``DataError`` (validation: every problem by file, line and field) or ``CodeRefusedError``."""
    found = revision.read(store, job_id, code_dir)
    findings = lint_revision(found)
    if findings:
        raise CodeRefusedError(job_id, "plugtune lint", [_finding(f) for f in findings])
    tested, notes = quick_test(store, found)
    job = store.get_job(job_id)
    previous = revision.set_hash(revision.plugins_to_run(job.spec)) if job is not None else ""
    code_hash = revision.commit(store, found, source=source)
    if on_retry is not None:
        on_retry(str(job_id))
    return CodeRetried(job_id, code_hash, previous, tested, notes)


def lint_revision(found: revision.Revision) -> list[Finding]:
    """``plugtune lint``'s findings in the revision's plugin files, each checked as the kind of
    plugin job.yaml makes of its functions."""
    job = found.job
    kinds: dict[Path, dict[str, object]] = {}
    shapes: dict[Path, dict[str, str]] = {}
    for ref in job.plugin_refs():  # a multi-task job's tasks' plugins too
        if ref.path is None:
            continue
        kinds.setdefault(ref.path, {})[ref.function] = ref.kind
        if ref.shape:
            shapes.setdefault(ref.path, {})[ref.function] = ref.shape
    out: list[Finding] = []
    for path, expected in kinds.items():
        out.extend(lint_file(path, expected, shapes.get(path)))  # type: ignore[arg-type]
    return out


def _finding(f: Finding) -> str:
    return f"{f.file}:{f.line}:{f.col}: {f.rule} [{f.name}] {f.message} (fix: {f.fix})"


def quick_test(store: Store, found: revision.Revision) -> tuple[list[str], list[str]]:
    """Run the new code in the sandbox on the job's own groups; one line per trajectory replayed and
    notes (a recording the new rollout no longer follows). CodeRefusedError with each failure."""
    groups = groups_to_test(store, found.job_id)
    if not groups:
        return [_deploy_only(found)], ["the job recorded no trajectory yet: the new code was only deployed"]
    tested, notes, problems = [], [], []
    for group_id in groups:
        try:
            doc = replay_group(store, found.job_id, group_id, code=found.job)
        except (ReplayError, DataError, PluginCallError) as exc:  # the sandbox could not take the code
            raise CodeRefusedError(found.job_id, "the quick test", [str(exc)]) from exc
        for row in doc["trajectories"]:
            replayed, tid = row["replayed"], row["trajectory_id"]
            error = replayed["error"]
            tested.append(
                f"{tid}: {replayed['status']}, reward {replayed['reward']} (was {row['recorded']['status']})"
            )
            if error is None:
                continue
            what = f"{tid}: {error['type']} ({error['cause']}) [{error['plugin']}]: {error['message']}"
            if row["divergences"]:  # the new rollout asks the recording what it never answered
                notes.append(f"{what} — not counted: {'; '.join(row['divergences'])}")
            else:
                problems.append(what)
    if problems:
        raise CodeRefusedError(found.job_id, "the quick test on the job's own trajectories", problems)
    return tested, notes


def groups_to_test(store: Store, job_id: int) -> list[str]:
    """The newest train groups with a failed trajectory (at most MAX_GROUPS), else the newest group."""
    failed = store.trajectories(job_id, status="failed", phase="train", limit=50)
    groups: list[str] = []
    for t in failed:
        if t.group_id not in groups:
            groups.append(t.group_id)
    if not groups:
        groups = [t.group_id for t in store.trajectories(job_id, phase="train", limit=1)]
    return groups[:MAX_GROUPS]


def _deploy_only(found: revision.Revision) -> str:
    async def deploy() -> int:
        async with LocalRuntime(spare_instances=False) as rt:
            return len(await deploy_job(rt, found.job))

    try:
        count = asyncio.run(deploy())
    except (PluginCallError, DataError) as exc:
        raise CodeRefusedError(found.job_id, "the quick test (deploying the new code)", [str(exc)]) from exc
    return f"{count} plugin(s) deployed in the sandbox"
