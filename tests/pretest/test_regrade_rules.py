"""The rules of ``plugtune regrade`` that need no job: what a flip is called, which trajectories a
``--failed-only`` re-grade takes, and what a step range looks like."""

from __future__ import annotations

import re

import pytest

from plugtune.pretest.regrade import RegradeError, failed_graders, flip_kind, parse_steps, regradable
from plugtune.types import ErrorRecord, TrajectoryRecord


def _record(
    status: str, reward: float | None, errors: tuple[str, ...] = (), discard: str = ""
) -> TrajectoryRecord:
    return TrajectoryRecord(
        trajectory_id="s1-p0-r0",
        group_id="s1-p0",
        step=1,
        sample_index=0,
        rollout_index=0,
        attempt=1,
        policy_version=1,
        prompt_ids=[],
        response_ids=[],
        response_mask=[],
        response_logprobs=[],
        messages=[],
        status=status,
        reward=reward,
        errors=[
            ErrorRecord(
                type="Call plugin error", owner="plugin", cause="500", message="ValueError: x", plugin=p
            )
            for p in errors
        ],
        discard_reason=discard,
    )


@pytest.mark.parametrize(
    ("before", "status", "reward", "kind"),
    [
        (("success", 1.0), "success", 0.0, "1→0"),
        (("success", 0.5), "success", -1.0, "1→0"),
        (("success", 0.0), "success", 1.0, "0→1"),
        (("success", 0.5), "success", 0.75, "changed"),
        (("success", 0.5), "success", 0.5, "unchanged"),
        (("success", 1.0), "success", None, "scored→unscorable"),
        (("success", 1.0), "failed", None, "scored→failed"),
        (("failed", None), "success", 0.0, "failed→scored"),
        (("failed", None), "success", None, "failed→unscorable"),
        (("failed", None), "failed", None, "unchanged"),
        (("success", None), "success", 1.0, "unscorable→scored"),
        (("success", None), "success", None, "unchanged"),
        (("success", 1.0), "discard", None, "scored→discard"),
    ],
)
def test_flip_kinds(before: tuple[str, float | None], status: str, reward: float | None, kind: str) -> None:
    assert flip_kind(_record(*before), status, reward) == kind


def test_failed_only_takes_the_graders_that_failed_a_trajectory() -> None:
    graders = ["exact", "judge"]
    assert failed_graders(_record("failed", None, ("/x/graders.py:judge",)), graders) == ["judge"]
    # a later try succeeded: its earlier try's error stays on it, and nothing is left to re-run
    assert failed_graders(_record("success", 1.0, ("judge",)), graders) == []
    assert failed_graders(_record("failed", None, ("answer",)), graders) == []  # the rollout failed it


def test_a_trajectory_its_rollout_failed_or_that_was_discarded_is_not_regraded() -> None:
    assert regradable(_record("failed", None, ("judge",)), "answer")
    assert not regradable(_record("failed", None, ("/p/rollout.py:answer",)), "answer")
    assert not regradable(_record("discard", None, discard="its group was dropped"), "answer")


def test_step_ranges() -> None:
    assert parse_steps("3..7") == (3, 7)
    assert parse_steps(" 4 ") == (4, 4)
    for bad, says in [
        ("7..3", "ends (3) before it starts (7)"),
        ("a..b", "A..B"),
        ("-1..2", "A..B"),
        ("", "A..B"),
    ]:
        with pytest.raises(RegradeError, match=re.escape(says)):
            parse_steps(bad)
