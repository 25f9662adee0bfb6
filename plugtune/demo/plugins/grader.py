"""The demo grader: 1.0 when the answer is exactly the expected number, else 0.0."""

from __future__ import annotations

from plugtune import Context, Sample, Trajectory, grader


@grader
def exact_match(ctx: Context, sample: Sample, trajectory: Trajectory) -> float | None:
    expected = sample.extra.get("answer")
    if expected is None:
        return None  # unscorable: the row has no answer to compare with
    return 1.0 if trajectory.completion.strip() == str(expected) else 0.0
