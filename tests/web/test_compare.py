"""The jobs list's search and pagination, and the compare view (GET /api/compare, /compare), over a
real store filled through its API."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import run_job
from plugtune.settings import Settings
from plugtune.store import Store
from plugtune.types import ErrorRecord, MetricPoint
from plugtune.web import create_app
from plugtune.web.pages import JOBS_PER_PAGE
from tests.jobs.jobkit import make_job
from tests.web.conftest import BASE_URL
from tests.web.seed import Seeded

JSON = {"Accept": "application/json"}


def _rows(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr data-job="(\d+)"', html)]


def _failed(store: Store, name: str, error_type: str, cause: str, spec: dict | None = None) -> int:
    job = store.create_job(name, spec or {"model": "tiny"})
    store.transition(job, "validating")
    error = {"type": error_type, "owner": "data", "cause": cause, "message": "m", "hint": "h"}
    store.set_job_error(job, ErrorRecord.from_dict(error))
    store.transition(job, "failed")
    return job


def test_search_by_name_is_a_substring_in_any_case_and_wildcards_are_literal(
    client: TestClient, store: Store, seeded: Seeded
) -> None:
    literal = store.create_job("lr_100%", {"model": "tiny"})
    store.create_job("lrx100x", {"model": "tiny"})
    page = client.get("/jobs", params={"q": "ADDER"})
    assert page.status_code == 200
    assert _rows(page.text) == [seeded.failed_job]
    assert 'value="ADDER"' in page.text  # the search box keeps what was asked
    assert "page 1 of 1 · 1 job found" in page.text
    assert _rows(client.get("/jobs", params={"q": "r_100%"}).text) == [literal]  # not LIKE patterns
    assert "No jobs match this search" in client.get("/jobs", params={"q": "nothing-like-it"}).text


def test_status_and_cause_filters_combine_with_the_search(
    client: TestClient, store: Store, seeded: Seeded
) -> None:
    invalid = _failed(store, "adder-bad-yaml", "Invalid value", "")
    assert _rows(client.get("/jobs", params={"cause": "500"}).text) == [seeded.failed_job]
    # a job whose error has no cause is found by its error type
    assert _rows(client.get("/jobs", params={"cause": "Invalid value"}).text) == [invalid]
    assert _rows(client.get("/jobs", params={"q": "adder", "status": "failed"}).text) == [
        invalid,
        seeded.failed_job,
    ]
    assert _rows(client.get("/jobs", params={"q": "adder", "status": "running"}).text) == []
    menu = client.get("/jobs").text
    assert '<option value="500" >500 (Call plugin error)</option>' in menu
    assert '<option value="Invalid value" >Invalid value</option>' in menu
    bad = client.get("/jobs", params={"status": "sleeping"})
    assert bad.status_code == 400 and "status must be one of" in bad.text


def test_pages_move_through_the_search_and_keep_it_in_their_links(
    client: TestClient, store: Store, seeded: Seeded
) -> None:
    made = [store.create_job(f"sweep-{i:03d}", {"model": "tiny"}) for i in range(JOBS_PER_PAGE + 5)]
    first = client.get("/jobs", params={"q": "sweep"})
    assert _rows(first.text) == made[::-1][:JOBS_PER_PAGE]
    assert f"page 1 of 2 · {JOBS_PER_PAGE + 5} jobs found" in first.text
    assert 'href="?q=sweep&amp;page=2" rel="next"' in first.text
    second = client.get("/jobs", params={"q": "sweep", "page": "2"})
    assert _rows(second.text) == made[::-1][JOBS_PER_PAGE:]
    assert 'href="?q=sweep&amp;page=1" rel="prev"' in second.text and 'rel="next"' not in second.text
    everything = client.get("/jobs", params={"page": "2"})
    assert f"page 2 of 2 · {JOBS_PER_PAGE + 5 + 4} jobs" in everything.text


def test_compare_overlays_curves_shares_causes_times_steps_and_diffs_the_specs(
    client: TestClient, store: Store, seeded: Seeded
) -> None:
    spec = {
        "model": "tiny",
        "hyperparameters": {"lr": 1e-5, "group_size": 4},
        "plugins": {"graders": [{"entry": "g.py:exact", "weight": 1.0}]},
        "job_file": "/a/job.yaml",
    }
    other = {**spec, "hyperparameters": {"lr": 3e-5, "group_size": 4}, "job_file": "/b/job.yaml"}
    other["plugins"] = {"graders": [{"entry": "g.py:exact", "weight": 0.5}]}
    a, b = store.create_job("lr-1e-5", spec), store.create_job("lr-3e-5", other)
    for step, seconds in ((1, 1.0), (2, 2.0), (3, 9.0)):
        store.add_metrics(a, [MetricPoint(100.0 + step, "", "time/step_s", seconds, step=step)])
        store.add_metrics(a, [MetricPoint(100.0 + step, "", "reward/mean", step / 4, step=step)])
    store.add_metrics(a, [MetricPoint(200.0, "", "reward/mean", 0.9, step=2)])  # step 2 re-run by a retry
    store.add_metrics(b, [MetricPoint(101.0, "", "groups/zero_variance_share", 0.75, step=1)])
    store.add_metrics(b, [MetricPoint(101.0, "", "plugin/failed_calls/Timeout", 3.0, step=1)])
    store.add_metrics(b, [MetricPoint(101.0, "", "plugin/failed_calls/500", 1.0, step=1)])
    store.add_metrics(b, [MetricPoint(102.0, "", "plugin/failed_calls/Timeout", 0.0, step=2)])

    answer = client.get("/api/compare", params={"ids": f"{a},{b}"}, headers=JSON)
    assert answer.status_code == 200, answer.text
    out = answer.json()
    assert [j["label"] for j in out["jobs"]] == [f"#{a} lr-1e-5", f"#{b} lr-3e-5"]
    reward = next(c for c in out["charts"] if c["key"] == "reward")
    assert reward["series"] == [{"name": f"#{a} lr-1e-5", "points": [[1, 0.25], [2, 0.9], [3, 0.75]]}]
    no_gradient = next(c for c in out["charts"] if c["key"] == "no_gradient")  # the signal's health too
    assert no_gradient["series"] == [{"name": f"#{b} lr-3e-5", "points": [[1, 0.75]]}]
    assert {c["key"] for c in out["charts"]} == {
        "reward",
        "loss",
        "kl",
        "response_length",
        "no_gradient",
        "truncated",
    }
    assert out["step_times"][0] == {"job_id": a, "steps": 3, "mean_s": 4.0, "median_s": 2.0}
    assert out["step_times"][1] == {"job_id": b, "steps": 0, "mean_s": None, "median_s": None}
    assert out["causes"][1] == {
        "job_id": b,
        "failed_calls": 4.0,
        "causes": [
            {"cause": "Timeout", "calls": 3.0, "share": 0.75},
            {"cause": "500", "calls": 1.0, "share": 0.25},
        ],
    }
    assert out["causes"][0] == {"job_id": a, "failed_calls": 0.0, "causes": []}
    assert out["config_diff"] == [
        {"key": "hyperparameters.lr", "values": ["1e-05", "3e-05"]},
        {"key": "plugins.graders[0].weight", "values": ["1.0", "0.5"]},
    ]
    assert out["same_keys"] == 3  # model, group_size, the grader's entry; job_file is not compared

    page = client.get("/compare", params={"ids": f"{a},{b}"})
    assert page.status_code == 200
    assert 'data-key="hyperparameters.lr"' in page.text and "3e-05" in page.text
    assert "Timeout: 75.0%" in page.text and 'data-ids="' + f"{a},{b}" + '"' in page.text


def test_compare_of_a_missing_key_says_not_set(client: TestClient, store: Store, seeded: Seeded) -> None:
    out = client.get("/api/compare", params={"ids": f"{seeded.failed_job},{seeded.done_job}"}).json()
    assert {"key": "steps", "values": ["10", None]} in out["config_diff"]
    page = client.get("/compare", params={"ids": f"{seeded.failed_job},{seeded.done_job}"}).text
    assert "not set" in page


@pytest.mark.parametrize(
    ("ids", "status", "says"),
    [
        ("1", 400, "compare needs 2 to 5 different jobs, got 1 job"),
        ("1,1", 400, "got 1 job"),
        ("", 400, "got 0 jobs"),
        ("1,2,3,4,5,6", 400, "got 6 jobs"),
        (",".join(["1"] * 60), 400, "got 60 ids"),
        ("1,x", 400, "'x' is not a job id"),
        ("1,-2", 400, "'-2' is not a job id"),
        ("1,99999999999999999999", 400, "is not a job id"),
        ("1,\u00b2", 400, "is not a job id"),  # a digit to str.isdigit, not to int()
        ("1,\u0663", 400, "is not a job id"),  # an Arabic-Indic 3
        ("1,998,999", 404, "no job has id 998, 999"),
    ],
)
def test_compare_refuses_what_it_cannot_compare_with_a_clear_message(
    client: TestClient, ids: str, status: int, says: str
) -> None:
    api = client.get("/api/compare", params={"ids": ids}, headers=JSON)
    assert api.status_code == status and says in api.json()["detail"], api.text
    page = client.get("/compare", params={"ids": ids})
    assert page.status_code == status and says in html.unescape(page.text)
    assert "Back to the jobs" in page.text


def test_the_jobs_list_offers_compare_and_the_api_serves_it_in_openapi(client: TestClient) -> None:
    page = client.get("/jobs").text
    assert 'id="compare-form"' in page and 'action="/compare"' in page and 'data-max="5"' in page
    assert page.count('class="pick"') == 4
    assert "/api/compare" in client.get("/openapi.json").json()["paths"]


@pytest.mark.slow
def test_two_real_tiny_jobs_compare_by_what_their_trainer_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("PLUGTUNE_HOME", str(state))
    monkeypatch.setenv("PLUGTUNE_DATABASE_URL", f"sqlite:///{state / 'plugtune.db'}")
    settings = Settings.from_env()
    real = Store.open(settings.database_url)
    try:
        ids = []
        for name, lr in (("tiny-lr-a", 1e-3), ("tiny-lr-b", 5e-3)):
            job_file = make_job(tmp_path / name, hyper={"learning_rate": lr})
            job_id, invalid = create_job(real, job_file)
            assert invalid is None, invalid
            assert run_job(real, settings, job_id) == "succeeded"
            ids.append(job_id)
        client = TestClient(create_app(real), base_url=BASE_URL)
        out = client.get("/api/compare", params={"ids": f"{ids[0]},{ids[1]}"}).json()
    finally:
        real.close()
    for chart in out["charts"]:  # the trainer's metric names are the ones compare reads
        assert [s["name"] for s in chart["series"]] == [f"#{ids[0]} tiny-lr-a", f"#{ids[1]} tiny-lr-b"], chart
        assert all([p[0] for p in s["points"]] == [1.0, 2.0] for s in chart["series"]), chart
    for timing in out["step_times"]:
        assert timing["steps"] == 2 and timing["mean_s"] > 0 and timing["median_s"] > 0
    diff = {row["key"]: row["values"] for row in out["config_diff"]}
    assert diff["hyperparameters.learning_rate"] == ["0.001", "0.005"]
    assert "plugins.rollout.entry" not in diff and "model" not in diff
    assert not [key for key in diff if key.startswith("submitted")], diff  # their projects' paths
    assert [c["failed_calls"] for c in out["causes"]] == [0.0, 0.0]
