"""Deploy a validated job's plugins to the function runtime and keep the store's view of them."""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass, field
from typing import Any

from plugtune.errors import PluginCallError
from plugtune.jobs.validation import PluginRef, ValidatedJob
from plugtune.runtime import Function
from plugtune.runtime.runtime import BaseRuntime
from plugtune.sdk import Context, Kind, PluginSpec
from plugtune.store import Store
from plugtune.trainer.groups import Plugins
from plugtune.types import CallOutcome, LogLine, MetricPoint

ROLES = {Kind.ROLLOUT: "rollout", Kind.GRADER: "grader", Kind.GROUP_GRADER: "group_grader"}


class JobFunction:
    """A deployed function as the trainer sees it: job.yaml's weight replaces the decorator's."""

    def __init__(self, fn: Function, weight: float | None) -> None:
        self.fn = fn
        self._spec = fn.spec if weight is None else dataclasses.replace(fn.spec, weight=weight)

    @property
    def spec(self) -> PluginSpec:
        return self._spec

    async def invoke(self, ctx: Context, *args: Any) -> CallOutcome:
        try:
            return await self.fn.invoke(ctx, *args)
        except PluginCallError as exc:
            exc.plugin = self.spec.name  # the store and console name plugins by function name
            raise


def entry_of(ref: PluginRef) -> str:
    """``file.py:function`` for the runtime (the built-in rollout is found through its module)."""
    if ref.path is not None:
        return f"{ref.path}:{ref.function}"
    found = importlib.util.find_spec(ref.module or "")
    if found is None or found.origin is None:
        raise RuntimeError(f"the built-in plugin module {ref.module} is missing from this install")
    return f"{found.origin}:{ref.function}"


async def deploy_all(rt: BaseRuntime, job: ValidatedJob) -> list[JobFunction]:
    """Deploy the rollout, graders and group graders (in that order) with job.yaml's overrides."""
    deployed = []
    for ref in (job.rollout, *job.graders, *job.group_graders):
        overrides = ref.runtime.given() if ref.runtime is not None else None
        fn = await rt.deploy(entry_of(ref), runtime=overrides)  # job.yaml overrides the decorator
        deployed.append(JobFunction(fn, ref.weight))
    return deployed


def as_plugins(functions: list[JobFunction]) -> Plugins:
    return Plugins(
        rollout=functions[0],
        graders=[f for f in functions if f.spec.kind is Kind.GRADER],
        group_graders=[f for f in functions if f.spec.kind is Kind.GROUP_GRADER],
    )


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
    """Hands each function's new log lines and metric points to the store exactly once."""

    functions: list[JobFunction]
    logs_seen: dict[str, int] = field(default_factory=dict)
    metrics_seen: dict[str, int] = field(default_factory=dict)

    def take(self) -> tuple[list[LogLine], list[MetricPoint]]:
        logs: list[LogLine] = []
        points: list[MetricPoint] = []
        for jf in self.functions:
            name = jf.spec.name
            lines = jf.fn.logs()
            logs += [dataclasses.replace(line, plugin=name) for line in lines[self.logs_seen.get(name, 0) :]]
            self.logs_seen[name] = len(lines)
            series = jf.fn.metrics()
            points += [dataclasses.replace(p, plugin=name) for p in series[self.metrics_seen.get(name, 0) :]]
            self.metrics_seen[name] = len(series)
        return logs, points
