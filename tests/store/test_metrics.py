from __future__ import annotations

import pytest

from plugtune.store import Store
from plugtune.types import MetricPoint


def _series(plugin: str, name: str, n: int, *, value: float = 0.0) -> list[MetricPoint]:
    return [MetricPoint(time=1000.0 + i, plugin=plugin, name=name, value=value + i) for i in range(n)]


def test_short_series_come_back_raw_and_in_time_order(store: Store, job_id: int) -> None:
    points = _series("solve", "cpu_percent", 30)
    store.add_metrics(job_id, points[15:] + points[:15])
    store.add_metrics(job_id, _series("solve", "latency_ms_p99", 5, value=100.0))
    store.add_metrics(job_id, _series("exact", "cpu_percent", 5))
    out = store.metrics(job_id, "solve")
    assert sorted(out) == ["cpu_percent", "latency_ms_p99"]
    assert [(p.time, p.value, p.count) for p in out["cpu_percent"]] == [(p.time, p.value, 1) for p in points]
    assert list(store.metrics(job_id, "solve", ["latency_ms_p99"])) == ["latency_ms_p99"]
    assert store.metric_names(job_id, "solve") == ["cpu_percent", "latency_ms_p99"]


def test_long_series_are_downsampled_to_at_most_n_bucket_means(store: Store, job_id: int) -> None:
    store.add_metrics(job_id, _series("solve", "exec_qps", 10_000))
    series = store.metrics(job_id, "solve", ["exec_qps"], max_points=100)["exec_qps"]
    assert 90 <= len(series) <= 100
    assert sum(p.count for p in series) == 10_000
    assert all(a.time < b.time for a, b in zip(series, series[1:], strict=False))
    for p in series:  # values are 0..9999 at times 1000..10999: each mean sits on the line
        assert p.value == pytest.approx(p.time - 1000.0)
    assert series[0].time < 1000.0 + 100 and series[-1].time > 1000.0 + 9_800


def test_time_range_is_inclusive(store: Store, job_id: int) -> None:
    store.add_metrics(job_id, _series("solve", "instances", 100))
    series = store.metrics(job_id, "solve", since=1010.0, until=1019.0)["instances"]
    assert [p.time for p in series] == [1000.0 + i for i in range(10, 20)]
    assert store.metrics(job_id, "solve", since=5000.0) == {}


def test_training_metrics_carry_their_step(store: Store, job_id: int) -> None:
    points = [
        MetricPoint(time=50.0 + s, plugin="", name="reward/mean", value=s / 10, step=s) for s in range(20)
    ]
    store.add_metrics(job_id, points)
    raw = store.metrics(job_id)["reward/mean"]
    assert [(p.step, p.value) for p in raw] == [(s, s / 10) for s in range(20)]
    coarse = store.metrics(job_id, names=["reward/mean"], max_points=4)["reward/mean"]
    assert len(coarse) == 4 and coarse[-1].step == 19
    with pytest.raises(ValueError):
        store.metrics(job_id, max_points=1)


def test_latest_value_of_every_series(store: Store, job_id: int) -> None:
    other = store.create_job("other", {})
    store.add_metrics(job_id, _series("solve", "cpu_percent", 10))
    store.add_metrics(
        job_id, [MetricPoint(time=500.0, plugin="solve", name="cpu_percent", value=-1.0)]
    )  # late, older
    store.add_metrics(job_id, [MetricPoint(time=9.0, plugin="", name="loss", value=0.5, step=3)])
    store.add_metrics(other, _series("solve", "instances", 3, value=7.0))
    latest = store.latest_metrics([job_id, other])
    assert [(m.job_id, m.plugin, m.name, m.time, m.value, m.step) for m in latest] == [
        (job_id, "", "loss", 9.0, 0.5, 3),
        (job_id, "solve", "cpu_percent", 1009.0, 9.0, None),
        (other, "solve", "instances", 1002.0, 9.0, None),
    ]
    assert [m.name for m in store.latest_metrics([job_id], plugin="")] == ["loss"]
    assert store.latest_metrics([]) == []
    assert store.metric_names(job_id) == ["loss"]
