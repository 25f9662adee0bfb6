"""A real job through ``plugtune run`` whose grader calls a declared judge that answers 500: the job
fails as the judge's (Dependency error, owner dependency), is retried automatically once, and says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.settings import Settings
from plugtune.store import Store
from tests.jobs.jobkit import make_job
from tests.judge_server import judge

runner = CliRunner()

JUDGED = """
import httpx
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    reply = httpx.post("{url}", json={{"answer": trajectory.completion}}, timeout=5)
    reply.raise_for_status()
    return float(reply.json()["score"])
"""


@pytest.mark.slow
def test_a_judges_500_fails_the_run_as_a_dependency_error_retried_automatically(
    tmp_path: Path, home: Settings
) -> None:
    with judge() as server:
        port = server.server_address[1]
        job_file = make_job(
            tmp_path / "judged",
            grader=JUDGED.format(url=f"http://127.0.0.1:{port}/500"),
            hyper={"steps": 1},
            extra={"dependencies": {"judge": {"url": f"http://127.0.0.1:{port}", "rpm": 60}}},
        )
        result = runner.invoke(app, ["run", str(job_file)])
        requests = server.requests  # type: ignore[attr-defined]
    assert result.exit_code == 1, result.output
    assert "Dependency error (dependency): server error" in result.output, result.output
    shown = json.loads(runner.invoke(app, ["jobs", "show", "1", "--json"]).stdout)
    error = shown["error"]
    assert (error["type"], error["owner"], error["cause"]) == (
        "Dependency error",
        "dependency",
        "server error",
    )
    assert error["message"].startswith(
        f"the dependency judge (127.0.0.1:{port}) answered HTTP 500 (server error) on the request the "
        "plugin made at grader.py:"
    ), error["message"]
    store = Store.open(home.database_url)
    try:
        job = store.get_job(1)
        assert job is not None  # the declaration is stored with the job
        stored = {"url": f"http://127.0.0.1:{port}", "rpm": 60, "concurrency": None, "timeout_s": None}
        assert job.spec["dependencies"] == {"judge": stored}
        attempts = store.list_attempts(1)
        assert [a.status for a in attempts] == ["failed", "failed"]  # retried automatically once
        assert all(a.error is not None and a.error["owner"] == "dependency" for a in attempts)
        failed = store.trajectories(1, status="failed")
        records = store.trajectory_records(1, [t.trajectory_id for t in failed])
        owners = {(e.type, e.owner, e.cause) for t in records for e in t.errors}
        assert ("Dependency error", "dependency", "server error") in owners, owners  # the failed calls
        assert {owner for _, owner, _ in owners} == {"dependency"}, owners  # the rest: 'step stopped' by it
    finally:
        store.close()
    assert requests >= 2  # each attempt really called the judge


FLAKY = """
import httpx
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    # each trajectory's first two requests are answered 429 (Retry-After: 1), the third 200
    reply = httpx.post("{url}/flaky/" + ctx.trajectory_id + "/2", json={{}}, timeout=15)
    reply.raise_for_status()
    return float(reply.json()["score"])
"""


@pytest.mark.slow
def test_a_short_429_storm_is_ridden_out_with_backoff_and_the_breaker_holds(
    tmp_path: Path, home: Settings
) -> None:
    """Every grader call of a real run is rate limited twice before the judge answers: the job
    succeeds with every trajectory scored, its calls waited the judge's Retry-After, and the breaker
    (which trips above half of a step's calls) did not count the 429s."""
    with judge() as server:
        port = server.server_address[1]
        job_file = make_job(
            tmp_path / "storm",
            grader=FLAKY.format(url=f"http://127.0.0.1:{port}"),
            hyper={"steps": 1, "batch_size": 4, "group_size": 2},
            extra={"dependencies": {"judge": {"url": f"http://127.0.0.1:{port}", "concurrency": 4}}},
        )
        result = runner.invoke(app, ["run", str(job_file)])
        log = list(server.log)  # type: ignore[attr-defined]
        peak = server.peak  # type: ignore[attr-defined]
    assert result.exit_code == 0, result.output
    paths = sorted({path for _, path in log})
    assert len(paths) == 8 and len(log) == 24, (paths, len(log))  # 8 trajectories, 3 requests each
    for path in paths:
        times = [t for t, p in log if p == path]
        assert all(b - a >= 1.0 for a, b in zip(times, times[1:], strict=False)), (path, times)
    assert peak <= 4
    store = Store.open(home.database_url)
    try:
        job = store.get_job(1)
        assert job is not None and job.status == "succeeded"
        assert len(store.trajectories(1, status="failed")) == 0
        failed = store.metrics(1, names=["plugin/failed_calls/rate limited"]).get(
            "plugin/failed_calls/rate limited"
        )
        assert failed and sum(p.value for p in failed) == 16, failed
    finally:
        store.close()
