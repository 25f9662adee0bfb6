"""GSM8K-style exact answer: the number after '####' against verl's reward_model.ground_truth."""

from __future__ import annotations

import re

from plugtune import Context, Sample, Trajectory, grader


@grader
def exact_answer(ctx: Context, sample: Sample, trajectory: Trajectory) -> float | None:
    expected = sample.extra.get("ground_truth")
    if expected is None:
        return None  # unscorable, never 0
    found = re.findall(r"####\s*(-?[\d,.]+)", trajectory.completion)
    return 1.0 if found and found[-1].replace(",", "") == str(expected) else 0.0
