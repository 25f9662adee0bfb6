"""Deploy a validated job's plugins to the function runtime and keep the store's view of them."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plugtune.errors import InvalidValueError, Problem
from plugtune.runtime import Function
from plugtune.runtime.runtime import BaseRuntime
from plugtune.runtime.snapshot import SnapshotError, collect, content_hash
from plugtune.sdk import Context, Kind, PluginSpec
from plugtune.spec.validation import PluginRef, ValidatedJob
from plugtune.store import Store
from plugtune.trainer.groups import Plugins
from plugtune.trainer.protocols import PluginFunction
from plugtune.types import CallOutcome, LogLine, MetricPoint

LOG_READ_S = 1.0  # how often a running job reads its plugins' new logs (the live tail's period)

ROLES = {Kind.ROLLOUT: "rollout", Kind.GRADER: "grader", Kind.GROUP_GRADER: "group_grader"}


class JobFunction:
    """A deployed function as the trainer sees it: job.yaml's weight and name replace the decorator's."""

    def __init__(self, fn: Function, weight: float | None, name: str = "") -> None:
        self.fn = fn
        self._spec = dataclasses.replace(
            fn.spec,
            weight=fn.spec.weight if weight is None else weight,
            name=name or fn.spec.name,
        )
        fn.name = self._spec.name  # the runtime's errors name it as the store and console do

    @property
    def spec(self) -> PluginSpec:
        return self._spec

    async def invoke(self, ctx: Context, *args: Any) -> CallOutcome:
        return await self.fn.invoke(ctx, *args)


def entry_of(ref: PluginRef) -> str:
    """``file.py:function`` for the runtime (the built-in rollout is found through its module)."""
    if ref.path is not None:
        return f"{ref.path}:{ref.function}"
    found = importlib.util.find_spec(ref.module or "")
    if found is None or found.origin is None:
        raise RuntimeError(f"the built-in plugin module {ref.module} is missing from this install")
    return f"{found.origin}:{ref.function}"


def plugin_env(job: ValidatedJob, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What every plugin instance gets besides the runtime's allow-list: job.yaml's ``env`` and its
    ``secrets``, copied by name from this process's environment (the attempt's).

    Raises ``InvalidValueError`` naming each secret that is not set here, or also given in ``env``."""
    source = os.environ if environ is None else environ
    env = dict(job.spec.env)
    problems = []
    for index, name in enumerate(job.spec.secrets):
        line = job.line_of(("secrets", index))
        if name in job.spec.env:
            message = f"{name} is in both env and secrets; keep it in one (secrets for keys and tokens)"
        elif name not in source:
            message = (
                f"secret {name} is not set in the environment that runs the job; export it there "
                f"(e.g. `export {name}=...` before `plugtune run` or `plugtune test`, or before "
                "`plugtune serve`)"
            )
        else:
            env[name] = source[name]
            continue
        problems.append(Problem(str(job.job_file), message, line, f"secrets[{index}]"))
    if problems:
        raise InvalidValueError(problems)
    return env


async def deploy_all(rt: BaseRuntime, job: ValidatedJob) -> list[JobFunction]:
    """Deploy the rollout, graders and group graders (in that order) with job.yaml's overrides,
    ``env``, ``secrets`` and ``dependencies``.

    Raises ``InvalidValueError`` when a function's decorator does not match its place in job.yaml,
    or a secret is missing; ``PluginCallError`` (Create faas fault) naming the plugin by its job.yaml
    name when one cannot be deployed."""
    deployed = []
    env = plugin_env(job)
    dependencies = job.spec.declared()
    for ref in job.plugin_refs():  # a multi-task job's tasks' too, each plugin once
        overrides = ref.runtime.given() if ref.runtime is not None else None  # over the decorator's
        fn = await rt.deploy(
            entry_of(ref),
            runtime=overrides,
            env=env,
            dependencies=dependencies,
            name=ref.name,
            shape=ref.shape or "",
            group=ref.kind is Kind.GROUP_GRADER,
        )
        check_kind(job, ref, fn)
        deployed.append(JobFunction(fn, ref.weight, ref.name))
    return deployed


def check_kind(job: ValidatedJob, ref: PluginRef, fn: Function) -> None:
    """A ``@group_grader`` listed under ``graders`` (and the like) is the job's mistake, not ours."""
    if fn.spec.kind is ref.kind:
        return
    decorated, wanted = fn.spec.kind.value, ref.kind.value
    section = {"rollout": "plugins.rollout", "grader": "plugins.graders"}.get(decorated)
    section = section or "plugins.group_graders"
    message = (
        f"{ref.entry} is decorated @{decorated} but listed as a {wanted}; "
        f"move it to {section} or change its decorator to @{wanted}"
    )
    raise InvalidValueError([Problem(str(job.job_file), message, ref.line, ref.field or None)])


def as_plugins(functions: Sequence[PluginFunction], job: ValidatedJob | None = None) -> Plugins:
    """The deployed functions as the trainer takes them; with ``job``, a multi-task job's plugin
    set per task (its functions found by name) besides the top-level one."""
    if job is None or not job.tasks:
        return Plugins(
            rollout=functions[0],
            graders=[f for f in functions if f.spec.kind is Kind.GRADER],
            group_graders=[f for f in functions if f.spec.kind is Kind.GROUP_GRADER],
        )
    by_name = {f.spec.name: f for f in functions}

    def pick(rollout: PluginRef, graders: Sequence[PluginRef], group_graders: Sequence[PluginRef]) -> Plugins:
        return Plugins(
            rollout=by_name[rollout.name],
            graders=[by_name[r.name] for r in graders],
            group_graders=[by_name[r.name] for r in group_graders],
        )

    tasks = {name: pick(t.rollout, t.graders, t.group_graders) for name, t in job.tasks.items()}
    return dataclasses.replace(pick(job.rollout, job.graders, job.group_graders), tasks=tasks)


def record_waiting(store: Store, job_id: int, job: ValidatedJob) -> None:
    """Declare the job's plugins before they deploy, each with the code it deploys (so a plugin that
    fails to deploy still shows its code): the console shows them waiting meanwhile."""
    for ref in job.plugin_refs():
        code_hash = _store_code(store, ref)
        store.upsert_plugin(job_id, ref.name, ROLES[ref.kind], ref.entry, code_hash=code_hash)
        store.set_plugin_status(job_id, ref.name, "waiting")


def _store_code(store: Store, ref: PluginRef) -> str:
    """Store the code the runtime is about to snapshot (the same files, the same hash); "" when it
    cannot be read here, which the deploy then reports as a Create faas fault."""
    try:
        files = collect(Path(entry_of(ref).rpartition(":")[0]).resolve().parent)
    except (SnapshotError, OSError, RuntimeError):
        return ""
    if not files:
        return ""
    code_hash = content_hash(files)
    store.put_code(code_hash, files)
    return code_hash


def record_deployed(store: Store, job_id: int, functions: list[JobFunction]) -> None:
    for jf in functions:
        fn = jf.fn
        store.put_code(fn.code_hash, fn.code())
        store.upsert_plugin(
            job_id,
            jf.spec.name,
            ROLES[jf.spec.kind],
            fn.entry,
            code_hash=fn.code_hash,
            runtime=fn.runtime.to_dict(),
        )
        store.set_plugin_status(job_id, jf.spec.name, "running")


@dataclass
class Drain:
    """Hands each function's new log lines and metric points to the store exactly once.

    A function keeps its newest lines and points in bounded buffers, so "new" cannot be "past the
    count seen" (once a buffer is full its length stops growing and every later line would be
    skipped). The drain remembers the last entry it took, by identity, and takes what follows it.
    When that entry has already left a full buffer between two drains, the lines in between are
    gone: the drain says so with a WARNING line of its own, so the console shows the gap.
    """

    functions: list[JobFunction]
    last_log: dict[str, LogLine] = field(default_factory=dict)
    last_point: dict[str, MetricPoint] = field(default_factory=dict)

    def take(self) -> tuple[list[LogLine], list[MetricPoint]]:
        logs: list[LogLine] = []
        points: list[MetricPoint] = []
        for jf in self.functions:
            name = jf.spec.name
            lines, lost = _after(jf.fn.logs(), self.last_log.get(name))
            if lines:
                self.last_log[name] = lines[-1]
            if lost:
                logs.append(_gap_line(name, len(lines)))
            logs += [dataclasses.replace(line, plugin=name) for line in lines]
            series, _ = _after(jf.fn.metrics(), self.last_point.get(name))
            if series:
                self.last_point[name] = series[-1]
            points += [dataclasses.replace(p, plugin=name) for p in series]
        return logs, points


def _after(entries: list[Any], last: Any) -> tuple[list[Any], bool]:
    """The entries after ``last`` (all of them when it is None), and whether ``last`` was gone."""
    if last is None:
        return entries, False
    for i in range(len(entries) - 1, -1, -1):
        if entries[i] is last:
            return entries[i + 1 :], False
    return entries, True


def _gap_line(plugin: str, kept: int) -> LogLine:
    message = (
        f"log lines of {plugin} were lost: it wrote more between two reads of its logs (about "
        f"{LOG_READ_S:g} s apart) than the runtime buffers; the {kept} newest were kept"
    )
    return LogLine(time.time(), "WARNING", plugin, message, source="runtime")
