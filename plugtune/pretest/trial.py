"""``run_trial``: a job's plugins on N dataset rows, the way a training step calls them.

Each row is one prompt group, run by the trainer's own ``GroupRunner``: the rollout against the
policy, every grader on each trajectory, then every group grader on the whole group. A group holds
one trajectory, or the job's ``group_size`` when it has group graders (so a grader that ranks or
normalises sees what it will see in training); at most ``concurrency`` rollouts run at once.
Every call is recorded; the deployed functions' metrics and logs are snapshotted before the
runtime closes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from plugtune.jobs.plugins import JobFunction, as_plugins
from plugtune.pretest.calls import CallLog, CallRecord, RecordedFunction
from plugtune.sdk import Kind, Runtime, Sample, Sampling
from plugtune.spec.validation import ValidatedJob
from plugtune.trainer.groups import GroupRunner, Plugins
from plugtune.trainer.protocols import PolicyServer, call_once
from plugtune.trainer.tasks import DEFAULT_TASK, task_of
from plugtune.types import LogLine, MetricPoint, TrajectoryRecord


@dataclass(frozen=True)
class FunctionSnapshot:
    """What a deployed plugin looked like at the end of a test."""

    entry: str
    name: str
    kind: str
    runtime: Runtime
    code_hash: str
    metrics: list[MetricPoint] = field(default_factory=list)
    logs: list[LogLine] = field(default_factory=list)


@dataclass(frozen=True)
class TrialResult:
    trajectories: list[TrajectoryRecord]
    calls: list[CallRecord]
    functions: list[FunctionSnapshot]
    wall_s: float
    #: each declared dependency's budget use (``Budgets.usage()``), when the runtime enforced them
    dependencies: dict[str, dict[str, Any]] = field(default_factory=dict)


def samples_of(job: ValidatedJob, rows: list[dict[str, Any]], n: int) -> list[tuple[int, Sample]]:
    """``(round, sample)`` for the first ``n`` rows (cycling when the dataset has fewer); a
    multi-task job's rows taken in turn from each task, so that every task's plugin set is tried."""
    config = job.spec.hyperparameters
    sampling = Sampling(temperature=config.temperature, top_p=config.top_p, max_tokens=config.max_new_tokens)
    order = _task_turns(rows) if job.tasks else list(range(len(rows)))
    out = []
    for i in range(n):
        index = order[i % len(rows)]
        sample = dataclasses.replace(Sample.from_dict(rows[index]), index=index, sampling=sampling)
        out.append((i // len(rows), sample))
    return out


def _task_turns(rows: list[dict[str, Any]]) -> list[int]:
    """The rows' indices, one of each task in turn (tasks in the order they first appear)."""
    by_task: dict[str, list[int]] = {}
    for index, row in enumerate(rows):
        by_task.setdefault(task_of(row), []).append(index)
    queues = list(by_task.values())
    return [q[i] for i in range(max(map(len, queues))) for q in queues if i < len(q)]


def group_size_of(job: ValidatedJob) -> int:
    """Rollouts per row: ``hyperparameters.group_size`` when the job (or one of its tasks) has group
    graders, else 1."""
    grouped = job.group_graders or any(t.group_graders for t in job.tasks.values())
    return job.spec.hyperparameters.group_size if grouped else 1


def snapshot(jf: JobFunction) -> FunctionSnapshot:
    fn = jf.fn
    fn.recorder.flush()  # the last partial window too
    return FunctionSnapshot(
        entry=fn.entry,
        name=jf.spec.name,
        kind=jf.spec.kind.value,
        runtime=fn.runtime,
        code_hash=fn.code_hash,
        metrics=fn.metrics(),
        logs=fn.logs(),
    )


async def run_trial(
    functions: Sequence[JobFunction],
    server: PolicyServer,
    samples: list[tuple[int, Sample]],
    *,
    concurrency: int,
    group_size: int = 1,
    job_id: str = "pretest",
    on_call: Callable[[CallRecord], None] | None = None,
    job: ValidatedJob | None = None,
    rows: Sequence[dict[str, Any]] = (),
) -> TrialResult:
    """Run every sample's group of ``group_size`` through ``functions`` (rollout first) on ``server``;
    with a multi-task ``job`` and its ``rows``, each through the plugin set of its row's task."""
    log = CallLog(on_call)
    recorded = [RecordedFunction(jf, log) for jf in functions]
    if job is not None and job.tasks:
        plugins = as_plugins(recorded, job)
    else:
        plugins = Plugins(
            rollout=recorded[0],
            graders=[f for f in recorded if f.spec.kind is Kind.GRADER],
            group_graders=[f for f in recorded if f.spec.kind is Kind.GROUP_GRADER],
        )
    runner = GroupRunner(server, plugins, call_once, job_id=job_id)
    gate = asyncio.Semaphore(max(1, -(-concurrency // group_size)))  # whole groups, as the trainer runs them

    async def one(step: int, sample: Sample) -> list[TrajectoryRecord]:
        task = task_of(rows[sample.index]) if sample.index < len(rows) else DEFAULT_TASK
        async with gate:
            return await runner.run(step, sample, group_size, 0, task=task)

    started = time.perf_counter()
    groups = await asyncio.gather(*(one(step, sample) for step, sample in samples))
    wall_s = time.perf_counter() - started
    trajectories = [record for group in groups for record in group]
    return TrialResult(trajectories, list(log.records), [snapshot(jf) for jf in functions], wall_s)
