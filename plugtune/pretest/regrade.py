"""``plugtune regrade JOB``: run graders again on a job's stored trajectories, without generating.

Each trajectory whose rollout ended (not failed by its rollout) and that was not discarded (a
discarded one keeps no grade to compare with) is graded again from its recorded messages and its
dataset row, by the job's graders as stored (the code that ran in the job), or with ``grader``
(``FILE:FN``) in place of the job's grader of the same name (or of its only grader); group graders
grade each group's trajectories together. The graders run in the function runtime's sandbox with
their limits, as ``plugtune test --faas`` and ``replay`` run them;
a verdict changes a trajectory by the trainer's own rules (``TrajectoryDraft``), and the new reward
is the weighted sum the trainer computes. The report says what flipped:

* ``1→0``: a positive reward that is now zero or less; ``0→1``: the reverse; ``changed``: another
  reward; ``unchanged``;
* a change of state between ``scored``, ``unscorable`` (it succeeded, no grader scored it),
  ``failed`` (a grader's call failed, or its verdict failed it) and ``discard`` (a grader's
  verdict): ``scored→unscorable``, ``failed→scored``, ...

``failed_only`` re-runs only the grader calls that failed (a judge outage): a trajectory that
failed on a grader gets that grader again, its other graders' stored components kept; the new
grades are stored as a labelled re-grade (``Store.regrades``) beside the originals, which are never
rewritten (training used them).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import re
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from plugtune.errors import PluginCallError, PlugtuneError
from plugtune.jobs.plugins import JobFunction
from plugtune.pretest.local import ExitsAsEof
from plugtune.pretest.replay import deploy_recorded, entry_name, grader_weights, recorded_env, sample_of
from plugtune.runtime import LocalRuntime
from plugtune.runtime.runtime import BaseRuntime
from plugtune.sdk import Context, Kind, Sample
from plugtune.spec.validation import read_dataset
from plugtune.store import Plugin, Store
from plugtune.store.regrades import RegradeRow
from plugtune.trainer.draft import TrajectoryDraft
from plugtune.trainer.rewards import final_reward
from plugtune.trainer.tasks import DEFAULT_TASK, task_of
from plugtune.types import ErrorRecord, TrajectoryRecord

#: What a trajectory is, for the flips: ``scored`` (it has a reward), ``unscorable`` (it succeeded and
#: no grader scored it), ``failed`` or ``discard``.
STATES = ("scored", "unscorable", "failed", "discard")
#: The flips, in the order the report lists them: a reward's sign, then every change of state.
KINDS = (
    "1→0",
    "0→1",
    *(f"{a}→{b}" for a in STATES for b in STATES if a != b),
    "changed",
    "unchanged",
)
STEPS = re.compile(r"^\s*(\d+)\s*(?:\.\.\s*(\d+)\s*)?$")
PAGE = 1000


class RegradeError(LookupError):
    """The job, a step range or a grader to re-grade with is not usable; the message says which."""


def parse_steps(text: str) -> tuple[int, int]:
    """``A..B`` (both included) or ``A``; RegradeError saying what a range looks like otherwise."""
    found = STEPS.match(text)
    if found is None:
        raise RegradeError(f"--steps {text!r}: write a step range as A..B (e.g. 10..20) or one step A")
    first = int(found.group(1))
    last = int(found.group(2)) if found.group(2) is not None else first
    if last < first:
        raise RegradeError(f"--steps {text!r}: the range ends ({last}) before it starts ({first})")
    return first, last


def trajectory_link(job_id: int, trajectory_id: str) -> str:
    """The console page of one trajectory (a path under ``plugtune serve``'s address)."""
    return f"/jobs/{job_id}/trajectories?t={quote(trajectory_id, safe='')}"


def state_of(status: str, reward: float | None) -> str:
    """One of :data:`STATES`."""
    if status == "success":
        return "unscorable" if reward is None else "scored"
    return "failed" if status == "failed" else "discard"


def flip_kind(before: TrajectoryRecord, status: str, reward: float | None) -> str:
    """What re-grading did to ``before``: one of :data:`KINDS`. ``1→0`` is a positive reward that
    is now zero or less, ``0→1`` the reverse, ``changed`` any other new reward."""
    old, new = state_of(before.status, before.reward), state_of(status, reward)
    if old != new:
        return f"{old}→{new}"
    if old != "scored" or before.reward is None or reward is None:
        return "unchanged"
    if before.reward > 0 >= reward:
        return "1→0"
    if before.reward <= 0 < reward:
        return "0→1"
    same = math.isclose(before.reward, reward, rel_tol=1e-9, abs_tol=1e-12)
    return "unchanged" if same else "changed"


@dataclass(frozen=True)
class Regraded:
    """One trajectory graded again."""

    record: TrajectoryRecord
    graders: list[str]
    draft: TrajectoryDraft
    reward: float | None
    kind: str

    def to_dict(self, job_id: int) -> dict[str, Any]:
        first = self.draft.errors[0] if self.draft.errors else None
        return {
            "trajectory_id": self.record.trajectory_id,
            "step": self.record.step,
            "kind": self.kind,
            "before": {"status": self.record.status, "reward": self.record.reward},
            "after": {
                "status": self.draft.status,
                "reward": self.reward,
                "reward_components": dict(self.draft.components),
                "error": None if first is None else f"{first.plugin}: {first.cause}: {first.message}",
            },
            "graders": self.graders,
            "link": trajectory_link(job_id, self.record.trajectory_id),
        }


def load_trajectories(
    store: Store, job_id: int, steps: tuple[int, int] | None = None
) -> list[TrajectoryRecord]:
    """Every stored trajectory of the job (in ``steps`` when given), oldest first."""
    ids: list[str] = []
    after: int | None = None
    while True:
        page = store.trajectories(job_id, order="oldest", limit=PAGE, after_id=after)
        ids += [t.trajectory_id for t in page if steps is None or steps[0] <= t.step <= steps[1]]
        if len(page) < PAGE:
            break
        after = page[-1].id
    by_id = {r.trajectory_id: r for r in store.trajectory_records(job_id, ids)}
    return [by_id[t] for t in ids if t in by_id]


def _name(plugin: str) -> str:
    return plugin.rpartition(":")[2] if ":" in plugin else plugin


def regradable(record: TrajectoryRecord, rollout: str) -> bool:
    """Its rollout ended (graders can grade it) and it was not discarded (it has a grade to compare)."""
    return record.status != "discard" and not any(_name(e.plugin) == rollout for e in record.errors)


def failed_graders(record: TrajectoryRecord, graders: Sequence[str]) -> list[str]:
    """The graders whose call failed ``record`` (their errors are on it; a trajectory that succeeded
    on a later try keeps its earlier tries' errors, and has none to re-run)."""
    if record.status != "failed":
        return []
    names = {_name(e.plugin) for e in record.errors}
    return [g for g in graders if g in names]


async def deploy_graders(
    rt: BaseRuntime,
    store: Store,
    job_id: int,
    spec: dict[str, Any],
    plugins: list[Plugin],
    root: Path,
    grader: str | None,
    env: dict[str, str],
) -> list[JobFunction]:
    """The job's graders and group graders from their stored code, ``grader`` (``FILE:FN``) in
    place of the one of its name (or the job's only one of its kind)."""
    weights = grader_weights(spec)
    stored = [p for p in plugins if p.role in ("grader", "group_grader")]
    if not stored:
        raise RegradeError(f"job {job_id} has no recorded grader to re-grade with")
    replace_name = ""
    given: JobFunction | None = None
    if grader is not None:
        given, replace_name = await _deploy_given(rt, grader, spec, stored, weights, env)
    deployed = await deploy_recorded(
        rt, store, [p for p in stored if p.name != replace_name], root, weights, {}, env
    )
    return [*deployed, *([given] if given is not None else [])]


async def _deploy_given(
    rt: BaseRuntime,
    grader: str,
    spec: dict[str, Any],
    stored: list[Plugin],
    weights: dict[str, float],
    env: dict[str, str],
) -> tuple[JobFunction, str]:
    file, sep, function = grader.rpartition(":")
    if not sep or not file or not function:
        raise RegradeError(f"--grader {grader!r}: write it as FILE:FUNCTION (e.g. plugins/grader.py:exact)")
    path = Path(file).expanduser().resolve()
    if not path.is_file():
        raise RegradeError(f"--grader {grader!r}: there is no file {path}")
    try:
        fn = await rt.deploy(f"{path}:{function}", env=env)
    except PlugtuneError as exc:  # the module fails to import, or has no such decorated function
        raise RegradeError(f"--grader {grader!r}: cannot be deployed: {exc}") from None
    kind = fn.spec.kind
    if kind not in (Kind.GRADER, Kind.GROUP_GRADER):
        raise RegradeError(f"--grader {grader!r} is a {kind.value}, not a grader or group grader")
    role = "grader" if kind is Kind.GRADER else "group_grader"
    same_role = [p for p in stored if p.role == role]
    named = [p for p in same_role if p.name in (fn.spec.name, function)]
    if named:
        target = named[0]
    elif len(same_role) == 1:
        target = same_role[0]
    else:
        names = ", ".join(p.name for p in same_role) or "none"
        raise RegradeError(
            f"--grader {grader!r}: the job's {role}s are {names}; name the function (or its "
            "decorator's name=) as the one it replaces"
        )
    overrides = yaml_runtime(spec, target.name)
    if overrides:  # job.yaml's limits for the grader it replaces, over its decorator's
        fn = await rt.deploy(f"{path}:{function}", runtime=overrides, env=env)
    return ExitsAsEof(JobFunction(fn, weights.get(target.name), target.name)), target.name


def yaml_runtime(spec: dict[str, Any], name: str) -> dict[str, Any]:
    """The ``runtime:`` job.yaml gives the grader or group grader named ``name`` ({} when none)."""
    plugins = spec.get("plugins") or {}
    for entry in [*(plugins.get("graders") or []), *(plugins.get("group_graders") or [])]:
        if not isinstance(entry, dict):
            continue
        named = entry.get("name") or str(entry.get("entry", "")).rpartition(":")[2]
        if named == name and isinstance(entry.get("runtime"), dict):
            return {k: v for k, v in entry["runtime"].items() if v is not None}
    return {}


class _Grading:
    """Grades drafts with deployed graders, at most ``concurrency`` calls at once."""

    def __init__(self, job_id: int, graders: list[JobFunction], concurrency: int) -> None:
        self.job_id = str(job_id)
        self.single = [g for g in graders if g.spec.kind is Kind.GRADER]
        self.group = [g for g in graders if g.spec.kind is Kind.GROUP_GRADER]
        self.gate = asyncio.Semaphore(max(1, concurrency))

    def context(self, record: TrajectoryRecord, sample: Sample, fn: JobFunction) -> Context:
        return Context(
            job_id=self.job_id,
            step=record.step,
            sample_id=sample.index,
            rollout_index=record.rollout_index,
            attempt=max(record.attempt, 1),
            trajectory_id=record.trajectory_id,
            plugin=fn.spec.name,
            phase=record.phase,
        )

    async def one(self, fn: JobFunction, record: TrajectoryRecord, draft: TrajectoryDraft) -> None:
        async with self.gate:
            try:
                outcome = await fn.invoke(
                    self.context(record, draft.sample, fn), draft.sample, draft.trajectory()
                )
            except PluginCallError as exc:
                draft.call_failed(exc)
                return
        draft.graded(fn.spec.name, outcome, outcome.value)

    async def group_of(
        self, fn: JobFunction, records: list[TrajectoryRecord], drafts: list[TrajectoryDraft]
    ) -> None:
        live = [(r, d) for r, d in zip(records, drafts, strict=True) if d.ok]
        if not live:
            return
        first, draft = live[0]
        ctx = self.context(first, draft.sample, fn)
        ctx = dataclasses.replace(ctx, trajectory_id="", rollout_index=-1)
        async with self.gate:
            try:
                outcome = await fn.invoke(ctx, draft.sample, [d.trajectory() for _, d in live])
            except PluginCallError as exc:
                for _, d in live:
                    d.call_failed(exc)
                return
        values = outcome.value if isinstance(outcome.value, list) else []
        for i, (_, d) in enumerate(live):
            d.graded(fn.spec.name, outcome, values[i] if i < len(values) else None)


def task_graders(spec: dict[str, Any]) -> dict[str, set[str]]:
    """A multi-task job's graders and group graders by task, as its stored spec names them
    (``default``: the top-level plugins'); {} for a job without tasks."""
    tasks = spec.get("tasks")
    if not isinstance(tasks, dict) or not tasks:
        return {}
    sets = {DEFAULT_TASK: spec.get("plugins") or {}, **tasks}
    out: dict[str, set[str]] = {}
    for task, plugins in sets.items():
        items = [*(plugins.get("graders") or []), *(plugins.get("group_graders") or [])]
        out[str(task)] = {entry_name(item) for item in items}
    return out


class _Rows:
    """Each trajectory's dataset row as ``replay``'s ``sample_of`` gives it (which checks the dataset
    is the one the job was submitted with), the file read once instead of once a row."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.first: Sample | None = None
        self.rows: list[dict[str, Any]] = []

    def task(self, record: TrajectoryRecord) -> str:
        """The task of the trajectory's row (a multi-task job's plugin set)."""
        if self.first is None:
            self.sample(record)
        inside = 0 <= record.sample_index < len(self.rows)
        return task_of(self.rows[record.sample_index]) if inside else DEFAULT_TASK

    def sample(self, record: TrajectoryRecord) -> Sample:
        if self.first is None:
            self.first = sample_of(self.spec, record)  # checks the data, names what is wrong
            job_file = Path(str(self.spec.get("job_file", "")))
            base = Path(str(self.spec["base_dir"])) if self.spec.get("base_dir") else job_file.parent
            self.rows = read_dataset((base / str(self.spec["data"]["train"])).resolve())
            return self.first
        if not 0 <= record.sample_index < len(self.rows):
            return sample_of(self.spec, record)  # its error names the row and the file
        row = Sample.from_dict(self.rows[record.sample_index])
        return dataclasses.replace(row, index=record.sample_index, sampling=self.first.sampling)


def _draft(record: TrajectoryRecord, sample: Sample, grader_names: Sequence[str]) -> TrajectoryDraft:
    prefixes = tuple(f"{g}/" for g in grader_names) + ("history/",)
    return TrajectoryDraft(
        trajectory_id=record.trajectory_id,
        sample=sample,
        group_id=record.group_id,
        rollout_index=record.rollout_index,
        phase=record.phase,
        attempt=record.attempt,
        messages=list(record.messages),
        metrics={k: v for k, v in record.metrics.items() if not k.startswith(prefixes)},
    )


async def _grade_all(
    grading: _Grading,
    groups: dict[str, list[tuple[TrajectoryRecord, Sample, list[str]]]],
    all_names: list[str],
    stored_components: bool,
) -> list[tuple[TrajectoryRecord, list[str], TrajectoryDraft]]:
    """Each group's trajectories by the graders named for each; ``stored_components``: keep the
    components of the graders not re-run (a failed-only re-grade)."""

    async def group(members: list[tuple[TrajectoryRecord, Sample, list[str]]]) -> list[Any]:
        drafts = []
        for record, sample, names in members:
            draft = _draft(record, sample, all_names)
            if stored_components:
                draft.components = {
                    k: v for k, v in record.reward_components.items() if k not in names and k in all_names
                }
            drafts.append(draft)
        calls = [
            grading.one(fn, record, draft)
            for (record, _, names), draft in zip(members, drafts, strict=True)
            for fn in grading.single
            if fn.spec.name in names
        ]
        await asyncio.gather(*calls)
        records = [m[0] for m in members]
        wanted = {n for _, _, names in members for n in names}
        await asyncio.gather(
            *(grading.group_of(fn, records, drafts) for fn in grading.group if fn.spec.name in wanted)
        )
        return [(m[0], m[2], d) for m, d in zip(members, drafts, strict=True)]

    ordered = [sorted(members, key=lambda m: m[0].rollout_index) for members in groups.values()]
    done = await asyncio.gather(*(group(members) for members in ordered))  # as the trainer: by rollout
    return [item for items in done for item in items]


def regrade(
    store: Store,
    job_id: int,
    *,
    grader: str | None = None,
    steps: tuple[int, int] | None = None,
    failed_only: bool = False,
    save: bool = False,
    label: str = "",
    concurrency: int = 8,
) -> dict[str, Any]:
    """Re-grade the job's trajectories; returns the report document (see the module's docstring).
    ``failed_only`` (or ``save``) stores the new grades under ``label`` (default ``failed-only <UTC
    time>``, ``regrade <UTC time>``)."""
    job = store.get_job(job_id)
    if job is None:
        raise RegradeError(f"there is no job {job_id} in {store.url}; `plugtune jobs list` shows them")
    plugins = store.list_plugins(job_id)
    rollout = next((p.name for p in plugins if p.role == "rollout"), "")
    grader_names = [p.name for p in plugins if p.role in ("grader", "group_grader")]
    records = load_trajectories(store, job_id, steps)
    if steps is not None and not records:
        raise RegradeError(f"job {job_id} has no trajectories in steps {steps[0]}..{steps[1]}")
    env = recorded_env(job_id, job.spec)
    rows = _Rows(job.spec)
    samples: dict[int, Sample] = {}
    groups: dict[str, list[tuple[TrajectoryRecord, Sample, list[str]]]] = {}
    skipped = 0
    by_task = task_graders(job.spec)
    for record in records:
        names = failed_graders(record, grader_names) if failed_only else list(grader_names)
        if by_task and names and regradable(record, rollout):  # a multi-task job: its row's task's graders
            names = [n for n in names if n in by_task.get(rows.task(record), ())]
        if not names or not regradable(record, rollout):
            skipped += 1
            continue
        if record.sample_index not in samples:
            samples[record.sample_index] = rows.sample(record)
        groups.setdefault(record.group_id, []).append((record, samples[record.sample_index], names))
    started = time.perf_counter()
    results, sandbox = asyncio.run(
        _run(store, job_id, job.spec, plugins, grader, env, groups, grader_names, failed_only, concurrency)
    )
    wall_s = time.perf_counter() - started
    regraded = [
        Regraded(record, names, draft, reward, flip_kind(record, draft.status, reward))
        for record, names, draft, reward in results
    ]
    counts = {kind: sum(r.kind == kind for r in regraded) for kind in KINDS}
    stored_label = ""
    if (failed_only or save) and regraded:
        what = "failed-only" if failed_only else "regrade"
        stored_label = label or time.strftime(f"{what} %Y-%m-%dT%H:%M:%SZ", time.gmtime())
        store.add_regrades(
            job_id,
            [
                RegradeRow(
                    label=stored_label,
                    trajectory_id=r.record.trajectory_id,
                    step=r.record.step,
                    graders=r.graders,
                    status=r.draft.status,
                    reward=r.reward,
                    kind=r.kind,
                    reward_components=dict(r.draft.components),
                    errors=[e.to_dict() for e in r.draft.errors],
                )
                for r in regraded
            ],
        )
    return {
        "job_id": job_id,
        "grader": grader,
        "steps": None if steps is None else list(steps),
        "failed_only": failed_only,
        "sandbox": sandbox,
        "trajectories": len(records),
        "regraded": len(regraded),
        "skipped": skipped,
        "counts": counts,
        "flips": [r.to_dict(job_id) for r in regraded if r.kind != "unchanged"],
        "stored_label": stored_label or None,
        "wall_s": round(wall_s, 3),
    }


async def _run(
    store: Store,
    job_id: int,
    spec: dict[str, Any],
    plugins: list[Plugin],
    grader: str | None,
    env: dict[str, str],
    groups: dict[str, list[tuple[TrajectoryRecord, Sample, list[str]]]],
    grader_names: list[str],
    failed_only: bool,
    concurrency: int,
) -> tuple[list[tuple[TrajectoryRecord, list[str], TrajectoryDraft, float | None]], str]:
    with tempfile.TemporaryDirectory(prefix="plugtune-regrade-") as tmp:
        async with LocalRuntime(spare_instances=False) as rt:
            graders = await deploy_graders(rt, store, job_id, spec, plugins, Path(tmp), grader, env)
            weights = {g.spec.name: g.spec.weight for g in graders}
            grading = _Grading(job_id, graders, concurrency)
            graded = await _grade_all(grading, groups, grader_names, failed_only)
            out = [
                (record, names, draft, final_reward(draft.components, weights) if draft.ok else None)
                for record, names, draft in graded
            ]
            return out, str(rt.isolation)


def fixture_rows(
    store: Store,
    job_id: int,
    trajectory_id: str,
    *,
    grader: str | None = None,
    expect: float | str | None = None,
    has_expect: bool = False,
    label: str | None = None,
) -> list[dict[str, Any]]:
    """Fixture lines (``plugtune test --expect``'s format) for one trajectory: one per grader
    (``grader``: only that one) with what it gave the trajectory (``label``: in that stored
    re-grade), or ``expect`` when ``has_expect`` (the right reward, for a wrong one). Group graders are left
    out (fixtures cover graders only)."""
    job = store.get_job(job_id)
    if job is None:
        raise RegradeError(f"there is no job {job_id} in {store.url}; `plugtune jobs list` shows them")
    record = store.get_trajectory(job_id, trajectory_id)
    if record is None:
        raise RegradeError(
            f"job {job_id} has no trajectory {trajectory_id!r}; `plugtune trajectories {job_id}`"
        )
    graders = [p.name for p in store.list_plugins(job_id) if p.role == "grader"]
    if grader is not None and grader not in graders:
        raise RegradeError(f"--grader {grader!r}: job {job_id}'s graders are {', '.join(graders) or 'none'}")
    components, errors, discard = dict(record.reward_components), list(record.errors), record.discard_reason
    if label is not None:
        found = [r for r in store.regrades(job_id, label) if r.trajectory_id == trajectory_id]
        if not found:
            raise RegradeError(f"job {job_id} has no re-grade {label!r} of trajectory {trajectory_id!r}")
        components = {**components, **found[-1].reward_components}
        regraded = set(found[-1].graders)
        errors = [e for e in errors if _name(e.plugin) not in regraded]
        errors += [_error_record(e) for e in found[-1].errors]
    wanted = [grader] if grader is not None else graders
    if has_expect and len(wanted) != 1:
        raise RegradeError(
            f"--expect: job {job_id} has {len(wanted)} graders ({', '.join(wanted)}): name one"
        )
    rows = []
    for name in wanted:
        verdict = expect if has_expect else _verdict(name, components, errors, discard)
        if verdict is _NOT_RUN:
            continue
        row: dict[str, Any] = {"row": record.sample_index, "messages": record.messages, "expect": verdict}
        if len(graders) > 1:
            row["grader"] = name
        row["name"] = f"job {job_id} {trajectory_id}" + (f" {name}" if len(graders) > 1 else "")
        rows.append(row)
    if not rows:
        raise RegradeError(
            f"no grader graded trajectory {trajectory_id!r} (its rollout failed or was discarded): "
            "give --expect and --grader for the fixture"
        )
    return rows


_NOT_RUN = "not run"


def _verdict(
    name: str, components: dict[str, float | None], errors: Sequence[ErrorRecord], discard: str
) -> float | str | None:
    if name in components:
        return components[name]
    for e in errors:
        if _name(e.plugin) == name:
            return e.cause if e.cause in ("failure", "retry") else "error"
    if discard.startswith(f"{name} discarded"):
        return "discard"
    return _NOT_RUN


def _error_record(data: dict[str, Any]) -> ErrorRecord:
    return ErrorRecord.from_dict(data)
