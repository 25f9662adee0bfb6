"""Warnings about steps that trained, but not on what the user thinks: pure functions of their
metrics and records (off-policy samples, dropped tokens, exploding weights or gradients, groups
without a gradient, cut replies) and the reward-signal checks (a grader's unscorable share, a reward
saturated at its ceiling or floor, one grader carrying the reward's variance, length hacking, eval
pass@1 falling while training does not), whose thresholds are job.yaml's ``signal:`` block.

Each warning has a key (the jobs layer shows a key once per attempt) and a message that says what
was measured, why it matters and what to do.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from plugtune.types import TrajectoryRecord

#: How far the trainer's recomputed log-probs may drift from the sampler's by float rounding alone
#: (mean absolute difference per policy token): the same weights run two code paths (the gateway's
#: decoder with a key/value cache, the trainer's full forward).
FULL_PRECISION_NOISE = 1e-3
HALF_PRECISION_NOISE = 2e-2


@dataclass(frozen=True)
class StepWarning:
    # logprob_gap | history_rewrites | exploding | no_gradient | truncated | unscorable | saturated
    # | dominant_component | length_hacking | eval_divergence
    key: str
    message: str


def logprob_noise(dtype: torch.dtype) -> float:
    """The ``logprob_gap`` that float rounding explains for weights of ``dtype``."""
    return FULL_PRECISION_NOISE if dtype.itemsize >= 4 else HALF_PRECISION_NOISE


def step_warnings(
    step: int,
    metrics: dict[str, float],
    noise: float,
    top_p: float,
    records: Sequence[TrajectoryRecord] = (),
) -> list[StepWarning]:
    """What the step's metrics say went silently wrong ([] for a healthy step); the off-policy and
    history warnings name example trajectories of ``records`` (the console's token view shows them)."""
    out: list[StepWarning] = []
    gap = metrics.get("logprob_gap")
    if gap is not None and gap > noise:
        cause = (
            f"hyperparameters.top_p is {top_p:g}: the gateway samples from the nucleus but the trainer "
            "scores the full distribution; set top_p: 1.0 for on-policy training"
            if top_p < 1.0
            else "the replies were sampled from another distribution than the policy at the job's "
            "temperature (a policy outside the gateway, or a model whose generation differs from its "
            "forward pass); sample through policy.openai() / policy.achat() of the rollout's policy"
        )
        out.append(
            StepWarning(
                "logprob_gap",
                f"step {step}: logprob_gap is {gap:.4g}, above the {noise:g} that numerical noise "
                f"explains: training is off-policy. Likely cause: {cause}. "
                f"{_examples(_largest_gaps(records))}".rstrip(),
            )
        )
    rewrites = metrics.get("history/rewrites", 0.0)
    if rewrites > 0:
        dropped = metrics.get("tokens/dropped_policy", 0.0)
        out.append(
            StepWarning(
                "history_rewrites",
                f"step {step}: {rewrites:.0f} rollout call(s) sent a history that differs from what the "
                f"policy produced, so {dropped:.0f} recorded policy tokens were dropped from training. "
                "Send the assistant messages back as the policy returned them (each trajectory's "
                "metrics history/rewrites and history/dropped_policy_tokens say which ones). "
                f"{_examples(_rewritten(records))}".rstrip(),
            )
        )
    return out


def _rewritten(records: Sequence[TrajectoryRecord]) -> list[str]:
    return [r.trajectory_id for r in records if r.metrics.get("history/rewrites")]


def _largest_gaps(records: Sequence[TrajectoryRecord]) -> list[str]:
    """The trajectories whose policy tokens the trainer scored furthest from the sampler (mean
    absolute difference), largest first."""
    gaps: list[tuple[float, str]] = []
    for r in records:
        pairs = [
            abs(t - s)
            for m, s, t in zip(r.response_mask, r.response_logprobs, r.trainer_logprobs, strict=False)
            if m
        ]
        if pairs:
            gaps.append((sum(pairs) / len(pairs), r.trajectory_id))
    return [tid for _, tid in sorted(gaps, key=lambda g: -g[0])]


#: A trained weight's magnitude, or a gradient norm (before clipping), past which a step is no
#: longer training but blowing the model up: a model's weights are of order 1 (a learning rate of
#: 1e30 puts them near 1e30 after one step, and the replies, then the rewards, fall apart).
EXPLODING = 1e4


def exploding_warnings(step: int, metrics: dict[str, float], learning_rate: float) -> list[StepWarning]:
    """A warning (key ``exploding``) when the step left a trained weight, or met a gradient norm,
    past ``EXPLODING`` (metrics ``weights/max_abs`` and ``grad_norm``)."""
    weight = metrics.get("weights/max_abs", 0.0)
    grad = metrics.get("grad_norm", 0.0)
    seen = [
        *([f"the largest trained weight is {weight:.3g}"] if not weight <= EXPLODING else []),
        *([f"the gradient norm before clipping is {grad:.3g}"] if not grad <= EXPLODING else []),
    ]
    if not seen:
        return []
    return [
        StepWarning(
            "exploding",
            f"step {step}: {' and '.join(seen)} (above {EXPLODING:g}): the weights are exploding, so "
            "the model is being destroyed rather than trained and its replies and rewards will fall "
            f"apart. Lower hyperparameters.learning_rate (now {learning_rate:g}; full fine-tuning "
            "usually takes 1e-6 to 1e-5) or grad_clip, and start again from the base model; see the "
            "metrics weights/max_abs and grad_norm.",
        )
    ]


#: How many steps the no-signal warnings look back over (all of a shorter run's steps), and the
#: share of groups without a gradient, or of replies cut at max_new_tokens, above which they warn.
SIGNAL_WINDOW = 10
NO_SIGNAL_SHARE = 0.5
EXAMPLES = 3  # trajectory ids a warning names
_EXAMPLES_SAID = "Example trajectories: "


@dataclass(frozen=True)
class SignalThresholds:
    """When the reward-signal checks warn: job.yaml's ``signal:`` block (``plugtune.spec.models.SignalSpec``
    documents each field); the defaults are the ones job.yaml documents."""

    unscorable_share: float = 0.5  # a grader's share of None over the window above which it warns
    saturation_steps: int = 5  # steps in a row at the reward's ceiling (or floor) before it warns
    saturation_share: float = 0.95  # the share of scored trajectories at it that makes a step count
    reward_floor: float | None = None  # the reward's lowest and highest possible values
    reward_ceiling: float | None = None  # (None: the lowest / highest this run has scored so far)
    dominant_share: float = 0.9  # one grader's share of the reward's within-group variance
    length_rise: float = 0.2  # length hacking: replies this much longer (relative) in the window's
    reward_drop: float = 0.1  # second half, while the mean reward fell by this share of its range
    eval_drop: float = 0.05  # a fall of eval pass@1 that counts, over ...
    eval_falls: int = 2  # ... this many evaluations in a row, each below the one before

    def reward_bounds(self, seen_low: float | None, seen_high: float | None) -> tuple[float, float] | None:
        """The floor and ceiling saturation is measured against: the configured ones, else the
        extremes seen so far; None while they are not two different values."""
        low = self.reward_floor if self.reward_floor is not None else seen_low
        high = self.reward_ceiling if self.reward_ceiling is not None else seen_high
        return (low, high) if low is not None and high is not None and low < high else None


@dataclass(frozen=True)
class GraderScores:
    """How often one grader found the step's trajectories unscorable (returned ``None``)."""

    name: str
    graded: int  # successful trajectories the grader was asked about
    unscorable: int  # of those, scored None
    examples: tuple[str, ...] = ()  # the first unscorable ones

    @property
    def unscorable_share(self) -> float:
        return self.unscorable / self.graded if self.graded else 0.0


@dataclass(frozen=True)
class StepSignal:
    """How much of a step's batch could teach the policy anything (see ``step_signal``)."""

    step: int
    groups: int
    flat_groups: int  # a reward was scored, but every scored trajectory of the group has the same
    unscored_groups: int  # no trajectory scored: failed, discarded or unscorable
    replies: int  # trajectories with policy tokens
    truncated: int  # of those, stopped at max_new_tokens
    flat_examples: tuple[str, ...] = ()  # a trajectory of each of the first flat groups
    unscored_examples: tuple[str, ...] = ()
    truncated_examples: tuple[str, ...] = ()
    graders: tuple[GraderScores, ...] = ()  # per grader (by name), of the successful trajectories
    bounds: tuple[float, float] | None = None  # the reward's floor and ceiling at this step
    at_floor: float | None = None  # share of the scored trajectories at the floor (None: no bounds)
    at_ceiling: float | None = None
    floor_examples: tuple[str, ...] = ()
    ceiling_examples: tuple[str, ...] = ()
    # The final reward's variance within groups (summed over the groups' scored trajectories) and
    # each grader's covariance with it (its weighted component's): they add up to the variance.
    variance: float = 0.0
    covariances: tuple[tuple[str, float], ...] = ()
    varied_examples: tuple[tuple[str, tuple[str, ...]], ...] = ()  # per grader: where it varied
    length: float = 0.0  # mean reply length (tokens) of the trajectories with a reply
    reward: float | None = None  # mean, lowest and highest scored reward (None: none scored)
    reward_low: float | None = None
    reward_high: float | None = None
    long_examples: tuple[str, ...] = ()  # the longest replies

    def variance_shares(self) -> dict[str, float]:
        """Each grader's share of the final reward's within-group variance ({} with one grader, or
        no variance)."""
        if len(self.covariances) < 2 or self.variance <= 0:
            return {}
        return {name: c / self.variance for name, c in self.covariances}

    @property
    def zero_variance_share(self) -> float:
        return self.flat_groups / self.groups if self.groups else 0.0

    @property
    def truncated_share(self) -> float:
        return self.truncated / self.replies if self.replies else 0.0


def step_signal(
    step: int,
    records: Sequence[TrajectoryRecord],
    bounds: tuple[float, float] | None = None,
    weights: Mapping[str, float] | None = None,
) -> StepSignal:
    """Which of the step's groups give no policy gradient, which replies were cut off, which
    trajectories a grader could not score and (with the reward's ``bounds``, floor and ceiling)
    how many scored trajectories sit at the floor or at the ceiling; with the graders' ``weights``
    (1.0 for one not named), how the reward's variance within groups splits among the graders."""
    groups: dict[str, list[TrajectoryRecord]] = {}
    for r in records:
        groups.setdefault(r.group_id, []).append(r)
    flat: list[str] = []
    unscored: list[str] = []
    for members in groups.values():
        if any(r.advantage for r in members):  # not None, not 0.0
            continue
        scored = [r for r in members if r.advantage is not None]
        (flat if scored else unscored).append((scored or members)[0].trajectory_id)
    replies = [r for r in records if any(r.response_mask)]
    cut = [r.trajectory_id for r in replies if r.stop_reason == "length"]
    graded = [r for r in records if r.status == "success"]
    graders = []
    for name in sorted({n for r in graded for n in r.reward_components}):
        asked = [r for r in graded if name in r.reward_components]
        none = [r.trajectory_id for r in asked if r.reward_components[name] is None]
        graders.append(GraderScores(name, len(asked), len(none), tuple(none[:EXAMPLES])))
    scored = [r for r in graded if r.reward is not None]
    floor: list[str] = []
    ceiling: list[str] = []
    if bounds is not None:
        low, high = bounds
        tie = _TIE * (high - low)
        floor = [r.trajectory_id for r in scored if r.reward is not None and r.reward <= low + tie]
        ceiling = [r.trajectory_id for r in scored if r.reward is not None and r.reward >= high - tie]

    def share(ids: list[str]) -> float | None:
        return len(ids) / len(scored) if bounds is not None and scored else None

    variance, covariances, varied = _variance_split(groups.values(), weights or {})
    rewards = [float(r.reward) for r in scored if r.reward is not None]
    longest = sorted(replies, key=lambda r: -len(r.response_ids))
    return StepSignal(
        step=step,
        groups=len(groups),
        flat_groups=len(flat),
        unscored_groups=len(unscored),
        replies=len(replies),
        truncated=len(cut),
        flat_examples=tuple(flat[:EXAMPLES]),
        unscored_examples=tuple(unscored[:EXAMPLES]),
        truncated_examples=tuple(cut[:EXAMPLES]),
        graders=tuple(graders),
        bounds=bounds,
        at_floor=share(floor),
        at_ceiling=share(ceiling),
        floor_examples=tuple(floor[:EXAMPLES]),
        ceiling_examples=tuple(ceiling[:EXAMPLES]),
        variance=variance,
        covariances=covariances,
        varied_examples=varied,
        length=sum(len(r.response_ids) for r in replies) / len(replies) if replies else 0.0,
        reward=sum(rewards) / len(rewards) if rewards else None,
        reward_low=min(rewards) if rewards else None,
        reward_high=max(rewards) if rewards else None,
        long_examples=tuple(r.trajectory_id for r in longest[:EXAMPLES]),
    )


#: The fewest steps the length-hacking check compares (two halves of two steps).
LENGTH_STEPS = 4


def length_warnings(window: Sequence[StepSignal], thresholds: SignalThresholds) -> list[StepWarning]:
    """A warning (key ``length_hacking``) when, between the two halves of ``window`` (at least
    LENGTH_STEPS steps), the replies grew by ``thresholds.length_rise`` or more (relative) while the
    mean reward fell by ``thresholds.reward_drop`` or more of the reward's range in the window."""
    steps = [s for s in window if s.reward is not None and s.length > 0]
    if len(steps) < LENGTH_STEPS:
        return []
    half = len(steps) // 2
    early, late = steps[:half], steps[half:]
    length_before = sum(s.length for s in early) / len(early)
    length_after = sum(s.length for s in late) / len(late)
    reward_before = sum(s.reward or 0.0 for s in early) / len(early)
    reward_after = sum(s.reward or 0.0 for s in late) / len(late)
    low = min(s.reward_low for s in steps if s.reward_low is not None)
    high = max(s.reward_high for s in steps if s.reward_high is not None)
    rise = (length_after - length_before) / length_before
    if high <= low or rise < thresholds.length_rise:
        return []
    drop = (reward_before - reward_after) / (high - low)
    if drop < thresholds.reward_drop:
        return []
    return [
        StepWarning(
            "length_hacking",
            f"{_span(steps)}: the replies grew {rise:.0%} longer (mean {length_before:.3g} to "
            f"{length_after:.3g} tokens, steps {early[0].step}-{early[-1].step} vs "
            f"{late[0].step}-{late[-1].step}) while the mean reward fell from {reward_before:.3g} to "
            f"{reward_after:.3g} ({drop:.0%} of its range {low:.3g} to {high:.3g}; signal.length_rise "
            f"{thresholds.length_rise:g}, signal.reward_drop {thresholds.reward_drop:g}): the policy is "
            "learning to write more, not better (length hacking): a grader may reward length (a judge "
            "that likes long answers, partial credit for any text), or long replies hit max_new_tokens "
            "and fail. Read the longest replies; cap or penalise length; see the metrics "
            f"response_length and reward/mean. {_examples([t for s in late[::-1] for t in s.long_examples])}",
        )
    ]


def _variance_split(
    groups: Iterable[list[TrajectoryRecord]], weights: Mapping[str, float]
) -> tuple[float, tuple[tuple[str, float], ...], tuple[tuple[str, tuple[str, ...]], ...]]:
    """The reward's within-group variance (sum of squares about each group's mean), each grader's
    weighted component's covariance with it (an unscorable component adds 0, as in the reward's
    sum) and, per grader, a trajectory (the best) of each of the first groups where it varied."""
    names = sorted({n for members in groups for r in members for n in r.reward_components})
    variance = 0.0
    cov = dict.fromkeys(names, 0.0)
    varied: dict[str, list[str]] = {n: [] for n in names}
    for members in groups:
        scored = [r for r in members if r.status == "success" and r.reward is not None]
        if len(scored) < 2:
            continue
        rewards = [float(r.reward or 0.0) for r in scored]
        mean = sum(rewards) / len(rewards)
        variance += sum((v - mean) ** 2 for v in rewards)
        best = max(scored, key=lambda r: float(r.reward or 0.0)).trajectory_id
        for n in names:
            parts = [weights.get(n, 1.0) * float(r.reward_components.get(n) or 0.0) for r in scored]
            part_mean = sum(parts) / len(parts)
            cov[n] += sum((p - part_mean) * (v - mean) for p, v in zip(parts, rewards, strict=True))
            if max(parts) != min(parts) and len(varied[n]) < EXAMPLES:
                varied[n].append(best)
    return variance, tuple(cov.items()), tuple((n, tuple(ids)) for n, ids in varied.items())


def dominance_warnings(window: Sequence[StepSignal], thresholds: SignalThresholds) -> list[StepWarning]:
    """A warning (key ``dominant_component``) when, over ``window``, one grader's weighted component
    carries more than ``thresholds.dominant_share`` of the final reward's variance within groups
    (the variance GRPO's advantages are made of): the other graders barely steer training."""
    variance = sum(s.variance for s in window)
    cov: dict[str, float] = {}
    examples: dict[str, list[str]] = {}
    for s in window:
        for name, c in s.covariances:
            cov[name] = cov.get(name, 0.0) + c
        for name, ids in s.varied_examples:
            examples.setdefault(name, []).extend(ids)
    if len(cov) < 2 or variance <= 0:
        return []
    name, top = max(cov.items(), key=lambda kv: kv[1])
    share = top / variance
    if share <= thresholds.dominant_share:
        return []
    others = ", ".join(n for n in cov if n != name)
    return [
        StepWarning(
            "dominant_component",
            f"{_span(window)}: grader {name} carries {share:.0%} of the final reward's variance within "
            f"groups (above signal.dominant_share {thresholds.dominant_share:g}), so the policy is "
            f"trained on {name} alone: the other graders ({others}) barely change which replies it "
            "prefers. If that is not intended, check the graders' weights (plugins.graders[].weight) and "
            f"whether the others can tell replies apart; see the metrics reward/<grader>/variance_share. "
            f"{_examples(examples.get(name, []))}",
        )
    ]


#: How close to the floor or ceiling (a share of the range between them) a reward counts as at it.
_TIE = 1e-6


def saturation_warnings(window: Sequence[StepSignal], thresholds: SignalThresholds) -> list[StepWarning]:
    """A warning (key ``saturated``) when, in each of the last ``thresholds.saturation_steps`` steps,
    at least ``thresholds.saturation_share`` of the scored trajectories sat at the reward's ceiling
    (or at its floor)."""
    n = thresholds.saturation_steps
    last = list(window)[-n:]
    if len(last) < n:
        return []
    out: list[StepWarning] = []
    for side, shares, why in (
        (
            "ceiling",
            [s.at_ceiling for s in last],
            "the policy already earns the highest reward almost every time, so the groups have almost "
            "no reward differences left and the policy learns little more: the task is solved at this "
            "difficulty; give harder prompts or a finer-grained grader, or stop here",
        ),
        (
            "floor",
            [s.at_floor for s in last],
            "the policy almost never earns more than the lowest reward, so the groups have almost no "
            "reward differences and the policy learns little: give easier prompts or partial credit, "
            "and check that the grader can give more than its floor (a broken judge returns flat zeros)",
        ),
    ):
        if not all(v is not None and v >= thresholds.saturation_share for v in shares):
            continue
        low, high = last[-1].bounds or (0.0, 0.0)
        value = high if side == "ceiling" else low
        given = thresholds.reward_ceiling if side == "ceiling" else thresholds.reward_floor
        extreme = "highest" if side == "ceiling" else "lowest"
        source = f"signal.reward_{side}" if given is not None else f"the {extreme} reward this run scored"
        ids = [t for s in last for t in (s.ceiling_examples if side == "ceiling" else s.floor_examples)]
        least = min(v for v in shares if v is not None)
        out.append(
            StepWarning(
                "saturated",
                f"{_span(last)}: the reward sat at its {side} ({value:g}, {source}) for {n} steps in a "
                f"row: in each, {least:.0%} or more of the scored trajectories got it (signal."
                f"saturation_share {thresholds.saturation_share:g}, saturation_steps {n}). {why}; see "
                f"the metric reward/at_{side}_share. {_examples(ids)}",
            )
        )
    return out


def _span(window: Sequence[StepSignal]) -> str:
    return f"step {window[0].step}" if len(window) == 1 else f"steps {window[0].step}-{window[-1].step}"


def unscorable_warnings(window: Sequence[StepSignal], thresholds: SignalThresholds) -> list[StepWarning]:
    """A warning (key ``unscorable``) when, over ``window``, a grader returned ``None`` (unscorable)
    for more than ``thresholds.unscorable_share`` of the successful trajectories it was asked about."""
    graded: dict[str, int] = {}
    none: dict[str, int] = {}
    examples: dict[str, list[str]] = {}
    for s in window:
        for g in s.graders:
            graded[g.name] = graded.get(g.name, 0) + g.graded
            none[g.name] = none.get(g.name, 0) + g.unscorable
            examples.setdefault(g.name, []).extend(g.examples)
    over = [n for n in sorted(graded) if graded[n] and none[n] / graded[n] > thresholds.unscorable_share]
    if not over:
        return []
    said = "; ".join(
        f"grader {n} found {none[n]} of {graded[n]} trajectories ({none[n] / graded[n]:.0%}) unscorable"
        for n in over
    )
    metrics = ", ".join(f"grader/{n}/unscorable_share" for n in over)
    return [
        StepWarning(
            "unscorable",
            f"{_span(window)}: {said} (it returned None, above signal.unscorable_share "
            f"{thresholds.unscorable_share:g}), so its part of the reward is missing there and those "
            "trajectories are scored by the other graders alone, or not at all. Check why it returns None "
            "(a missing field in the rows' extra, an answer format it cannot parse, a judge that fails "
            f"quietly); see the metric {metrics}. {_examples([t for n in over for t in examples[n]])}",
        )
    ]


def signal_warnings(window: Sequence[StepSignal], max_new_tokens: int) -> list[StepWarning]:
    """Warnings when, over ``window`` (the last steps), most groups gave the policy no gradient
    (key ``no_gradient``) or most replies stopped at ``max_new_tokens`` (key ``truncated``)."""
    if not window:
        return []
    steps = f"step {window[0].step}" if len(window) == 1 else f"steps {window[0].step}-{window[-1].step}"
    out: list[StepWarning] = []
    groups = sum(s.groups for s in window)
    flat = sum(s.flat_groups for s in window)
    unscored = sum(s.unscored_groups for s in window)
    if groups and (flat + unscored) / groups > NO_SIGNAL_SHARE:
        flat_ids = [t for s in window for t in s.flat_examples]
        examples = _examples(flat_ids + [t for s in window for t in s.unscored_examples])
        out.append(
            StepWarning(
                "no_gradient",
                f"{steps}: {flat + unscored} of {groups} groups ({(flat + unscored) / groups:.0%}) gave "
                f"the policy no gradient, so those steps trained on nothing: {flat} had the same reward "
                f"for every scored trajectory (zero variance: the graders could not tell the replies "
                f"apart), {unscored} had no scored trajectory (failed, discarded or unscorable). GRPO "
                "learns only from reward differences within a group: give partial credit, pick prompts "
                "the model solves sometimes (neither always nor never), or raise group_size; see the "
                f"metric groups/zero_variance_share. {examples}",
            )
        )
    replies = sum(s.replies for s in window)
    cut = sum(s.truncated for s in window)
    if replies and cut / replies > NO_SIGNAL_SHARE:
        examples = _examples([t for s in window for t in s.truncated_examples])
        out.append(
            StepWarning(
                "truncated",
                f"{steps}: {cut} of {replies} replies ({cut / replies:.0%}) stopped at max_new_tokens "
                f"({max_new_tokens}) before they ended, so the graders scored cut-off answers: raise "
                "hyperparameters.max_new_tokens or ask for shorter answers; see the metric "
                f"response/truncated_share. {examples}",
            )
        )
    return out


def warning_examples(message: str) -> list[str]:
    """The trajectory ids a warning names as its examples ([] for a warning without)."""
    _, said, tail = message.rpartition(_EXAMPLES_SAID)
    return [t for t in tail.rstrip(".").split(", ") if t] if said else []


def _examples(ids: list[str]) -> str:
    return f"{_EXAMPLES_SAID}{', '.join(ids[:EXAMPLES])}." if ids else ""


class SignalMonitor:
    """The reward-signal checks over a run's steps (its last SIGNAL_WINDOW, or saturation_steps),
    from each step's records: the native trainer's and, from the trajectories it records, a TRL
    run's. ``observe`` returns the step's signal metrics and warnings."""

    def __init__(self, thresholds: SignalThresholds | None = None, steps: int = 0) -> None:
        self.thresholds = thresholds if thresholds is not None else SignalThresholds()
        self.steps = steps  # the run's last step (0: unknown)
        self.signals: deque[StepSignal] = deque(maxlen=max(SIGNAL_WINDOW, self.thresholds.saturation_steps))
        self._seen: tuple[float, float] | None = None  # the lowest and highest reward scored so far
        self._first_step: int | None = None  # the first step observed (after a resume: later than 1)

    def measure(
        self, step: int, records: Sequence[TrajectoryRecord], weights: Mapping[str, float] | None = None
    ) -> StepSignal:
        """The step's signal, its reward measured against the floor and ceiling known after it."""
        scored = [r.reward for r in records if r.status == "success" and r.reward is not None]
        scored = [v for v in scored if math.isfinite(v)]
        if scored:
            low, high = self._seen or (min(scored), max(scored))
            self._seen = (min(low, *scored), max(high, *scored))
        bounds = self.thresholds.reward_bounds(*(self._seen or (None, None)))
        return step_signal(step, records, bounds, weights)

    def warnings(self, signal: StepSignal, max_new_tokens: int | None = None) -> list[StepWarning]:
        """The warnings once ``signal`` joins the window: saturation once saturation_steps steps
        ran; the others once the window holds SIGNAL_WINDOW steps (or every step of a shorter run);
        no_gradient and truncated only with ``max_new_tokens`` (a trainer that knows advantages)."""
        self.signals.append(signal)
        if self._first_step is None:
            self._first_step = signal.step
        runs = self.steps - self._first_step + 1 if self.steps else SIGNAL_WINDOW
        saturated = saturation_warnings(list(self.signals), self.thresholds)
        window = list(self.signals)[-SIGNAL_WINDOW:]
        if len(window) < min(SIGNAL_WINDOW, runs):
            return saturated
        return [
            *saturated,
            *(signal_warnings(window, max_new_tokens) if max_new_tokens is not None else []),
            *unscorable_warnings(window, self.thresholds),
            *dominance_warnings(window, self.thresholds),
            *length_warnings(window, self.thresholds),
        ]

    def observe(
        self, step: int, records: Sequence[TrajectoryRecord], weights: Mapping[str, float] | None = None
    ) -> tuple[dict[str, float], list[StepWarning]]:
        """A step recorded by an engine that computes no advantages (TRL): the signal metrics and
        the warnings that do not need advantages."""
        signal = self.measure(step, records, weights)
        return signal_metrics(signal), self.warnings(signal)


def signal_metrics(signal: StepSignal) -> dict[str, float]:
    """The per-step metrics of the reward-signal checks: each grader's unscorable share, the shares
    at the reward's floor and ceiling (once they are known) and each grader's variance share."""
    out = {f"grader/{g.name}/unscorable_share": g.unscorable_share for g in signal.graders}
    if signal.at_floor is not None and signal.at_ceiling is not None:
        out["reward/at_floor_share"] = signal.at_floor
        out["reward/at_ceiling_share"] = signal.at_ceiling
    for name, share in signal.variance_shares().items():
        out[f"reward/{name}/variance_share"] = share
    return out


@dataclass(frozen=True)
class EvalPoint:
    """One evaluation's greedy pass@1 (see ``eval_point``), for comparing two evaluations."""

    step: int
    rows: int  # held-out rows whose greedy reply was scored
    passed: frozenset[int]  # their indices (sample_index) whose reply passed
    failed: tuple[tuple[int, str], ...]  # (row index, greedy trajectory id) of those that did not
    length: float  # mean greedy reply length (tokens)

    @property
    def pass_at_1(self) -> float:
        return len(self.passed) / self.rows if self.rows else 0.0


def eval_point(step: int, records: Sequence[TrajectoryRecord], pass_threshold: float) -> EvalPoint:
    """The greedy pass@1 of an evaluation's records (``eval-greedy-`` groups; a reply passes when its
    reward is at least ``pass_threshold``; unscored ones are left out, as eval/pass@1 does)."""
    greedy = [r for r in records if r.group_id.startswith("eval-greedy-")]
    scored = [r for r in greedy if r.reward is not None]
    passed = frozenset(r.sample_index for r in scored if (r.reward or 0.0) >= pass_threshold)
    failed = tuple((r.sample_index, r.trajectory_id) for r in scored if r.sample_index not in passed)
    length = sum(len(r.response_ids) for r in greedy) / len(greedy) if greedy else 0.0
    return EvalPoint(step, len(scored), passed, failed, length)


def rises(points: Sequence[tuple[int, float, float]]) -> bool:
    """Whether the train reward (``(step, reward/mean, ...)`` points) rose beyond its noise: the
    least-squares slope over the steps is positive and more than twice its standard error (a flat,
    noisy reward that happened to end higher is no rise: divergence needs training to improve)."""
    n = len(points)
    xs = [float(t[0]) for t in points]
    ys = [float(t[1]) for t in points]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if n < 2 or sxx == 0:
        return False
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    if slope <= 0:
        return False
    if n < 3:
        return True
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys, strict=True)) / (n - 2)
    return slope > 2 * math.sqrt(residual / sxx)


def eval_warnings(
    evals: Sequence[EvalPoint],
    train: Sequence[tuple[int, float, float]],
    thresholds: SignalThresholds,
) -> list[StepWarning]:
    """Warnings when eval pass@1 fell at each of the last ``thresholds.eval_falls`` evaluations of
    ``evals`` (the run's, oldest first), by ``thresholds.eval_drop`` or more in all and by more
    than twice its standard error: key ``eval_divergence`` while the train reward rose beyond its
    noise over those steps (:func:`rises`; ``train``: (step, reward/mean, response_length) of the
    steps trained), key
    ``length_hacking`` while the greedy replies grew by ``thresholds.length_rise`` or more. A
    single dip (common early in training, while sampling sharpens) is not a divergence."""
    span = list(evals)[-(thresholds.eval_falls + 1) :]
    if len(span) <= thresholds.eval_falls or not all(e.rows for e in span):
        return []
    if not all(b.pass_at_1 > a.pass_at_1 for b, a in zip(span, span[1:], strict=False)):
        return []
    before, now = span[0], span[-1]
    p0, p1 = before.pass_at_1, now.pass_at_1
    noise = 2 * math.sqrt(p0 * (1 - p0) / before.rows + p1 * (1 - p1) / now.rows)
    fall = p0 - p1
    if fall < thresholds.eval_drop or fall <= noise:
        return []
    lost = [t for i, t in now.failed if i in before.passed]  # passed before, fail now
    path = " to ".join(f"{e.pass_at_1:.3g}" for e in span)
    said = (
        f"eval at step {now.step}: greedy pass@1 on the held-out rows fell from {path} (steps "
        f"{', '.join(str(e.step) for e in span)}; {len(lost)} rows that passed at step {before.step} fail "
        f"now; signal.eval_drop {thresholds.eval_drop:g}, eval_falls {thresholds.eval_falls})"
    )
    out: list[StepWarning] = []
    points = [t for t in train if before.step < t[0] <= now.step and math.isfinite(t[1])]
    if len(points) >= 2:
        half = len(points) // 2
        early = sum(t[1] for t in points[:half]) / half
        late = sum(t[1] for t in points[half:]) / (len(points) - half)
        if rises(points):
            out.append(
                StepWarning(
                    "eval_divergence",
                    f"{said} while the train reward rose (mean {early:.3g} over steps "
                    f"{points[0][0]}-{points[half - 1][0]}, {late:.3g} over steps {points[half][0]}-"
                    f"{points[-1][0]}): training and held-out results diverge. The policy may be "
                    "fitting the training rows (too few, or unlike the validation rows) or exploiting "
                    "a grader that rewards something the eval's pass threshold does not; compare the "
                    f"metrics reward/mean and eval/pass@1. {_examples(lost)}",
                )
            )
    if before.length > 0 and (now.length - before.length) / before.length >= thresholds.length_rise:
        out.append(
            StepWarning(
                "length_hacking",
                f"{said} while its greedy replies grew {(now.length - before.length) / before.length:.0%} "
                f"longer (mean {before.length:.3g} to {now.length:.3g} tokens; signal.length_rise "
                f"{thresholds.length_rise:g}): the policy is learning to write more, not better. Read "
                "the longest replies; cap or penalise length; see the metrics eval/response_length and "
                f"eval/pass@1. {_examples(lost)}",
            )
        )
    return out
