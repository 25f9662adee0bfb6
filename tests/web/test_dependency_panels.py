"""The Plugin tab's metrics API has a panel per declared dependency of the plugin (issue 26.6): the
job's ``dependencies:`` and its decorator's, each with its URL, declared budget and charts of its
``dependency/<name>/...`` series over the tab's ranges; none when nothing is declared; a note when
the plugin's network does not go through the relay that measures them."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from plugtune.store import Store
from plugtune.types import MetricPoint
from plugtune.web import create_app
from tests.web.conftest import BASE_URL

JUDGE = {"url": "http://127.0.0.1:8000/v1", "rpm": 60, "concurrency": 4, "timeout_s": None}


def _job(store: Store, spec: dict[str, object], runtime: dict[str, object]) -> int:
    job_id = store.create_job("judged", spec)
    store.upsert_plugin(job_id, "exact", "grader", "plugins/grader.py:exact", code_hash="h", runtime=runtime)
    store.set_plugin_status(job_id, "exact", "running")
    return job_id


def _metrics(store: Store, job_id: int, **params: str) -> dict[str, object]:
    client = TestClient(create_app(store), base_url=BASE_URL)
    answer = client.get(f"/api/jobs/{job_id}/plugins/exact/metrics", params=params)
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def test_each_declared_dependency_has_a_panel_with_its_budget_and_charts(store: Store) -> None:
    runtime = {"network": "policy-only", "dependencies": {"sandbox": "http://10.0.0.2:9000", "judge": "x:1"}}
    job_id = _job(store, {"dependencies": {"judge": JUDGE}}, runtime)
    now = time.time()
    values = {
        "requests_per_s": 2.5,
        "requests": 25.0,
        "latency_p50_ms": 120.0,
        "latency_p99_ms": 900.0,
        "open": 3.0,
        "limit": 2.0,
        "waiting": 1.0,
        "rate_limited_share": 0.25,
        "errors/rate limited": 0.5,
        "errors/server error": 0.0,
    }
    store.add_metrics(
        job_id,
        [MetricPoint(now - 5, "exact", f"dependency/judge/{k}", v) for k, v in values.items()]
        + [MetricPoint(now - 5, "exact", "cpu_percent", 10.0)],
    )
    for range_name in ("life", "1h", "7d"):
        answer = _metrics(store, job_id, range=range_name)
        panels = answer["dependencies"]
        assert isinstance(panels, list)
        # the job's first, then the decorator's under other names (the job's judge wins)
        assert [(p["name"], p["url"], p["rpm"], p["concurrency"]) for p in panels] == [
            ("judge", "http://127.0.0.1:8000/v1", 60, 4),
            ("sandbox", "http://10.0.0.2:9000", None, None),
        ]
        judge = {c["key"]: c for c in panels[0]["charts"]}
        assert list(judge) == [
            "dep:judge:requests",
            "dep:judge:latency",
            "dep:judge:errors",
            "dep:judge:budget",
            "dep:judge:rate_limited",
        ]

        def drawn(key: str, charts: dict[str, dict[str, object]] = judge) -> dict[str, float]:
            return {s["name"]: s["points"][-1][1] for s in charts[key]["series"]}  # type: ignore[attr-defined]

        assert drawn("dep:judge:requests") == {"requests/s": 2.5}
        assert drawn("dep:judge:latency") == {"p50": 120.0, "p99": 900.0}
        assert drawn("dep:judge:errors") == {"rate limited": 0.5, "server error": 0.0}
        assert drawn("dep:judge:budget") == {"open": 3.0, "limit in use (AIMD)": 2.0, "waiting": 1.0}
        assert drawn("dep:judge:rate_limited") == {"429 share": 0.25}
        assert all(not c["series"] for c in panels[1]["charts"])  # the sandbox was never called
        assert panels[0]["summary"] == {
            "peak_requests_per_s": 2.5,
            "rate_limited_share": 0.25,
            "peak_latency_p99_ms": 900.0,
        }
        assert panels[1]["summary"] == {}
        assert panels[0]["note"] == ""
    # the resource charts do not draw the dependency series
    cpu_and_more = {s["name"] for c in answer["charts"] for s in c["series"]}  # type: ignore[attr-defined]
    assert cpu_and_more == {"CPU"}


def test_no_declared_dependency_means_no_panel(store: Store) -> None:
    job_id = _job(store, {}, {"network": "policy-only"})
    assert _metrics(store, job_id)["dependencies"] == []


def test_a_plugin_outside_the_relay_says_its_dependencies_are_not_measured(store: Store) -> None:
    job_id = _job(store, {"dependencies": {"judge": JUDGE}}, {"network": "any"})
    (panel,) = _metrics(store, job_id)["dependencies"]  # type: ignore[misc]
    assert panel["note"].startswith("Not measured: this plugin runs with network: any")


def test_the_429_share_over_a_range_weighs_each_sample_by_its_requests(store: Store) -> None:
    """30 requests (3/s over 10 s) half rate limited, then 10 (1/s over 10 s) and 20 (10/s over 2 s)
    none: 15 of 60 requests were 429s (weighing by rate would say 1.5 of 14); the peak rate is the
    short period's."""
    job_id = _job(store, {"dependencies": {"judge": JUDGE}}, {"network": "policy-only"})
    now = time.time()
    points = [
        (now - 20, 30.0, 3.0, 0.5, 100.0),
        (now - 10, 10.0, 1.0, 0.0, 300.0),
        (now - 8, 20.0, 10.0, 0.0, 5.0),
    ]
    store.add_metrics(
        job_id,
        [
            MetricPoint(at, "exact", f"dependency/judge/{name}", value)
            for at, count, rps, share, p99 in points
            for name, value in (
                ("requests", count),
                ("requests_per_s", rps),
                ("rate_limited_share", share),
                ("latency_p99_ms", p99),
            )
        ],
    )
    (panel,) = _metrics(store, job_id, range="1h")["dependencies"]  # type: ignore[misc]
    assert panel["summary"] == {
        "peak_requests_per_s": 10.0,
        "rate_limited_share": 0.25,
        "peak_latency_p99_ms": 300.0,
    }


def test_a_plugin_on_ray_has_its_dependencies_measured_as_on_the_local_backend(store: Store) -> None:
    """Each Ray actor's meters reach the function's series (tests/runtime/ray/test_budgets.py)."""
    spec = {"dependencies": {"judge": JUDGE}, "plugins": {"runtime_backend": "ray"}}
    job_id = _job(store, spec, {"network": "policy-only"})
    (panel,) = _metrics(store, job_id)["dependencies"]  # type: ignore[misc]
    assert panel["note"] == ""
