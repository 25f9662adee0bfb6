"""One prompt's group: ``group_size`` rollouts at once, then graders, into TrajectoryRecords.

How a plugin's verdict changes a trajectory (failure, retry, discard, unscorable) is
:class:`~plugtune.trainer.draft.TrajectoryDraft`'s, as on the TRL and verl paths. Here: every try's
failure or non-success verdict stays in the trajectory's ``errors`` with its try number, also the
tries the caller retried (a trajectory that succeeded on its second try keeps its first try's
verdict); ``discard`` from any plugin drops the whole group, each of its trajectories keeping the
plugin's reason in ``discard_reason``, else ``group_rule`` (``failure_policy.group``) may drop it.
Retries belong to the caller the jobs layer passes in; each attempt of a rollout reopens its
trajectory id in the policy server, so a failed attempt's tokens never reach the loss. When a
group is stopped (the caller raises anything else to stop the job, or the step is cancelled),
every one of its trajectories is still kept, in ``GroupRunner.stopped``: the finished ones as they ended, the
unfinished ones ``failed`` with stop reason :data:`STOPPED` and the tokens they had so far.
A trajectory's ``metrics`` hold its rollout's ``ctx.metric`` values by name and each grader's as
``<grader>/<name>`` (a group grader's on every trajectory it graded).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from plugtune.errors import PluginCallError
from plugtune.sdk import Context, Kind, PluginSpec, Policy, Sample, Status, Trajectory
from plugtune.trainer.draft import EMPTY_TRACE, GroupRule, TrajectoryDraft, settle_group
from plugtune.trainer.protocols import Caller, PluginFunction, PolicyServer
from plugtune.trainer.tasks import DEFAULT_TASK
from plugtune.types import CallOutcome, TokenTrace, TrajectoryRecord

T = TypeVar("T")

#: The stop reason of a trajectory whose group was stopped before it finished.
STOPPED = "step stopped"


@dataclass(frozen=True)
class Plugins:
    """The job's deployed plugins: one rollout, any number of graders and group graders."""

    rollout: PluginFunction
    graders: Sequence[PluginFunction] = ()
    group_graders: Sequence[PluginFunction] = ()
    #: a multi-task job's other plugin sets, by task (these are the default task's: rows without one)
    tasks: Mapping[str, Plugins] = field(default_factory=dict)

    def __post_init__(self) -> None:
        wanted = [(self.rollout, Kind.ROLLOUT)]
        wanted += [(fn, Kind.GRADER) for fn in self.graders]
        wanted += [(fn, Kind.GROUP_GRADER) for fn in self.group_graders]
        for fn, kind in wanted:
            if fn.spec.kind is not kind:
                raise TypeError(f"{fn.spec.name} is a {fn.spec.kind.value}, used here as a {kind.value}")
        names = [fn.spec.name for fn in (*self.graders, *self.group_graders)]
        if len(set(names)) != len(names):
            raise ValueError(f"grader names must be unique (they name reward components): {names}")

    def weights(self) -> dict[str, float]:
        return {fn.spec.name: fn.spec.weight for fn in (*self.graders, *self.group_graders)}

    def for_task(self, task: str) -> Plugins:
        """The plugin set of a row's ``task`` (these for the default task); ValueError for a task
        without one (validation refuses such rows before a job starts)."""
        if task == DEFAULT_TASK:
            return self
        found = self.tasks.get(task)
        if found is None:
            known = ", ".join([DEFAULT_TASK, *sorted(self.tasks)])
            raise ValueError(f"a dataset row's task {task!r} has no plugin set (job.yaml's tasks: {known})")
        return found

    def task_weights(self) -> dict[str, dict[str, float]]:
        """Each task's graders' weights (the default task's too)."""
        return {DEFAULT_TASK: self.weights(), **{t: p.weights() for t, p in self.tasks.items()}}


@dataclass
class _Slot(TrajectoryDraft):
    """A trajectory while its group is being produced."""

    policy: Policy | None = None  # opened before the group starts, for its first attempt
    finished: bool = False  # its rollout and single graders ended (group graders may follow)


class _Tries:
    """Adapts a plugin for the caller: counts its tries and keeps each one's failure or non-success
    verdict on the trajectories it was called for (the caller may retry, and return the last)."""

    def __init__(self, fn: PluginFunction, slots: Sequence[_Slot], own_count: bool = True) -> None:
        self.fn, self.slots, self.own_count = fn, slots, own_count
        self.tries = 0
        self.kept: list[object] = []  # the exceptions and outcomes already on the trajectories

    @property
    def spec(self) -> PluginSpec:
        return self.fn.spec

    def has_kept(self, what: object) -> bool:
        return any(k is what for k in self.kept)

    async def invoke(self, ctx: Context, *args: Any) -> CallOutcome:
        self.tries += 1
        try:
            outcome = await self.fn.invoke(ctx, *args)
        except PluginCallError as exc:
            for slot in self.slots:
                slot.errors.append(exc.record(trajectory_id=slot.trajectory_id, attempt=self._try(slot)))
            self.kept.append(exc)
            raise
        if outcome.status in (Status.FAILURE.value, Status.RETRY.value):
            for slot in self.slots:
                slot.errors.append(slot.verdict(outcome, self.spec.name, self._try(slot)))
            self.kept.append(outcome)
        return outcome

    def _try(self, slot: _Slot) -> int:
        return self.tries if self.own_count else max(slot.attempt, 1)


class _FreshTrajectoryRollout:
    """Adapts a rollout for the caller: every ``invoke(ctx, sample)`` starts the trajectory's record over."""

    def __init__(self, fn: PluginFunction, server: PolicyServer, slot: _Slot) -> None:
        self.fn, self.server, self.slot = fn, server, slot

    @property
    def spec(self) -> PluginSpec:
        return self.fn.spec

    async def invoke(self, ctx: Context, *args: Any) -> CallOutcome:
        self.slot.attempt += 1
        policy, self.slot.policy = self.slot.policy, None
        if policy is None:
            policy = self.server.open(self.slot.trajectory_id)  # a retry's record starts empty
        return await self.fn.invoke(ctx, policy, *args)


@dataclass
class GroupRunner:
    """Runs prompt groups through the plugins; ``phase`` tags their contexts and records, and
    ``group_prefix`` starts their group ids: ``s3-b1-p0`` is step 3, place 1 of its batch, dataset
    row 0 (``s3-p0`` without a place); its trajectories add ``-r<i>``. A training step's groups
    pass their place, so a row drawn twice in one step (a dataset smaller than the batch) still
    gets ids of its own."""

    server: PolicyServer
    plugins: Plugins
    caller: Caller
    job_id: str = ""
    phase: str = "train"
    group_prefix: str = "s"
    group_rule: GroupRule = GroupRule()  # failure_policy.group (a training step's groups)
    stopped: list[TrajectoryRecord] = field(default_factory=list)  # of groups that did not end

    async def run(
        self,
        step: int,
        sample: Sample,
        group_size: int,
        policy_version: int,
        place: int | None = None,
        task: str = DEFAULT_TASK,
    ) -> list[TrajectoryRecord]:
        """Roll out ``group_size`` trajectories of ``sample`` concurrently and grade them with the
        plugin set of the row's ``task``; ``place`` is the group's place in its step's batch."""
        plugins = self.plugins.for_task(task)
        batch = "" if place is None else f"-b{place}"
        group_id = f"{self.group_prefix}{step}{batch}-p{sample.index}"
        slots = [
            _Slot(f"{group_id}-r{i}", sample, group_id=group_id, rollout_index=i, phase=self.phase)
            for i in range(group_size)
        ]
        # Open every trajectory before any rollout runs: the policy server then knows how many
        # requests are coming and can start generating as soon as all of them are in.
        for slot in slots:
            slot.policy = self.server.open(slot.trajectory_id)
        started = time.perf_counter()
        rolled = started
        discard = False

        async def roll_and_grade(slot: _Slot) -> None:
            # A trajectory's single graders run as soon as its rollout ends (they need nothing
            # else); the group's graders run once every rollout has ended.
            nonlocal rolled, discard
            await self._rollout(plugins, step, sample, slot)
            rolled = max(rolled, time.perf_counter())
            discard = discard or slot.discarded
            if slot.ok and not discard:
                await self._grade_single(plugins, step, sample, slot)
            slot.finished = True

        try:
            await gather_or_cancel([roll_and_grade(slot) for slot in slots])
            discard = any(s.discarded for s in slots)
            if not discard:
                if plugins.group_graders:
                    for slot in slots:
                        slot.finished = False
                await self._grade_groups(plugins, step, sample, slots)
                for slot in slots:
                    slot.finished = True
        except BaseException:  # stopped: keep every trajectory, then stop as asked
            self.stopped += self._stopped(plugins, step, sample, slots, policy_version)
            raise
        graded = time.perf_counter()
        settle_group(slots, self.group_rule)
        weights = plugins.weights()
        records = []
        for slot in slots:
            slot.timing.update(rollouts_s=rolled - started, graders_s=graded - rolled)
            records.append(_record(step, slot, weights, policy_version))
        return records

    def _stopped(
        self, plugins: Plugins, step: int, sample: Sample, slots: list[_Slot], policy_version: int
    ) -> list[TrajectoryRecord]:
        """The group's records when it was stopped; the policy server closes every trajectory. Only
        a finished trajectory's discard drops its group."""
        discard = any(s.discarded and s.finished for s in slots)
        first = next((s for s in slots if s.discarded), None)
        records, weights = [], plugins.weights()
        for slot in slots:
            trace = _take(self.server, slot.trajectory_id)  # EMPTY_TRACE once its rollout ended
            if not slot.finished:
                slot.trace = slot.trace if trace is EMPTY_TRACE else trace
                slot.messages = slot.messages or list((slot.trace or EMPTY_TRACE).messages or sample.messages)
                slot.fail()
                slot.discarded = False
            if discard and first is not None:
                slot.join_discard(first)
            record = _record(step, slot, weights, policy_version)
            records.append(record if slot.finished else replace(record, stop_reason=STOPPED))
        return records

    async def _rollout(self, plugins: Plugins, step: int, sample: Sample, slot: _Slot) -> None:
        adapter = _Tries(_FreshTrajectoryRollout(plugins.rollout, self.server, slot), [slot], False)
        ctx = self._context(step, sample, slot, plugins.rollout)
        started = time.perf_counter()
        # Any other exception (the caller stopping the job) ends the step; the policy server keeps
        # the record so the caller can attach it as evidence.
        try:
            outcome = await self.caller(adapter, ctx, sample)
        except PluginCallError as exc:
            self._collect(slot, started)
            slot.rollout_failed(exc, kept=adapter.has_kept(exc))
            return
        self._collect(slot, started)
        slot.rolled_out(outcome, plugins.rollout.spec.name, kept=adapter.has_kept(outcome))

    def _collect(self, slot: _Slot, started: float) -> None:
        slot.timing["rollout_s"] = time.perf_counter() - started
        trace = _take(self.server, slot.trajectory_id)  # also closes a trajectory never called
        if slot.attempt:
            slot.trace = trace

    async def _grade_single(self, plugins: Plugins, step: int, sample: Sample, slot: _Slot) -> None:
        trajectory = slot.trajectory()
        await gather_or_cancel(
            [self._grade_one(step, sample, slot, fn, trajectory) for fn in plugins.graders]
        )

    async def _grade_groups(self, plugins: Plugins, step: int, sample: Sample, slots: list[_Slot]) -> None:
        if not plugins.group_graders:
            return
        live = [s for s in slots if s.ok]
        trajectories = {s.rollout_index: s.trajectory() for s in live}
        await gather_or_cancel(
            [self._grade_group(step, sample, live, fn, trajectories) for fn in plugins.group_graders]
        )

    async def _grade_one(
        self, step: int, sample: Sample, slot: _Slot, fn: PluginFunction, trajectory: Trajectory
    ) -> None:
        tries = _Tries(fn, [slot])
        try:
            outcome = await self.caller(tries, self._context(step, sample, slot, fn), sample, trajectory)
        except PluginCallError as exc:
            slot.call_failed(exc, kept=tries.has_kept(exc))
            return
        slot.graded(fn.spec.name, outcome, outcome.value, kept=tries.has_kept(outcome))

    async def _grade_group(
        self,
        step: int,
        sample: Sample,
        live: list[_Slot],
        fn: PluginFunction,
        trajectories: dict[int, Trajectory],
    ) -> None:
        if not live:
            return
        ctx = dataclasses.replace(
            self._context(step, sample, live[0], fn), trajectory_id="", rollout_index=-1
        )
        group = [trajectories[s.rollout_index] for s in live]
        tries = _Tries(fn, live)
        try:
            outcome = await self.caller(tries, ctx, sample, group)
        except PluginCallError as exc:
            for slot in live:
                slot.call_failed(exc, kept=tries.has_kept(exc))
            return
        values = outcome.value if isinstance(outcome.value, list) else []
        kept = tries.has_kept(outcome)
        for i, slot in enumerate(live):
            slot.graded(fn.spec.name, outcome, values[i] if i < len(values) else None, kept=kept)

    def _context(self, step: int, sample: Sample, slot: _Slot, fn: PluginFunction) -> Context:
        return Context(
            job_id=self.job_id,
            step=step,
            sample_id=sample.index,
            rollout_index=slot.rollout_index,
            attempt=max(slot.attempt, 1),
            trajectory_id=slot.trajectory_id,
            plugin=fn.spec.name,
            phase=self.phase,
        )


def _record(step: int, slot: _Slot, weights: dict[str, float], policy_version: int) -> TrajectoryRecord:
    trace = slot.trace or EMPTY_TRACE
    return slot.record(
        step=step, policy_version=policy_version, weights=weights, extra_metrics=_history_metrics(trace)
    )


def _history_metrics(trace: TokenTrace) -> dict[str, float]:
    """How often the rollout rewrote its history, and the policy tokens that cost the record."""
    return {
        "history/rewrites": float(trace.rewrites),
        "history/dropped_policy_tokens": float(trace.dropped_policy_tokens),
    }


def _take(server: PolicyServer, trajectory_id: str) -> TokenTrace:
    try:
        return server.take(trajectory_id)
    except KeyError:  # the rollout never called the policy
        return EMPTY_TRACE


async def gather_or_cancel(calls: Sequence[Awaitable[T]]) -> list[T]:
    """``asyncio.gather``, but the first exception cancels the calls still running."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
