"""Steps whose groups give the policy no gradient, or whose replies are cut at max_new_tokens, are
measured and warned about (issue 24, item 7): pure functions of the step's records, and a real step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plugtune import grader
from plugtune.sdk import Context, Sample, Trajectory
from plugtune.trainer.health import (
    SIGNAL_WINDOW,
    StepSignal,
    signal_warnings,
    step_signal,
    warning_examples,
)
from plugtune.types import TrajectoryRecord
from tests.trainer.test_grpo import make_trainer


def record(
    group: str, r: int, advantage: float | None, stop: str = "stop", tokens: int = 3
) -> TrajectoryRecord:
    return TrajectoryRecord(
        trajectory_id=f"{group}-r{r}",
        group_id=group,
        step=1,
        sample_index=0,
        rollout_index=r,
        attempt=1,
        policy_version=0,
        prompt_ids=[1, 2],
        response_ids=[5] * tokens,
        response_mask=[1] * tokens,
        response_logprobs=[-1.0] * tokens,
        messages=[],
        advantage=advantage,
        stop_reason=stop,
    )


def test_a_step_signal_counts_flat_and_unscored_groups_and_cut_replies() -> None:
    records = [
        *(record("s1-b0-p3", i, 0.0) for i in range(2)),  # the same reward twice: zero variance
        record("s1-b1-p0", 0, 0.7, stop="length"),
        record("s1-b1-p0", 1, -0.7),
        *(record("s1-b2-p1", i, None, tokens=0) for i in range(2)),  # failed before the policy
    ]
    signal = step_signal(1, records)
    assert (signal.groups, signal.flat_groups, signal.unscored_groups) == (3, 1, 1)
    assert (signal.replies, signal.truncated) == (4, 1)
    assert signal.zero_variance_share == 1 / 3 and signal.truncated_share == 1 / 4
    assert signal.flat_examples == ("s1-b0-p3-r0",) and signal.truncated_examples == ("s1-b1-p0-r0",)


def flat_step(step: int, flat: int, groups: int = 4) -> StepSignal:
    examples = tuple(f"s{step}-b{b}-p0-r0" for b in range(flat))
    return StepSignal(step, groups, flat, 0, groups * 2, 0, flat_examples=examples[:3])


def test_most_groups_without_a_gradient_warn_with_example_ids_and_half_do_not() -> None:
    [warning] = signal_warnings([flat_step(s, 3) for s in range(1, 11)], max_new_tokens=8)
    assert warning.key == "no_gradient"
    assert warning.message.startswith("steps 1-10: 30 of 40 groups (75%) gave the policy no gradient")
    assert "groups/zero_variance_share" in warning.message
    assert warning_examples(warning.message) == ["s1-b0-p0-r0", "s1-b1-p0-r0", "s1-b2-p0-r0"]
    assert signal_warnings([flat_step(s, 2) for s in range(1, 11)], max_new_tokens=8) == []


def test_most_replies_cut_at_max_new_tokens_warn() -> None:
    cut = [StepSignal(s, 2, 0, 0, 4, 3, truncated_examples=(f"s{s}-b0-p0-r1",)) for s in (1, 2)]
    [warning] = signal_warnings(cut, max_new_tokens=8)
    assert (
        warning.key == "truncated" and "6 of 8 replies (75%) stopped at max_new_tokens (8)" in warning.message
    )
    assert warning_examples(warning.message) == ["s1-b0-p0-r1", "s2-b0-p0-r1"]
    assert warning_examples("logprob_gap is 0.1") == []


@grader
def constant(ctx: Context, sample: Sample, trajectory: Trajectory) -> float:
    return 1.0


async def test_a_constant_grader_trains_nothing_and_the_trainer_says_so(tiny_model_path: Path) -> None:
    trainer = make_trainer(tiny_model_path, graders=[constant], steps=2, max_new_tokens=4)
    results: list[Any] = [await trainer.step() for _ in range(2)]
    for result in results:
        assert result.metrics["groups/zero_variance_share"] == 1.0
        assert result.metrics["trajectories/trained"] == 0  # advantage 0 everywhere: no gradient
        assert result.metrics["trajectories/total"] == 8
    assert results[0].warnings == []  # the window is the run's two steps: only the last one warns
    [warning] = [w for w in results[1].warnings if w.key == "no_gradient"]
    assert warning.message.startswith("steps 1-2: 4 of 4 groups (100%) gave the policy no gradient")
    assert set(warning_examples(warning.message)) <= {r.trajectory_id for res in results for r in res.records}
    assert len(trainer.signals) == 2 and SIGNAL_WINDOW >= 2
