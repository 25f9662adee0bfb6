"""``plugtune run``'s progress bar line: what it shows of the last step's metrics."""

from __future__ import annotations

from plugtune.jobs.progress import _summary


def test_the_progress_bar_shows_the_groups_left_out_when_there_are_some() -> None:
    shown = {
        "reward/mean": 0.5,
        "dynamic_sampling/filtered_groups": 3.0,
        "dynamic_sampling/extra_rollouts": 6.0,
    }
    assert "filtered 3 (+6 rollouts)" in _summary(shown, 0)
    assert "filtered" not in _summary({**shown, "dynamic_sampling/filtered_groups": 0.0}, 0)
    assert "filtered" not in _summary({"reward/mean": 0.5}, 0)
