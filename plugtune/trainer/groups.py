"""One prompt's group: ``group_size`` rollouts at once, then graders, into TrajectoryRecords.

Outcome handling (Ark semantics, DESIGN §2): a rollout or grader that reports ``retry`` or
``failure``, or whose call raised ``PluginCallError``, marks its trajectory ``failed`` (reward
``None``, no gradient); every try's such verdict stays in the trajectory's ``errors`` with its try
number, also the tries the caller retried (a trajectory that succeeded on its second try keeps its
first try's verdict); ``discard`` from any plugin drops the whole group,
each of its trajectories keeping the plugin's reason in ``discard_reason``. Retries belong to the
caller the jobs layer passes in; each attempt of a rollout reopens its trajectory id in the
policy server, so a failed attempt's tokens never reach the loss. When a group is stopped (the
caller raises anything else to stop the job, or the step is cancelled), every one of its
trajectories is still kept, in ``GroupRunner.stopped``: the finished ones as they ended, the
unfinished ones ``failed`` with stop reason :data:`STOPPED` and the tokens they had so far.
A trajectory's ``metrics`` hold its rollout's ``ctx.metric`` values by name and each grader's as
``<grader>/<name>`` (a group grader's on every trajectory it graded).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from plugtune.errors import PluginCallError, discarded_by, reported_status
from plugtune.sdk import Context, Kind, PluginSpec, Policy, Sample, Status, Trajectory
from plugtune.trainer.protocols import Caller, PluginFunction, PolicyServer
from plugtune.trainer.rewards import final_reward
from plugtune.types import CallOutcome, ErrorRecord, TokenTrace, TrajectoryRecord

T = TypeVar("T")

#: The stop reason of a trajectory whose group was stopped before it finished.
STOPPED = "step stopped"

EMPTY_TRACE = TokenTrace(prompt_ids=[], response_ids=[], response_mask=[], response_logprobs=[], messages=[])


@dataclass(frozen=True)
class Plugins:
    """The job's deployed plugins: one rollout, any number of graders and group graders."""

    rollout: PluginFunction
    graders: Sequence[PluginFunction] = ()
    group_graders: Sequence[PluginFunction] = ()

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


@dataclass
class _Slot:
    """A trajectory while its group is being produced (mutable; becomes a TrajectoryRecord)."""

    rollout_index: int
    trajectory_id: str = ""
    attempt: int = 0
    policy: Policy | None = None  # opened before the group starts, for its first attempt
    trace: TokenTrace = EMPTY_TRACE
    messages: list[dict[str, Any]] = field(default_factory=list)
    status: str = "success"
    discard: bool = False
    discard_reason: str = ""
    finished: bool = False  # its rollout and single graders ended (group graders may follow)
    errors: list[ErrorRecord] = field(default_factory=list)
    components: dict[str, float | None] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)  # the rollout's (its graders read them)
    grader_metrics: dict[str, float] = field(default_factory=dict)  # "<grader>/<name>": its ctx.metric
    timing: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "success" and not self.discard


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
                slot.errors.append(_verdict(outcome, self.spec.name, slot, self._try(slot)))
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
    stopped: list[TrajectoryRecord] = field(default_factory=list)  # of groups that did not end

    async def run(
        self, step: int, sample: Sample, group_size: int, policy_version: int, place: int | None = None
    ) -> list[TrajectoryRecord]:
        """Roll out ``group_size`` trajectories of ``sample`` concurrently and grade them;
        ``place`` is the group's place in its step's batch."""
        batch = "" if place is None else f"-b{place}"
        group_id = f"{self.group_prefix}{step}{batch}-p{sample.index}"
        slots = [_Slot(rollout_index=i, trajectory_id=f"{group_id}-r{i}") for i in range(group_size)]
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
            await self._rollout(step, sample, slot, group_id)
            rolled = max(rolled, time.perf_counter())
            discard = discard or slot.discard
            if slot.ok and not discard:
                await self._grade_single(step, sample, slot)
            slot.finished = True

        try:
            await gather_or_cancel([roll_and_grade(slot) for slot in slots])
            discard = any(s.discard for s in slots)
            if not discard:
                if self.plugins.group_graders:
                    for slot in slots:
                        slot.finished = False
                await self._grade_groups(step, sample, slots)
                for slot in slots:
                    slot.finished = True
        except BaseException:  # stopped: keep every trajectory, then stop as asked
            self.stopped += self._stopped(step, sample, group_id, slots, policy_version)
            raise
        graded = time.perf_counter()
        _share_discard(slots)
        weights = self.plugins.weights()
        records = []
        for slot in slots:
            slot.timing.update(rollouts_s=rolled - started, graders_s=graded - rolled)
            records.append(self._record(step, sample, group_id, slot, weights, discard, policy_version))
        return records

    def _stopped(
        self, step: int, sample: Sample, group_id: str, slots: list[_Slot], policy_version: int
    ) -> list[TrajectoryRecord]:
        """The group's records when it was stopped; the policy server closes every trajectory."""
        discard = any(s.discard and s.finished for s in slots)
        _share_discard(slots)
        records, weights = [], self.plugins.weights()
        for slot in slots:
            trace = _take(self.server, slot.trajectory_id)  # EMPTY_TRACE once its rollout ended
            if not slot.finished:
                slot.trace = slot.trace if trace is EMPTY_TRACE else trace
                slot.messages = slot.messages or list(slot.trace.messages or sample.messages)
                slot.status = "failed"
            record = self._record(step, sample, group_id, slot, weights, discard, policy_version)
            records.append(record if slot.finished else replace(record, stop_reason=STOPPED))
        return records

    async def _rollout(self, step: int, sample: Sample, slot: _Slot, group_id: str) -> None:
        adapter = _Tries(_FreshTrajectoryRollout(self.plugins.rollout, self.server, slot), [slot], False)
        ctx = self._context(step, sample, slot, self.plugins.rollout)
        started = time.perf_counter()
        # Any other exception (the caller stopping the job) ends the step; the policy server keeps
        # the record so the caller can attach it as evidence.
        try:
            outcome = await self.caller(adapter, ctx, sample)
        except PluginCallError as exc:
            self._collect(slot, started)
            slot.messages = list(slot.trace.messages or sample.messages)  # what the policy saw, as evidence
            _fail(slot, None if adapter.has_kept(exc) else _error_of(exc, slot))
            return
        self._collect(slot, started)
        result = outcome.value if isinstance(outcome.value, dict) else {}
        slot.messages = list(result.get("messages") or slot.trace.messages)
        slot.metrics.update(outcome.metrics)
        slot.metrics.update(result.get("metrics") or {})
        _apply_status(slot, outcome, self.plugins.rollout.spec.name, adapter.has_kept(outcome))

    def _collect(self, slot: _Slot, started: float) -> None:
        slot.timing["rollout_s"] = time.perf_counter() - started
        trace = _take(self.server, slot.trajectory_id)  # also closes a trajectory never called
        if slot.attempt:
            slot.trace = trace

    async def _grade_single(self, step: int, sample: Sample, slot: _Slot) -> None:
        trajectory = self._trajectory(sample, slot)
        await gather_or_cancel(
            [self._grade_one(step, sample, slot, fn, trajectory) for fn in self.plugins.graders]
        )

    async def _grade_groups(self, step: int, sample: Sample, slots: list[_Slot]) -> None:
        if not self.plugins.group_graders:
            return
        live = [s for s in slots if s.ok]
        trajectories = {s.rollout_index: self._trajectory(sample, s) for s in live}
        await gather_or_cancel(
            [self._grade_group(step, sample, live, fn, trajectories) for fn in self.plugins.group_graders]
        )

    async def _grade_one(
        self, step: int, sample: Sample, slot: _Slot, fn: PluginFunction, trajectory: Trajectory
    ) -> None:
        tries = _Tries(fn, [slot])
        try:
            outcome = await self.caller(tries, self._context(step, sample, slot, fn), sample, trajectory)
        except PluginCallError as exc:
            _fail(slot, None if tries.has_kept(exc) else _error_of(exc, slot))
            return
        _keep_metrics(slot, fn.spec.name, outcome)
        if _apply_status(slot, outcome, fn.spec.name, tries.has_kept(outcome)):
            slot.components[fn.spec.name] = _number(outcome.value)

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
                _fail(slot, None if tries.has_kept(exc) else _error_of(exc, slot))
            return
        values = outcome.value if isinstance(outcome.value, list) else []
        for i, slot in enumerate(live):
            _keep_metrics(slot, fn.spec.name, outcome)
            if _apply_status(slot, outcome, fn.spec.name, tries.has_kept(outcome)):
                slot.components[fn.spec.name] = _number(values[i]) if i < len(values) else None

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

    def _trajectory(self, sample: Sample, slot: _Slot) -> Trajectory:
        return Trajectory(
            trajectory_id=slot.trajectory_id, messages=slot.messages, tools=sample.tools, metrics=slot.metrics
        )

    def _record(
        self,
        step: int,
        sample: Sample,
        group_id: str,
        slot: _Slot,
        weights: dict[str, float],
        discard: bool,
        policy_version: int,
    ) -> TrajectoryRecord:
        trace = slot.trace
        status = "discard" if discard else slot.status
        return TrajectoryRecord(
            trajectory_id=slot.trajectory_id,
            group_id=group_id,
            step=step,
            sample_index=sample.index,
            rollout_index=slot.rollout_index,
            attempt=max(slot.attempt, 1),
            policy_version=policy_version,
            prompt_ids=list(trace.prompt_ids),
            response_ids=list(trace.response_ids),
            response_mask=list(trace.response_mask),
            response_logprobs=list(trace.response_logprobs),
            messages=slot.messages,
            tools=list(sample.tools),
            reward=final_reward(slot.components, weights) if status == "success" else None,
            reward_components={} if discard else dict(slot.components),  # a discarded group keeps no grade
            status=status,
            stop_reason=trace.finish_reason,
            errors=list(slot.errors),
            metrics={**slot.metrics, **_history_metrics(trace), **slot.grader_metrics},
            timing=dict(slot.timing),
            phase=self.phase,
            discard_reason=slot.discard_reason if discard else "",
        )


def _history_metrics(trace: TokenTrace) -> dict[str, float]:
    """How often the rollout rewrote its history, and the policy tokens that cost the record."""
    return {
        "history/rewrites": float(trace.rewrites),
        "history/dropped_policy_tokens": float(trace.dropped_policy_tokens),
    }


def _keep_metrics(slot: _Slot, plugin: str, outcome: CallOutcome) -> None:
    """A grader's ``ctx.metric`` values on the trajectory, as ``<grader>/<name>`` (a group grader's
    on each trajectory of its group)."""
    slot.grader_metrics.update({f"{plugin}/{name}": value for name, value in outcome.metrics.items()})


def _apply_status(slot: _Slot, outcome: CallOutcome, plugin: str, kept: bool) -> bool:
    """Record a non-success status on the slot (its verdict is on the slot already when ``kept``);
    True when the outcome's value stands."""
    if outcome.status == Status.SUCCESS.value:
        return True
    if outcome.status == Status.DISCARD.value:
        slot.discard = True
        slot.discard_reason = slot.discard_reason or discarded_by(plugin, outcome.reason)
        return False
    _fail(slot, None if kept else _verdict(outcome, plugin, slot, max(slot.attempt, 1)))
    return False


def _verdict(outcome: CallOutcome, plugin: str, slot: _Slot, attempt: int) -> ErrorRecord:
    """A plugin's own Status.FAILURE / Status.RETRY on ``slot``'s trajectory, at its try ``attempt``."""
    return reported_status(
        outcome.status,
        plugin,
        outcome.reason,
        call_id=outcome.call_id,
        trajectory_id=slot.trajectory_id,
        attempt=attempt,
    )


def _share_discard(slots: list[_Slot]) -> None:
    """A discarded group's other trajectories say which one was discarded, and why."""
    first = next((s for s in slots if s.discard), None)
    if first is None:
        return
    for slot in slots:
        if not slot.discard_reason:
            slot.discard_reason = f"its group was discarded: {first.trajectory_id}: {first.discard_reason}"


def _fail(slot: _Slot, error: ErrorRecord | None) -> None:
    slot.status = "failed"
    if error is not None:
        slot.errors.append(error)


def _error_of(exc: PluginCallError, slot: _Slot) -> ErrorRecord:
    return exc.record(trajectory_id=slot.trajectory_id, attempt=max(slot.attempt, 1))


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


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
