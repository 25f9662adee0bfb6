"""Real jobs through ``plugtune run`` against a judge in each way a service fails (issue 26.7): a
hang, a malformed reply and an unknown host are each classified exactly, owner ``dependency``; an
outage that ends within ``max_wait_s`` is ridden out; and a chaos run against a judge that fails a
share of its requests at random loses no trajectory and misclassifies no failure."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.settings import Settings
from plugtune.store import Store
from tests.jobs.jobkit import make_job
from tests.judge_server import judge

pytestmark = pytest.mark.slow
runner = CliRunner()

#: Asks the judge at ``{url}`` with a 1 s client timeout (a 2 s answer is the client's timeout).
QUICK_GRADER = """
import httpx
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    reply = httpx.post("{url}", json={{"answer": trajectory.completion}}, timeout=1)
    reply.raise_for_status()
    return float(reply.json()["score"])
"""

FEW_TRIES = {"max_attempts": 2, "backoff_s": 0.2, "max_backoff_s": 0.2, "down_after_s": 60, "max_wait_s": 10}


@pytest.mark.parametrize(
    ("path", "host", "cause", "said"),
    [
        ("wait/5", "127.0.0.1", "timeout", "did not answer in time (timeout: the client's own)"),
        ("malformed", "127.0.0.1", "bad reply", "(bad reply)"),
        ("ok", "judge.invalid", "unreachable", "could not be reached (unreachable)"),
    ],
)
def test_each_way_a_judge_fails_is_the_dependencys_with_its_exact_cause(
    tmp_path: Path, home: Settings, path: str, host: str, cause: str, said: str
) -> None:
    with judge() as server:
        port = server.server_address[1]
        job_file = make_job(
            tmp_path / "judged",
            grader=QUICK_GRADER.format(url=f"http://{host}:{port}/{path}"),
            hyper={"steps": 1},
            extra={
                "dependencies": {"judge": f"http://{host}:{port}"},
                "failure_policy": {"dependency": FEW_TRIES},
                "retry": {"max_auto_retries": 0},
            },
        )
        result = runner.invoke(app, ["run", str(job_file)])
    assert result.exit_code == 1, result.output
    assert f"Dependency error (dependency): {cause}" in result.output, result.output
    error = json.loads(runner.invoke(app, ["jobs", "show", "1", "--json"]).stdout)["error"]
    assert (error["type"], error["owner"], error["cause"]) == ("Dependency error", "dependency", cause)
    assert f"the dependency judge ({host}:{port})" in error["message"] and said in error["message"], error
    store = Store.open(home.database_url)
    try:
        scored = [t for t in store.trajectories(1) if t.reward is not None]
        assert scored == []  # nothing scored from a call that failed
    finally:
        store.close()


def test_an_outage_that_ends_within_max_wait_s_is_ridden_out(tmp_path: Path, home: Settings) -> None:
    """The judge is down when the job starts (its address resets every connection) and comes up 4 s
    after the first: the job waits (it says so), then every trajectory is scored and the job
    succeeds on its first attempt."""
    down = socket.create_server(("127.0.0.1", 0))
    port = down.getsockname()[1]
    up, done = threading.Event(), threading.Event()

    def resets_then_comes_up() -> None:
        """Down: every connection is reset; 4 s after the first one, the judge answers there."""
        down.settimeout(120)
        first = None
        while first is None or time.monotonic() - first < 4.0:
            down.settimeout(0.2 if first else 120)
            try:
                conn, _ = down.accept()
            except TimeoutError:
                continue
            first = first or time.monotonic()
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()  # a reset
        down.close()
        with judge(port):
            up.set()
            done.wait(120)

    thread = threading.Thread(target=resets_then_comes_up, daemon=True)
    thread.start()
    job_file = make_job(
        tmp_path / "outage",
        grader=QUICK_GRADER.format(url=f"http://127.0.0.1:{port}/ok"),
        hyper={"steps": 1},
        extra={
            "dependencies": {"judge": f"http://127.0.0.1:{port}"},
            # tries are counted only until the judge is down (every call failing for down_after_s):
            # enough of them that the jittered backoff cannot use them up before that (with 3 it did,
            # once in a full run: 3 tries in under a second)
            "failure_policy": {
                "dependency": {
                    "max_attempts": 10,
                    "backoff_s": 0.5,
                    "max_backoff_s": 1,
                    "down_after_s": 1,
                    "max_wait_s": 60,
                }
            },
            "retry": {"max_auto_retries": 0},
        },
    )
    try:
        result = runner.invoke(app, ["run", str(job_file)])
    finally:
        done.set()
        thread.join(10)
    assert up.is_set()
    assert result.exit_code == 0, result.output
    store = Store.open(home.database_url)
    try:
        job = store.get_job(1)
        assert job is not None and job.status == "succeeded"
        assert len(store.list_attempts(1)) == 1
        trajectories = store.trajectories(1)
        assert len(trajectories) == 4 and all(t.reward == pytest.approx(0.75) for t in trajectories)
        said = [r.message for r in store.logs(1, text="waiting for dependency judge")]
        assert said and said[0].startswith("waiting for dependency judge: unreachable since "), said
    finally:
        store.close()


def test_a_chaos_run_against_a_flaky_judge_loses_nothing_and_misclassifies_nothing(
    tmp_path: Path, home: Settings
) -> None:
    """20% of the judge's answers are a 429, a 500, a malformed 200 or too late (seeded): each such
    answer is one failed call counted under its own cause, owner dependency, retried until it
    succeeds; every trajectory of the 3 steps is scored from a successful call."""
    with judge(seed=7) as server:
        port = server.server_address[1]
        job_file = make_job(
            tmp_path / "chaos",
            grader=QUICK_GRADER.format(url=f"http://127.0.0.1:{port}/chaos/20"),
            hyper={"steps": 3, "batch_size": 4, "group_size": 2},
            extra={
                "dependencies": {"judge": f"http://127.0.0.1:{port}"},
                "failure_policy": {
                    "dependency": {
                        "max_attempts": 10,
                        "backoff_s": 0.1,
                        "max_backoff_s": 0.5,
                        "max_wait_s": 60,
                    }
                },
                "retry": {"max_auto_retries": 0},
            },
        )
        result = runner.invoke(app, ["run", str(job_file)])
        served: dict[str, Any] = dict(server.chaos)  # type: ignore[attr-defined]
    assert result.exit_code == 0, result.output
    faults = {"429": "rate limited", "500": "server error", "malformed": "bad reply", "slow": "timeout"}
    assert sum(served.get(k, 0) for k in faults) >= 3, served  # the run really met faults
    store = Store.open(home.database_url)
    try:
        names = [n for n in store.metric_names(1, plugin="") if n.startswith("plugin/failed_calls/")]
        series = store.metrics(1, plugin="", names=names)
        counted = {name.rsplit("/", 1)[1]: sum(p.value for p in points) for name, points in series.items()}
        # every fault once, under its own cause, and no other cause (an answer the load made later
        # than the client's 1 s is a timeout too, the judge's: counted at least once per late answer)
        assert set(counted) <= set(faults.values()), counted
        for kind, cause in faults.items():
            if kind == "slow":
                assert counted.get(cause, 0) >= served.get(kind, 0), (counted, served)
            else:
                assert counted.get(cause, 0) == served.get(kind, 0), (counted, served)
        trajectories = store.trajectories(1)
        assert len(trajectories) == 3 * 4 * 2  # none lost
        assert all(t.status != "failed" and t.reward == pytest.approx(0.75) for t in trajectories)
    finally:
        store.close()
