"""``plugtune replay JOB TRAJECTORY``: re-run one recorded trajectory on this machine, without the model.

The rollout and graders run from the exact code that ran the trajectory in the job (the store's files
for the code hash its record names for each plugin; a job's snapshot, or the code of the
``jobs retry --code`` whose attempt ran it), with the recorded trajectory's id and rollout index in
their ``ctx`` and the job's ``env`` (its ``secrets`` from this process's environment), and the
policy's recorded assistant turns are played back, in order, by a local OpenAI-compatible server.
That code is whoever submitted the job's, so by default it runs in the function runtime's sandbox
(its own uid, limits, scrubbed environment: ``rt.isolation``), as ``plugtune test --faas`` does;
``in_process=True`` runs it in this process instead (a debugger works), with no sandbox, which is
refused as root unless ``unsandboxed_as_root=True``. The report's verdict:
``reproduced`` (the same failure — type, cause, plugin and, for a raise, the exception class — or
the same status and reward), ``failed differently`` (both failed, not alike), ``did not reproduce``
(the job's trajectory failed, the replay did not) or ``ended differently`` (it succeeded in the job).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Any

from plugtune.errors import DataError, InvalidDataError, Problem
from plugtune.jobs.plugins import JobFunction
from plugtune.jobs.submitted import KEY, check_data, has_snapshot
from plugtune.pretest.local import ExitsAsEof, exits_raise
from plugtune.pretest.relay import PolicyRelay, RelayError, completion
from plugtune.pretest.report import logs_of, trajectory_document
from plugtune.pretest.trial import TrialResult, run_trial
from plugtune.runtime import InProcessRuntime, LocalRuntime
from plugtune.runtime.runtime import BaseRuntime
from plugtune.sdk import Context, Runtime, Sample, Sampling
from plugtune.spec.models import BUILTIN_ROLLOUT
from plugtune.spec.validation import read_dataset
from plugtune.store import Plugin, Store
from plugtune.trainer.tasks import DEFAULT_TASK, task_of
from plugtune.types import CallOutcome, ErrorRecord, TrajectoryRecord

RAISED = re.compile(r"[A-Za-z_][\w.]*(?=:)")  # "ValueError: ..." -> ValueError
ROLE_ORDER = {"rollout": 0, "grader": 1, "group_grader": 2}


IN_PROCESS = "none: in this process (unsandboxed: the plugins have this process's user and files)"


class ReplayError(LookupError):
    """The job, the trajectory or the code to replay is not in the store; the message says which."""


class UnsandboxedAsRootError(ReplayError):
    """An in-process replay asked for as root without ``--unsandboxed-as-root``; says why and what to do."""

    def __init__(self, job_id: int) -> None:
        super().__init__(
            f"refusing to run job {job_id}'s recorded plugin code in this process as root: that code is "
            "whoever submitted the job's, and --in-process runs it with no sandbox, with every privilege "
            "of root on this machine. Replay without --in-process to run it in the function runtime's "
            "sandbox (its own user, limits, scrubbed environment); to debug it in this process, run "
            "plugtune replay as an ordinary user, or add --unsandboxed-as-root if you trust that code"
        )


def check_in_process(job_id: int, *, unsandboxed_as_root: bool) -> None:
    """Raise :class:`UnsandboxedAsRootError` for an in-process replay as root without the flag."""
    if os.geteuid() == 0 and not unsandboxed_as_root:
        raise UnsandboxedAsRootError(job_id)


class Playback:
    """Answers chat requests with the recorded assistant turns, in order, and notes divergences."""

    def __init__(self, recorded: list[dict[str, Any]], model: str) -> None:
        self.recorded = recorded
        self.turns = [i for i, m in enumerate(recorded) if m.get("role") == "assistant"]
        self.model = model
        self.served = 0
        self.divergences: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, trajectory_id: str, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if self.served >= len(self.turns):
                message = (
                    f"the recording holds {len(self.turns)} assistant turn(s) and the rollout asked for "
                    f"turn {self.served + 1}: it does not behave as it did in the job"
                )
                self.divergences.append(message)
                raise RelayError(409, message)
            at = self.turns[self.served]
            self.served += 1
        sent = [_comparable(m) for m in body.get("messages") or []]
        if sent != [_comparable(m) for m in self.recorded[:at]]:
            self.divergences.append(f"request {self.served} sent other messages than the recording")
        turn = {k: v for k, v in self.recorded[at].items() if k in ("role", "content", "tool_calls")}
        return completion(turn, self.model)


def _comparable(message: dict[str, Any]) -> tuple[str, str]:
    content = message.get("content")
    return str(message.get("role")), content if isinstance(content, str) else json.dumps(content or "")


def sample_of(spec: dict[str, Any], record: TrajectoryRecord) -> Sample:
    """The dataset row the trajectory was rolled out from, with the job's sampling settings; the
    dataset must be the one the job was submitted with (``InvalidDataError`` naming it otherwise)."""
    job_file = Path(str(spec.get("job_file", "")))
    train = (spec.get("data") or {}).get("train")
    if not train:
        raise InvalidDataError(
            [Problem(str(job_file), "the job's spec names no training data", field="data")]
        )
    base_dir = Path(str(spec["base_dir"])) if spec.get("base_dir") else job_file.parent
    if has_snapshot(spec):
        check_data(job_file, {"train": spec[KEY].get("data", {}).get("train")})
    dataset = (base_dir / str(train)).resolve()
    rows = read_dataset(dataset)
    if not 0 <= record.sample_index < len(rows):
        message = (
            f"row {record.sample_index} is not in the dataset ({len(rows)} rows): it changed since the job"
        )
        raise InvalidDataError([Problem(str(dataset), message, field="data.train")])
    h = spec.get("hyperparameters") or {}
    sampling = Sampling(
        temperature=float(h.get("temperature", 1.0)),
        top_p=float(h.get("top_p", 1.0)),
        max_tokens=int(h.get("max_new_tokens", 64)),
    )
    return dataclasses.replace(
        Sample.from_dict(rows[record.sample_index]), index=record.sample_index, sampling=sampling
    )


def materialize(store: Store, plugin: Plugin, root: Path) -> str:
    """Write the plugin's stored code under ``root`` and return its entry there."""
    files = store.get_code(plugin.code_hash) if plugin.code_hash else {}
    if not files:
        raise ReplayError(
            f"the code of plugin {plugin.name} ({plugin.code_hash[:12] or 'no hash'}) is not stored"
        )
    target = root / plugin.code_hash
    for rel, data in files.items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    file, _, function = plugin.entry.rpartition(":")
    return f"{target / Path(file).name}:{function}"


def recorded_env(job_id: int, spec: dict[str, Any]) -> dict[str, str]:
    """What the job's plugins got: job.yaml's ``env`` as the job recorded it, and its ``secrets``
    (never stored) from this process's environment; ReplayError naming a secret not set here."""
    env = {str(k): str(v) for k, v in (spec.get("env") or {}).items()}
    secrets = [str(name) for name in spec.get("secrets") or []]
    missing = [name for name in secrets if name not in os.environ]
    if missing:
        names = ", ".join(missing)
        raise ReplayError(
            f"job {job_id}'s plugins get the secret(s) {names} (job.yaml secrets:), which are not set "
            f"here: export them (e.g. `export {missing[0]}=...`) and replay again"
        )
    return {**env, **{name: os.environ[name] for name in secrets}}


async def deploy_recorded(
    rt: BaseRuntime,
    store: Store,
    plugins: list[Plugin],
    root: Path,
    weights: dict[str, float],
    entries: dict[str, str],
    env: dict[str, str] | None = None,
) -> list[JobFunction]:
    """Deploy each plugin from its stored code with the job's ``env``; ``entries`` gets replay
    entry -> the job's entry."""
    deployed: list[JobFunction] = []
    for plugin in plugins:
        runtime = Runtime(**plugin.runtime) if plugin.runtime else None
        entry = materialize(store, plugin, root)
        entries[entry] = plugin.entry
        fn = await rt.deploy(entry, runtime=runtime, env=env)
        if fn.code_hash != plugin.code_hash:
            raise ReplayError(
                f"plugin {plugin.name}: the stored code does not hash to {plugin.code_hash[:12]}"
            )
        deployed.append(ExitsAsEof(JobFunction(fn, weights.get(plugin.name), plugin.name)))
    return deployed


class AsRecorded(JobFunction):
    """A deployed function whose calls carry the recorded trajectory's id and rollout index: the
    plugin sees what it saw in the job, and the report names the trajectory that was replayed."""

    def __init__(self, jf: JobFunction, record: TrajectoryRecord) -> None:
        super().__init__(jf.fn, jf.spec.weight, jf.spec.name)
        self.inner = jf
        self.record = record

    async def invoke(self, ctx: Context, *args: Any) -> CallOutcome:
        if ctx.rollout_index >= 0:  # a group grader's call belongs to no one trajectory
            ctx = dataclasses.replace(
                ctx, rollout_index=self.record.rollout_index, trajectory_id=self.record.trajectory_id
            )
        return await self.inner.invoke(ctx, *args)


def as_recorded(replayed: TrajectoryRecord, record: TrajectoryRecord) -> TrajectoryRecord:
    """The replayed trajectory under the recorded one's ids (the trial numbers its one rollout 0)."""
    return dataclasses.replace(
        replayed,
        trajectory_id=record.trajectory_id,
        group_id=record.group_id,
        rollout_index=record.rollout_index,
    )


def grader_weights(spec: dict[str, Any]) -> dict[str, float]:
    """job.yaml's grader weights by plugin name (the decorator's weight applies to the rest); a
    multi-task job's tasks' own grader entries too."""
    tasks = spec.get("tasks")
    sets = [t for t in tasks.values() if isinstance(t, dict)] if isinstance(tasks, dict) else []
    out: dict[str, float] = {}
    for plugins in [spec.get("plugins") or {}, *sets]:
        out.update(_weights(plugins))
    return out


def _weights(plugins: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for entry in [*(plugins.get("graders") or []), *(plugins.get("group_graders") or [])]:
        if isinstance(entry, dict) and entry.get("weight") is not None:
            name = entry.get("name") or str(entry.get("entry", "")).rpartition(":")[2]
            out[str(name)] = float(entry["weight"])
    return out


def task_plugins(spec: dict[str, Any], record: TrajectoryRecord) -> set[str] | None:
    """The names of the plugins of the task of ``record``'s row (its rollout, graders and group
    graders, as the stored spec lists them); None for a job without tasks."""
    tasks = spec.get("tasks")
    if not isinstance(tasks, dict) or not tasks:
        return None
    job_file = Path(str(spec.get("job_file", "")))
    base_dir = Path(str(spec["base_dir"])) if spec.get("base_dir") else job_file.parent
    data = (spec.get("data") or {}).get("validation" if record.phase == "eval" else "train")
    try:
        rows = read_dataset((base_dir / str(data)).resolve()) if data else []
    except DataError:
        rows = []  # sample_of says what is wrong with the data
    inside = 0 <= record.sample_index < len(rows)
    task = task_of(rows[record.sample_index]) if inside else DEFAULT_TASK
    plugins = spec.get("plugins") or {}
    rollout = entry_name(plugins.get("rollout")) or BUILTIN_ROLLOUT.rpartition(":")[2]
    own = tasks.get(task)
    chosen: dict[str, Any] = own if task != DEFAULT_TASK and isinstance(own, dict) else plugins
    items = [*(chosen.get("graders") or []), *(chosen.get("group_graders") or [])]
    return {entry_name(chosen.get("rollout")) or rollout, *(entry_name(i) for i in items)} - {""}


def entry_name(item: Any) -> str:
    """The plugin name a stored spec's entry resolves to ('' for none)."""
    if isinstance(item, str):
        return item
    if not isinstance(item, dict):
        return ""
    return str(item.get("use") or item.get("name") or str(item.get("entry") or "").rpartition(":")[2])


def recorded_plugins(store: Store, job_id: int, record: TrajectoryRecord) -> list[Plugin]:
    """The job's plugins, rollout first, each with the code ``record`` ran (its code hash by plugin:
    an attempt retried with ``jobs retry --code`` ran other code than the job's newest)."""
    plugins = sorted(store.list_plugins(job_id), key=lambda p: ROLE_ORDER.get(p.role, 9))
    job = store.get_job(job_id)
    names = task_plugins(job.spec, record) if job is not None else None
    if names is not None:  # a multi-task job: the plugin set of the trajectory's row's task
        plugins = [p for p in plugins if p.name in names]
    if not plugins or plugins[0].role != "rollout":
        raise ReplayError(f"job {job_id} has no recorded rollout plugin to replay")
    ran = record.code_hash or {}
    return [dataclasses.replace(p, code_hash=str(ran.get(p.name) or p.code_hash)) for p in plugins]


def replay(
    store: Store,
    job_id: int,
    trajectory_id: str,
    *,
    in_process: bool = False,
    unsandboxed_as_root: bool = False,
) -> dict[str, Any]:
    """Replay one trajectory; returns the report document (``reproduced`` says whether it matched,
    ``sandbox`` what held the plugins). ``in_process``: in this process, unsandboxed (as root only
    with ``unsandboxed_as_root``; otherwise :class:`UnsandboxedAsRootError`)."""
    if in_process:
        check_in_process(job_id, unsandboxed_as_root=unsandboxed_as_root)
    job = store.get_job(job_id)
    if job is None:
        raise ReplayError(f"there is no job {job_id} in {store.url}; `plugtune jobs list` shows them")
    record = store.get_trajectory(job_id, trajectory_id)
    if record is None:
        raise ReplayError(
            f"job {job_id} has no trajectory {trajectory_id!r}; `plugtune trajectories {job_id}`"
        )
    plugins = recorded_plugins(store, job_id, record)
    sample = sample_of(job.spec, record)
    playback = Playback(record.messages, "policy")
    weights = grader_weights(job.spec)
    env = recorded_env(job_id, job.spec)
    result, entries, sandbox = asyncio.run(
        _run(store, plugins, weights, env, record, sample, playback, in_process)
    )
    trial_id = result.trajectories[0].trajectory_id
    replayed = as_recorded(result.trajectories[0], record)
    found = verdict(record, replayed)
    doc = {
        "job_id": job_id,
        "trajectory_id": trajectory_id,
        "recorded": outcome_of(record),
        "replayed": outcome_of(replayed),
        "reproduced": found == "reproduced",
        "verdict": found,
        "sandbox": sandbox,
        "policy_turns": {"recorded": len(playback.turns), "played": playback.served},
        "divergences": playback.divergences,
        "trajectory": trajectory_document(replayed, logs_of(replayed, result)),
        "calls": [
            {**c.to_dict(), "trajectory_id": record.trajectory_id}
            if c.trajectory_id == trial_id
            else c.to_dict()
            for c in result.calls
        ],
    }
    return with_recorded_entries(doc, entries)


def with_recorded_entries(value: Any, entries: dict[str, str]) -> Any:
    """``value`` with every ``plugin`` field naming the job's entry instead of the replay's temp copy."""
    if isinstance(value, dict):
        out = {k: with_recorded_entries(v, entries) for k, v in value.items()}
        if isinstance(out.get("plugin"), str):
            out["plugin"] = entries.get(out["plugin"], out["plugin"])
        return out
    if isinstance(value, list):
        return [with_recorded_entries(v, entries) for v in value]
    return value


async def _run(
    store: Store,
    plugins: list[Plugin],
    weights: dict[str, float],
    env: dict[str, str],
    record: TrajectoryRecord,
    sample: Sample,
    playback: Playback,
    in_process: bool,
) -> tuple[TrialResult, dict[str, str], str]:
    """Deploy the stored code (in this process, or in a sandboxed local runtime) and run the trial;
    returns the result, replay entry -> job entry, and what held the plugins (``rt.isolation``)."""
    entries: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="plugtune-replay-") as tmp:
        if in_process:
            async with InProcessRuntime() as rt:
                deployed = await deploy_recorded(rt, store, plugins, Path(tmp), weights, entries, env)
                functions = [AsRecorded(jf, record) for jf in deployed]
                with PolicyRelay(playback) as relay, exits_raise():
                    result = await run_trial(functions, relay, [(record.step, sample)], concurrency=1)
            return result, entries, IN_PROCESS
        async with LocalRuntime(spare_instances=False) as sandboxed:
            deployed = await deploy_recorded(sandboxed, store, plugins, Path(tmp), weights, entries, env)
            functions = [AsRecorded(jf, record) for jf in deployed]
            with PolicyRelay(playback) as relay:
                result = await run_trial(functions, relay, [(record.step, sample)], concurrency=1)
            return result, entries, str(sandboxed.isolation)


def outcome_of(record: TrajectoryRecord) -> dict[str, Any]:
    first = record.errors[0] if record.errors else None
    return {
        "status": record.status,
        "reward": record.reward,
        "reward_components": record.reward_components,
        "error": None if first is None else {**_error_fields(first), "raised": failure_key(first)[3]},
    }


def _error_fields(error: ErrorRecord) -> dict[str, str]:
    return {"type": error.type, "cause": error.cause, "plugin": error.plugin, "message": error.message}


def verdict(recorded: TrajectoryRecord, replayed: TrajectoryRecord) -> str:
    """``reproduced``, ``failed differently``, ``did not reproduce`` or ``ended differently``."""
    if recorded.errors and replayed.errors:
        same = failure_key(recorded.errors[0]) == failure_key(replayed.errors[0])
        return "reproduced" if same and recorded.status == replayed.status else "failed differently"
    if recorded.errors or recorded.status == "failed":
        return "did not reproduce"
    if recorded.status != replayed.status or replayed.errors:
        return "ended differently"
    return "reproduced" if _same_number(recorded.reward, replayed.reward) else "ended differently"


def failure_key(error: ErrorRecord) -> tuple[str, str, str, str]:
    """What two failures must share to be the same: type, cause, plugin and, for a raise (``500``),
    the exception class (a ``KeyError`` is not the recorded ``ValueError``)."""
    raised = RAISED.match(error.message) if error.cause == "500" else None
    return error.type, error.cause, _plugin_name(error.plugin), raised.group(0) if raised else ""


def _plugin_name(plugin: str) -> str:
    """``.../graders.py:exact`` and ``exact`` name the same plugin."""
    return plugin.rpartition(":")[2] if ":" in plugin else plugin


def _same_number(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
