"""Plugins the trainer tests run in process."""

from __future__ import annotations

from typing import Any

from plugtune import Discard, Retry, grader, group_grader, rollout
from plugtune.sdk import Context, Policy, Sample, Trajectory


@rollout
def answer(ctx: Context, policy: Policy, sample: Sample) -> None:
    policy.chat(
        sample.messages, temperature=sample.sampling.temperature, max_tokens=sample.sampling.max_tokens
    )
    if sample.extra.get("mode") == "crash":
        raise RuntimeError("rollout crashed on purpose")
    if sample.extra.get("mode") == "retry":
        raise Retry("asked to retry")
    if sample.extra.get("mode") == "discard":
        raise Discard("asked to discard")


@grader
def digits(ctx: Context, sample: Sample, trajectory: Trajectory) -> float | None:
    """Fraction of the completion's characters that are digits (None for an empty completion)."""
    text = trajectory.completion
    if sample.extra.get("mode") == "unscorable" or not text:
        return None
    return sum(ch.isdigit() for ch in text) / len(text)


@grader(weight=1e10)
def huge(ctx: Context, sample: Sample, trajectory: Trajectory) -> float:
    """A finite reward so large that the weighted sum overflows to inf."""
    return 1e300 if trajectory.trajectory_id.endswith("r0") else 0.0


@group_grader(weight=0.5)
def longest(ctx: Context, sample: Sample, trajectories: list[Trajectory]) -> list[Any]:
    lengths = [len(t.completion) for t in trajectories]
    return [1.0 if n == max(lengths) else 0.0 for n in lengths]


#: (event, rollout index, time) of the plugins below, for ordering tests.
EVENTS: list[tuple[str, int, float]] = []


@rollout
def slow_first(ctx: Context, policy: Policy, sample: Sample) -> None:
    """Rollout 0 of each group takes a second longer than its siblings."""
    import time

    policy.chat(sample.messages, max_tokens=4)
    if ctx.rollout_index == 0:
        time.sleep(1.0)
    EVENTS.append(("rollout ended", ctx.rollout_index, time.monotonic()))


@grader
def stamp(ctx: Context, sample: Sample, trajectory: Trajectory) -> float:
    import time

    EVENTS.append(("graded", ctx.rollout_index, time.monotonic()))
    return 1.0


@rollout
def discard_first(ctx: Context, policy: Policy, sample: Sample) -> None:
    """Rollout 0 of each group discards it (its siblings end well)."""
    policy.chat(sample.messages, max_tokens=4)
    if ctx.rollout_index == 0:
        raise Discard("the tool sandbox was down")


@grader
def constant(ctx: Context, sample: Sample, trajectory: Trajectory) -> float:
    return 0.5


@rollout
async def first_ends(ctx: Context, policy: Policy, sample: Sample) -> None:
    """Each rollout calls the policy once; rollout 0 of each group then ends, the others run on
    for a minute."""
    import asyncio

    await asyncio.to_thread(policy.chat, sample.messages, max_tokens=4)
    if ctx.rollout_index != 0:
        await asyncio.sleep(60)


@rollout
def fail_first(ctx: Context, policy: Policy, sample: Sample) -> None:
    """Rollout 0 of each group fails (its siblings end well)."""
    policy.chat(sample.messages, max_tokens=4)
    if ctx.rollout_index == 0:
        raise RuntimeError("rollout 0 crashed on purpose")


@grader
def by_index(ctx: Context, sample: Sample, trajectory: Trajectory) -> float | None:
    """Unscorable for rollouts below ``sample.extra['unscorable_below']``, else its index."""
    return (
        None if ctx.rollout_index < int(sample.extra.get("unscorable_below", 0)) else float(ctx.rollout_index)
    )


@grader
def flat_when_told(ctx: Context, sample: Sample, trajectory: Trajectory) -> float:
    """0.5 for every rollout of a row whose extra says ``flat`` (zero variance), else its index."""
    return 0.5 if sample.extra.get("flat") else float(ctx.rollout_index)
