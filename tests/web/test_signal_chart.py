"""The job page draws the reward-signal health metrics (issue 27 item 1) in a chart of their own,
not among the rewards: the shares the no_gradient, truncated, unscorable, saturated and
dominant_component warnings read."""

from __future__ import annotations

from plugtune.store import Store
from plugtune.types import MetricPoint
from plugtune.web.charts import training_charts

SHARES = [
    "groups/zero_variance_share",
    "response/truncated_share",
    "grader/judge/unscorable_share",
    "reward/at_ceiling_share",
    "reward/at_floor_share",
    "reward/judge/variance_share",
    "reward/format/variance_share",
]


def test_signal_health_shares_get_their_own_chart_and_leave_the_reward_chart(store: Store) -> None:
    job_id = store.create_job("signal", {"name": "signal"})
    names = ["reward/mean", "reward/judge", *SHARES]
    store.add_metrics(job_id, [MetricPoint(1.0 + s, "", n, 0.5, step=s) for s in (1, 2) for n in names])
    charts = {c.key: c for c in training_charts(store, job_id, "succeeded")}
    assert {s.name for s in charts["reward"].series} == {"mean", "judge"}
    assert {s.name for s in charts["signal"].series} == set(SHARES)
    assert not any(c.title in SHARES for c in charts.values())  # none drawn alone as an unclaimed metric
