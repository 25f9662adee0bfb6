"""The off-policy (logprob_gap) and history-rewrite warnings name example trajectories, so the job page
links each to its token view: the largest gap first, and the trajectories that rewrote history."""

from __future__ import annotations

import dataclasses

from plugtune.trainer.health import step_warnings
from plugtune.types import TrajectoryRecord

BASE = TrajectoryRecord(
    trajectory_id="",
    group_id="g",
    step=3,
    sample_index=0,
    rollout_index=0,
    attempt=1,
    policy_version=2,
    prompt_ids=[1],
    response_ids=[5, 6, 7],
    response_mask=[1, 0, 1],
    response_logprobs=[-1.0, 0.0, -1.0],
    messages=[],
)


def _scored(tid: str, trainer: list[float], rewrites: float = 0.0) -> TrajectoryRecord:
    return dataclasses.replace(
        BASE, trajectory_id=tid, trainer_logprobs=trainer, metrics={"history/rewrites": rewrites}
    )


def test_the_gap_warning_names_the_furthest_trajectories_first() -> None:
    records = [
        _scored("near", [-1.01, 0.0, -1.0]),
        _scored("far", [-3.0, 0.0, -1.0]),
        _scored("env-only-gap", [-1.0, -9.0, -1.0]),  # a tool token's trainer value is no gap
        BASE,  # not scored by the trainer: left out
    ]
    [warning] = step_warnings(3, {"logprob_gap": 0.5}, 1e-3, 1.0, records)
    assert warning.key == "logprob_gap"
    assert warning.message.endswith("Example trajectories: far, near, env-only-gap.")


def test_the_history_warning_names_the_rewritten_trajectories() -> None:
    records = [_scored("kept", [], 0.0), _scored("cut", [], 2.0)]
    metrics = {"history/rewrites": 2.0, "tokens/dropped_policy": 5.0}
    [warning] = step_warnings(3, metrics, 1e-3, 1.0, records)
    assert warning.key == "history_rewrites" and warning.message.endswith("Example trajectories: cut.")


def test_without_records_the_warnings_end_as_before() -> None:
    [warning] = step_warnings(3, {"logprob_gap": 0.5}, 1e-3, 1.0)
    assert warning.message.endswith("policy.openai() / policy.achat() of the rollout's policy.")
