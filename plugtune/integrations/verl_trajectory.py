"""One verl trajectory through plugtune: the rollout plugin, the graders, the store's record.

verl hands plugtune one sample at a time (an agent loop per trajectory, a reward call per
response), so a trajectory here is rolled out and graded alone; the failure policy and the store
are the ``EngineRun``'s. Engine-neutral apart from the shape of verl's dataset rows (``raw_prompt``,
``extra_info``, ``reward_model.ground_truth``, ``data_source``, ``index``).

The training step: the agent loop passes the step verl's worker holds for the trajectory (its
batch's ``meta_info["global_steps"]``). verl's servers also answer each generation with the weights
version they sampled with (``TokenOutput.extra_fields["global_steps"]``: the step of the last weight
sync, so step N samples with version N - 1); the gateway records it on the trajectory's policy
segments and the oldest one is the record's ``policy_version``. Without a step from verl, a
trajectory's step is its newest version + 1. A response verl's reward function hands over takes
its step from ``extra_info`` (``step_in``: what verl's agent loop passed on); with none there, it
is the latest step this process has seen (0 before any).

Each training step's records also feed, once the step ends (a later step begins, or the run
closes), the step's ``groups/dropped_by_rule`` and the reward-signal checks.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

from plugtune.errors import PluginCallError
from plugtune.integrations.recording import EngineRun
from plugtune.integrations.token_gateway import TokenGateway
from plugtune.integrations.verl_groups import GroupGate, with_advantages
from plugtune.jobs.plugins import JobFunction
from plugtune.sdk import Context, PluginSpec, Sample, Sampling
from plugtune.trainer.draft import EMPTY_TRACE, GroupRule, TrajectoryDraft, groups_dropped_by_rule
from plugtune.types import CallOutcome, TokenTrace, TrajectoryRecord

#: Logs and metrics reach the store at most this often (and when the run closes).
FLUSH_EVERY_S = 1.0


def plain(value: Any) -> Any:
    """``value`` with numpy arrays and scalars (verl's non-tensor batch) as plain Python."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy array or scalar
        return plain(value.tolist())
    return value


def sample_of(row: dict[str, Any], sampling_params: dict[str, Any], response_length: int) -> Sample:
    """A plugtune ``Sample`` from a verl dataset row: ``raw_prompt`` is the messages; ``extra`` is
    ``extra_info`` plus ``ground_truth`` and ``data_source``; sampling is verl's for this step."""
    extra = dict(plain(row.get("extra_info")) or {})
    reward_model = plain(row.get("reward_model")) or {}
    if isinstance(reward_model, dict) and "ground_truth" in reward_model:
        extra.setdefault("ground_truth", reward_model["ground_truth"])
    if row.get("data_source") is not None:
        extra.setdefault("data_source", plain(row["data_source"]))
    index = plain(row.get("index", extra.get("index", 0)))
    return Sample(
        messages=list(plain(row.get("raw_prompt")) or []),
        tools=list(plain(row.get("tools")) or extra.get("tools") or []),
        extra=extra,
        index=int(index) if isinstance(index, (int, float)) else 0,
        sampling=Sampling(
            temperature=float(sampling_params.get("temperature", 1.0)),
            top_p=float(sampling_params.get("top_p", 1.0)),
            max_tokens=int(response_length),
        ),
    )


class _FreshRollout:
    """The rollout as the caller sees it: every attempt starts the trajectory's record over."""

    def __init__(self, fn: JobFunction, gateway: TokenGateway, trajectory_id: str) -> None:
        self.fn, self.gateway, self.trajectory_id = fn, gateway, trajectory_id
        self.attempts = 0

    @property
    def spec(self) -> PluginSpec:
        return self.fn.spec

    async def invoke(self, ctx: Context, *args: Any) -> CallOutcome:
        self.attempts += 1
        return await self.fn.invoke(ctx, self.gateway.open(self.trajectory_id), *args)


@dataclass
class _Trajectory(TrajectoryDraft):
    """A verl trajectory while it is produced."""

    step: int | None = None  # as verl said (None: not said)


class TrajectoryRunner:
    """Rolls out and grades single trajectories of ``run``'s job and records them."""

    def __init__(self, run: EngineRun) -> None:
        self.run = run
        self.grades = bool(run.graders)
        self._weights = {jf.spec.name: jf.spec.weight for jf in run.graders}
        self._flush_lock = threading.Lock()
        self._flushed = 0.0
        self.step = 0  # the latest training step seen (0: none yet)
        self.rule = run.job.spec.failure_policy.group.rule() if run.job is not None else GroupRule()
        self.gate = GroupGate(self.rule)
        self.max_new_tokens: int | None = None  # verl's response_length, once an agent loop said it
        self._steps: dict[int, list[TrajectoryRecord]] = {}  # the training steps' records so far

    async def roll(
        self,
        gateway: TokenGateway,
        sample: Sample,
        *,
        step: int | None = None,
        phase: str = "train",
        group: tuple[str, int] | None = None,
    ) -> TrajectoryRecord:
        """The rollout plugin on ``sample`` (policy calls through ``gateway``), then the graders;
        ``step``: verl's training step of the trajectory, when known; ``group``: its prompt group's
        key and size, when ``failure_policy.group`` is to judge the group before it is recorded."""
        gated = group is not None and self.rule != GroupRule()
        if gated:
            self.gate.enter()
        try:
            t = await self._roll(gateway, sample, step, phase)
        except BaseException:
            if gated:
                self.gate.leave()
            raise
        if group is not None and gated:
            await self.gate.settle(*group, t)
        return self._record(t)

    async def _roll(self, gateway: TokenGateway, sample: Sample, step: int | None, phase: str) -> _Trajectory:
        t = _Trajectory(f"verl-{uuid4().hex[:16]}", sample, step=step, phase=phase)
        rollout = self.run.rollout
        if rollout is None:
            raise RuntimeError("the job has no rollout plugin")
        fresh = _FreshRollout(rollout, gateway, t.trajectory_id)
        started = time.perf_counter()
        outcome: CallOutcome | PluginCallError
        try:
            outcome = await self._call(fresh, t, sample)
        except PluginCallError as exc:
            outcome = exc
        finally:
            t.trace = _take(gateway, t.trajectory_id)
            t.attempt = fresh.attempts
            t.timing["rollout_s"] = time.perf_counter() - started
        if isinstance(outcome, PluginCallError):
            t.rollout_failed(outcome)
        else:
            t.rolled_out(outcome, rollout.spec.name)
        if t.ok:
            await self._grade(t)
        return t

    def grade_text(
        self, data_source: Any, text: str, ground_truth: Any, extra: dict[str, Any]
    ) -> TrajectoryRecord:
        """Grade one response verl decoded (no rollout ran through plugtune); blocks."""
        return self.grade_texts([(data_source, text, ground_truth, extra)])[0]

    def grade_texts(self, rows: list[tuple[Any, str, Any, dict[str, Any]]]) -> list[TrajectoryRecord]:
        """Grade responses concurrently; blocks until all are graded and recorded."""

        async def grade_all() -> list[TrajectoryRecord]:
            return list(await asyncio.gather(*(self._grade_text(*row) for row in rows)))

        return self.run.run_coroutine(grade_all())

    async def _grade_text(
        self, data_source: Any, text: str, ground_truth: Any, extra: dict[str, Any]
    ) -> TrajectoryRecord:
        extra = {**extra, "ground_truth": plain(ground_truth), "data_source": plain(data_source)}
        given = extra.get("messages")
        messages: list[dict[str, Any]] = list(given) if isinstance(given, list) else []
        index = extra.get("index", 0)
        sample = Sample(messages=messages, extra=extra, index=int(index) if isinstance(index, int) else 0)
        t = _Trajectory(f"verl-{uuid4().hex[:16]}", sample, step=step_in(extra))
        t.messages = [*sample.messages, {"role": "assistant", "content": text}]
        await self._grade(t)
        return self._record(t)

    async def _grade(self, t: _Trajectory) -> None:
        started = time.perf_counter()
        trajectory = t.trajectory()
        graders = self.run.graders

        async def one(fn: JobFunction) -> None:
            try:
                outcome = await self._call(fn, t, t.sample, trajectory)
            except PluginCallError as exc:
                t.call_failed(exc)
                return
            t.graded(fn.spec.name, outcome, outcome.value)

        await asyncio.gather(*(one(fn) for fn in graders))
        t.timing["graders_s"] = time.perf_counter() - started

    async def _call(self, fn: Any, t: _Trajectory, *args: Any) -> CallOutcome:
        ctx = Context(
            step=self._step_of(t),
            phase=t.phase,
            sample_id=t.sample.index,
            trajectory_id=t.trajectory_id,
            attempt=t.try_number,
        )
        return await asyncio.wrap_future(self.run.submit(fn, ctx, *args))

    def _step_of(self, t: _Trajectory) -> int:
        if t.step is not None:
            return t.step
        newest = _versions(t.trace or EMPTY_TRACE)[1]
        return newest + 1 if newest is not None else self.step

    def _record(self, t: _Trajectory) -> TrajectoryRecord:
        oldest, _ = _versions(t.trace or EMPTY_TRACE)
        step = self._step_of(t)
        t.group_id = f"verl-s{step}-p{t.sample.index}"
        version = oldest if oldest is not None else max(step - 1, 0)
        record = t.record(step=step, policy_version=version, weights=self._weights)
        with self._flush_lock:  # agent loops and reward calls record from different threads
            self.run.add_trajectories([record])
            if t.phase == "train":
                self._steps.setdefault(step, []).append(record)
            if step > self.step and t.phase == "train":  # a new step began: the last one's counts
                self._end_steps(before=step)
                self.run.flush(self.step or None)
                self.step, self._flushed = step, time.monotonic()
            elif time.monotonic() - self._flushed >= FLUSH_EVERY_S:
                self.run.flush()
                self._flushed = time.monotonic()
        return record

    def finish(self) -> None:
        """The steps not ended yet end (the run closes): their signal checks, the last one's
        call counts and the job's steps done."""
        with self._flush_lock:
            self._end_steps(before=None)
            if self.step:
                try:
                    self.run.flush(self.step)
                except PluginCallError:  # the circuit breaker recorded the run's failure: close ends it so
                    pass

    def _end_steps(self, before: int | None) -> None:
        """Per ended training step (those before ``before``; all with None): the groups
        ``failure_policy.group`` dropped and the reward-signal checks, from its records."""
        for step in sorted(s for s in self._steps if before is None or s < before):
            records = with_advantages(self._steps.pop(step))
            self.run.add_metrics(step, {"groups/dropped_by_rule": float(groups_dropped_by_rule(records))})
            self.run.add_signal(step, records, self._weights, self.max_new_tokens or 0)


def step_in(extra: dict[str, Any]) -> int | None:
    """The training step of a response verl's reward function is handed, from what its agent loop
    passed on in ``extra_info``: plugtune's agent loop's ``plugtune_step``, else the weights version
    verl's servers sampled it with (``max_global_steps``/``global_steps``: step N samples with the
    weights of step N - 1) + 1; None when neither is there."""
    given = extra.get("plugtune_step")
    if isinstance(given, (int, float)) and given > 0:
        return int(given)
    for key in ("max_global_steps", "global_steps"):
        version = extra.get(key)
        if isinstance(version, (int, float)) and version >= 0:
            return int(version) + 1
    return None


def _versions(trace: TokenTrace) -> tuple[int | None, int | None]:
    """The oldest and newest weights versions the trajectory's policy tokens were sampled with
    (None: the engine reported none)."""
    versions = [s.policy_version for s in trace.segments if s.source == "policy" and s.policy_version >= 0]
    return (min(versions), max(versions)) if versions else (None, None)


def _take(gateway: TokenGateway, trajectory_id: str) -> TokenTrace:
    try:
        return gateway.take(trajectory_id)
    except KeyError:  # the rollout was never called
        return EMPTY_TRACE
