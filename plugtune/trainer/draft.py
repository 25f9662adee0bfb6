"""A trajectory while a trainer produces it, and the record it becomes: one set of rules for how
a plugin's verdict changes a trajectory, shared by plugtune's trainer, TRL and verl.

The rules (DESIGN §2, Ark semantics):

- a call that raised ``PluginCallError``, or a plugin that reported ``Status.FAILURE`` or
  ``Status.RETRY``, fails the trajectory: no reward, no gradient, and the error (cause, plugin,
  try) stays in its ``errors``;
- ``Status.DISCARD`` discards it, keeping the first discarding plugin's reason in
  ``discard_reason``; a discard outranks a failure, and a discarded trajectory keeps no grade;
- a rollout's messages are what it returned, else what the policy saw, else the prompt; its
  ``ctx.metric`` values (and the metrics it returned) are the trajectory's ``metrics``;
- a grader's value is its reward component only when the grader succeeded (``None``: it found the
  trajectory unscorable, never 0); its ``ctx.metric`` values land as ``<grader>/<name>`` whatever
  its verdict;
- the reward is the weighted sum of the components of a trajectory that succeeded (``None`` when
  no grader scored it);
- a finished group settles once (:func:`settle_group`): a plugin's discard drops it whole, else
  ``failure_policy.group`` (:class:`GroupRule`) may drop it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from plugtune.errors import PluginCallError, discarded_by, reported_status
from plugtune.sdk import Sample, Status, Trajectory
from plugtune.trainer.rewards import final_reward
from plugtune.types import CallOutcome, ErrorRecord, TokenTrace, TrajectoryRecord

EMPTY_TRACE = TokenTrace(prompt_ids=[], response_ids=[], response_mask=[], response_logprobs=[], messages=[])


@dataclass
class TrajectoryDraft:
    """One trajectory of ``sample`` while its plugins run (mutable; :meth:`record` freezes it)."""

    trajectory_id: str
    sample: Sample
    group_id: str = ""
    rollout_index: int = 0
    phase: str = "train"
    attempt: int = 0  # the rollout's tries so far (0: none ran here)
    trace: TokenTrace | None = None  # the policy's tokens (None: none recorded)
    messages: list[dict[str, Any]] = field(default_factory=list)
    failed: bool = False
    discarded: bool = False
    discard_reason: str = ""
    errors: list[ErrorRecord] = field(default_factory=list)
    components: dict[str, float | None] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)  # the rollout's (its graders read them)
    grader_metrics: dict[str, float] = field(default_factory=dict)  # "<grader>/<name>": its ctx.metric
    timing: dict[str, float] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return "discard" if self.discarded else "failed" if self.failed else "success"

    @property
    def ok(self) -> bool:
        return not (self.failed or self.discarded)

    @property
    def try_number(self) -> int:
        return max(self.attempt, 1)

    # --- verdicts ------------------------------------------------------------------------------

    def fail(self, error: ErrorRecord | None = None) -> None:
        self.failed = True
        if error is not None:
            self.errors.append(error)

    def discard(self, reason: str) -> None:
        self.discarded = True
        self.discard_reason = self.discard_reason or reason

    def call_failed(self, exc: PluginCallError, *, kept: bool = False) -> None:
        """A call for this trajectory raised ``exc`` (its record is on it already when ``kept``)."""
        self.fail(None if kept else exc.record(trajectory_id=self.trajectory_id, attempt=self.try_number))

    def apply(self, outcome: CallOutcome, plugin: str, *, kept: bool = False) -> bool:
        """``plugin``'s verdict on the trajectory (a failure's record is on it already when
        ``kept``); True when the outcome's value stands."""
        if outcome.status == Status.SUCCESS.value:
            return True
        if outcome.status == Status.DISCARD.value:
            self.discard(discarded_by(plugin, outcome.reason))
        else:
            self.fail(None if kept else self.verdict(outcome, plugin, self.try_number))
        return False

    def verdict(self, outcome: CallOutcome, plugin: str, attempt: int) -> ErrorRecord:
        """``plugin``'s own Status.FAILURE / Status.RETRY on this trajectory, at its try ``attempt``."""
        return reported_status(
            outcome.status,
            plugin,
            outcome.reason,
            call_id=outcome.call_id,
            trajectory_id=self.trajectory_id,
            attempt=attempt,
        )

    def join_discard(self, first: TrajectoryDraft) -> None:
        """Its group was discarded because ``first`` was: it says which one, and why."""
        self.discard(f"its group was discarded: {first.trajectory_id}: {first.discard_reason}")

    # --- what the plugins give -----------------------------------------------------------------

    def rolled_out(self, outcome: CallOutcome, plugin: str, *, kept: bool = False) -> None:
        """The rollout ended with ``outcome`` (set :attr:`trace` first)."""
        result = outcome.value if isinstance(outcome.value, dict) else {}
        self.messages = list(result.get("messages") or self._seen())
        self.metrics.update(outcome.metrics)
        self.metrics.update(result.get("metrics") or {})
        self.apply(outcome, plugin, kept=kept)

    def rollout_failed(self, exc: PluginCallError, *, kept: bool = False) -> None:
        """The rollout's call raised ``exc``: what the policy saw stays as evidence."""
        self.messages = self._seen()
        self.call_failed(exc, kept=kept)

    def graded(self, plugin: str, outcome: CallOutcome, value: Any, *, kept: bool = False) -> None:
        """``plugin`` graded the trajectory ``value`` (a group grader: its value for this one)."""
        self.grader_metrics.update({f"{plugin}/{name}": v for name, v in outcome.metrics.items()})
        if self.apply(outcome, plugin, kept=kept):
            self.components[plugin] = None if value is None else float(value)

    def trajectory(self) -> Trajectory:
        """What its graders score."""
        return Trajectory(
            trajectory_id=self.trajectory_id,
            messages=self.messages,
            tools=self.sample.tools,
            metrics=self.metrics,
        )

    def _seen(self) -> list[dict[str, Any]]:
        recorded = self.trace.messages if self.trace is not None else []
        return list(recorded or self.sample.messages)

    # --- the record ----------------------------------------------------------------------------

    def record(
        self,
        *,
        step: int,
        policy_version: int,
        weights: dict[str, float],
        extra_metrics: dict[str, float] | None = None,
        code_hash: dict[str, str] | None = None,
    ) -> TrajectoryRecord:
        """The trajectory's record; ``extra_metrics`` go between the rollout's and the graders'."""
        trace = self.trace if self.trace is not None else EMPTY_TRACE
        status = self.status
        return TrajectoryRecord(
            trajectory_id=self.trajectory_id,
            group_id=self.group_id,
            step=step,
            sample_index=self.sample.index,
            rollout_index=self.rollout_index,
            attempt=self.try_number,
            policy_version=policy_version,
            prompt_ids=list(trace.prompt_ids),
            response_ids=list(trace.response_ids),
            response_mask=list(trace.response_mask),
            response_logprobs=list(trace.response_logprobs),
            messages=self.messages,
            tools=list(self.sample.tools),
            reward=final_reward(self.components, weights) if status == "success" else None,
            reward_components={} if self.discarded else dict(self.components),
            status=status,
            stop_reason=trace.finish_reason,
            errors=list(self.errors),
            metrics={**self.metrics, **(extra_metrics or {}), **self.grader_metrics},
            timing=dict(self.timing),
            code_hash=code_hash if code_hash is not None else {},
            phase=self.phase,
            discard_reason=self.discard_reason if self.discarded else "",
            dropped_spans=list(trace.dropped_spans),
        )


def share_discard(drafts: Sequence[TrajectoryDraft]) -> bool:
    """A discard drops the whole group: when one of ``drafts`` is discarded, every other one is,
    saying which one and why. True when the group is discarded."""
    first = next((d for d in drafts if d.discarded), None)
    if first is None:
        return False
    for draft in drafts:
        draft.join_discard(first)
    return True


#: How a trajectory that ``failure_policy.group`` dropped says so: its ``discard_reason`` starts so.
DROPPED_BY_RULE = "its group was dropped by failure_policy.group"


@dataclass(frozen=True)
class GroupRule:
    """``failure_policy.group``: which prompt groups train when some of their trajectories failed
    or were not scored. ``drop="trajectory"`` leaves a failed one out of its group (the rest train),
    ``drop="group"`` drops its whole group; a group with fewer than ``min_scored`` scored
    trajectories (succeeded, with a reward) is dropped."""

    drop: str = "trajectory"  # trajectory | group
    min_scored: int = 0

    def reason(self, drafts: Sequence[TrajectoryDraft]) -> str:
        """Why the rule drops this group ('' when it keeps it)."""
        failed = sum(d.failed and not d.discarded for d in drafts)
        if self.drop == "group" and failed:
            return f"{DROPPED_BY_RULE}: {failed} of its {len(drafts)} trajectories failed (drop: group)"
        scored = sum(d.ok and any(v is not None for v in d.components.values()) for d in drafts)
        if scored < self.min_scored:
            return (
                f"{DROPPED_BY_RULE}: {scored} of its {len(drafts)} trajectories scored, "
                f"fewer than min_scored {self.min_scored}"
            )
        return ""

    def apply(self, drafts: Sequence[TrajectoryDraft]) -> bool:
        """Discard the group's trajectories that would have trained when the rule drops it (the
        failed ones stay failed); True when it did."""
        reason = self.reason(drafts)
        for draft in drafts:
            if reason and draft.ok:
                draft.discard(reason)
        return bool(reason)


def settle_group(drafts: Sequence[TrajectoryDraft], rule: GroupRule) -> bool:
    """A finished group's own verdict: a plugin's discard drops it whole, else ``rule`` decides;
    True when the group is dropped (none of it trains)."""
    return share_discard(drafts) or rule.apply(drafts)


def groups_dropped_by_rule(records: Sequence[TrajectoryRecord]) -> int:
    """How many of ``records``' groups ``failure_policy.group`` dropped."""
    return len({r.group_id for r in records if r.discard_reason.startswith(DROPPED_BY_RULE)})
