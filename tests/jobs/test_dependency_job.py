"""A real job through ``plugtune run`` whose grader calls a declared judge that answers 500: the job
fails as the judge's (Dependency error, owner dependency), is retried automatically once, and says so."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.jobs.caller import waiting_summary
from plugtune.settings import Settings
from plugtune.store import Store
from tests.jobs.jobkit import make_job
from tests.judge_server import JUDGED_GRADER, dead_port, judge

runner = CliRunner()

@pytest.mark.slow
def test_a_judges_500_fails_the_run_as_a_dependency_error_retried_automatically(
    tmp_path: Path, home: Settings
) -> None:
    with judge() as server:
        port = server.server_address[1]
        job_file = make_job(
            tmp_path / "judged",
            grader=JUDGED_GRADER.format(url=f"http://127.0.0.1:{port}/500"),
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
        assert all(a.error is not None and a.error.owner == "dependency" for a in attempts)
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


@pytest.mark.slow
def test_a_judge_that_stays_down_is_waited_for_and_said_then_fails_the_run_as_the_dependencys(
    tmp_path: Path, home: Settings
) -> None:
    """The judge is down for the whole run: once its calls have all failed for down_after_s the job
    says it is waiting for it (a log line, the series `plugtune run`'s bar reads), its calls keep
    retrying with backoff past max_attempts (3: not counted while it is down), and after max_wait_s
    the run fails as the judge's, the series back to 0."""
    dead = dead_port()
    job_file = make_job(
        tmp_path / "down",
        grader=JUDGED_GRADER.format(url=f"http://127.0.0.1:{dead}/ok"),
        hyper={"steps": 1},
        extra={
            "dependencies": {"judge": f"http://127.0.0.1:{dead}"},
            "failure_policy": {
                "dependency": {
                    "max_attempts": 3,
                    "backoff_s": 0.5,
                    "max_backoff_s": 0.5,
                    "down_after_s": 0.5,
                    "max_wait_s": 4,
                }
            },
            "retry": {"max_auto_retries": 0},
        },
    )
    started = time.monotonic()
    result = runner.invoke(app, ["run", str(job_file)])
    took = time.monotonic() - started
    assert result.exit_code == 1, result.output
    assert "Dependency error (dependency): unreachable" in result.output, result.output
    assert took < 90
    store = Store.open(home.database_url)
    try:
        series = store.metrics(1, plugin="", names=["dependency/waiting/judge/unreachable"])
        values = [p.value for p in series.get("dependency/waiting/judge/unreachable", [])]
        assert len(values) == 2 and values[0] > 0 and values[-1] == 0, values  # said, then over
        assert waiting_summary({"dependency/waiting/judge/unreachable": values[0]}).startswith(
            "waiting for dependency judge: unreachable since "
        )
        said = [r.message for r in store.logs(1, text="waiting for dependency judge")]
        assert len(said) == 1 and said[0].startswith("waiting for dependency judge: unreachable since "), said
        assert "max_wait_s=4 s fails the job as the dependency's" in said[0]
        job = store.get_job(1)
        assert job is not None and job.error is not None
        assert (job.error.owner, job.error.cause) == ("dependency", "unreachable")
        failed = store.metrics(1, plugin="", names=["plugin/failed_calls/unreachable"])
        tries = sum(p.value for p in failed.get("plugin/failed_calls/unreachable", []))
        assert tries > 4 * 3, tries  # the 4 grader calls kept trying past max_attempts while it was down
    finally:
        store.close()
