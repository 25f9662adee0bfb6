"""Graders for the verl tests: exact match on verl's ground truth, and one that crashes on marked rows."""

from __future__ import annotations

from plugtune import Context, Sample, Trajectory, grader


@grader
def exact_match(ctx: Context, sample: Sample, trajectory: Trajectory) -> float | None:
    expected = sample.extra.get("ground_truth")
    if expected is None:
        return None
    return 1.0 if trajectory.completion.strip() == str(expected) else 0.0


@grader
def picky(ctx: Context, sample: Sample, trajectory: Trajectory) -> float:
    if sample.extra.get("crash"):
        raise ValueError(f"picky cannot score row {sample.index}")
    ctx.logger.info("picky scored %d characters", len(trajectory.completion))
    return 0.5
