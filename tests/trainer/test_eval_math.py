"""The eval math: the unbiased pass@k estimator and the eval/* metrics, against hand-computed values."""

from __future__ import annotations

import math

import pytest

from plugtune.trainer.evaluation import EvalSettings, eval_metrics, pass_at_k
from plugtune.types import TrajectoryRecord


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (10, 1, 1, 0.1),  # pass@1 is the share that passed
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
        (4, 0, 2, 0.0),
        (4, 3, 2, 1.0),  # fewer failures than k: some pick of k always holds a pass
        (4, 4, 4, 1.0),
        (4, 1, 4, 1.0),  # n == k: any pass among the n
        (4, 0, 4, 0.0),
    ],
)
def test_pass_at_k_matches_hand_computed_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(3, 4, 1), (3, 1, 4), (3, -1, 1), (3, 1, 0)])
def test_pass_at_k_refuses_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def _record(reward: float | None, components: dict[str, float | None], length: int = 3) -> TrajectoryRecord:
    return TrajectoryRecord(
        trajectory_id="t",
        group_id="g",
        step=2,
        sample_index=0,
        rollout_index=0,
        attempt=1,
        policy_version=2,
        prompt_ids=[1],
        response_ids=list(range(length)),
        response_mask=[1] * length,
        response_logprobs=[0.0] * length,
        messages=[],
        reward=reward,
        reward_components=components,
        status="success" if reward is not None else "failed",
        phase="eval",
    )


def test_eval_metrics_of_three_rows() -> None:
    settings = EvalSettings(k=2, samples=3, pass_threshold=1.0)
    greedy = [
        _record(1.0, {"exact": 1.0, "style": 0.0}, length=2),
        _record(0.5, {"exact": 0.0, "style": 1.0}, length=4),
        _record(None, {}, length=6),  # failed: no reward, left out of the means, counted
    ]
    sampled = [
        [_record(1.0, {}), _record(0.0, {}), _record(0.0, {})],  # c=1 of 3: 1 - C(2,2)/C(3,2) = 2/3
        [_record(1.0, {}), _record(1.0, {}), _record(None, {})],  # 2 scored, both pass: 1
        [_record(1.0, {}), _record(None, {}), _record(None, {})],  # 1 scored < k: left out
    ]
    metrics = eval_metrics(greedy, sampled, settings)
    assert metrics["eval/rows"] == 3
    assert metrics["eval/unscored"] == 4
    assert metrics["eval/pass@1"] == pytest.approx(1 / 2)
    assert metrics["eval/pass@k"] == pytest.approx((2 / 3 + 1.0) / 2)
    assert metrics["eval/k"] == 2
    assert metrics["eval/reward/mean"] == pytest.approx(0.75)
    assert metrics["eval/reward/exact"] == pytest.approx(0.5)
    assert metrics["eval/reward/style"] == pytest.approx(0.5)
    assert metrics["eval/response_length"] == pytest.approx(4.0)


def test_a_lower_threshold_passes_more_and_greedy_only_has_no_pass_at_k() -> None:
    settings = EvalSettings(k=1, samples=0, pass_threshold=0.5)
    metrics = eval_metrics([_record(1.0, {}), _record(0.5, {}), _record(0.2, {})], [], settings)
    assert metrics["eval/pass@1"] == pytest.approx(2 / 3)
    assert "eval/pass@k" not in metrics
    nothing = eval_metrics([_record(None, {})], [], settings)
    assert math.isnan(nothing["eval/pass@1"])  # nothing scored: no number, never a 0
