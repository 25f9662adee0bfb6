"""Example grader: exact match against the dataset row's answer."""

from __future__ import annotations

from plugtune import Runtime, grader
from plugtune.sdk import Context, Sample, Trajectory


@grader(runtime=Runtime(memory_mb=256, timeout_s=5, max_concurrency=8, max_instances=2))
def exact_match(ctx: Context, sample: Sample, trajectory: Trajectory) -> float | None:
    answer = sample.extra.get("answer")
    if answer is None:
        return None  # unscorable, never 0
    got = trajectory.completion.strip()
    ctx.logger.info("expected %s, got %s", answer, got)
    return 1.0 if got == str(answer) else 0.0
