"""Graders for the TRL tests: exact match, and one that crashes on marked rows (or dies once: ``flaky``;
reports ``Status.FAILURE`` or discards on rows marked ``report``; ``crash_first``: crashes on a
group's first completion only)."""

from __future__ import annotations

import os

from plugtune import Context, Discard, GraderResult, Sample, Status, Trajectory, grader


@grader
def exact_match(ctx: Context, sample: Sample, trajectory: Trajectory) -> float | None:
    expected = sample.extra.get("answer")
    if expected is None:
        return None
    return 1.0 if trajectory.completion.strip() == str(expected) else 0.0


@grader
def picky(ctx: Context, sample: Sample, trajectory: Trajectory) -> float | GraderResult:
    if sample.extra.get("report") == "failure":
        return GraderResult(status=Status.FAILURE, reason="the checker is down")
    if sample.extra.get("report") == "discard":
        raise Discard("an ambiguous question")
    if sample.extra.get("flaky") and ctx.attempt == 1:
        os._exit(3)  # the instance dies mid-call (EOF); a retry runs on a fresh one
    if sample.extra.get("crash") or sample.extra.get("crash_at_step") == ctx.step:
        raise ValueError(f"picky cannot score row {sample.index} at step {ctx.step}")
    if sample.extra.get("crash_first") and ctx.rollout_index == 0:
        raise ValueError(f"picky cannot score row {sample.index} at step {ctx.step}")
    ctx.logger.info("picky scored %d characters", len(trajectory.completion))
    return 0.5
