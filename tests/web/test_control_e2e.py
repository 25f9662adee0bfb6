"""The control plane end to end: a real `plugtune serve --max-running 2` subprocess on a free 127.0.0.1
port; jobs submitted over HTTP (multipart and `plugtune submit --server`) run to the end with the
builtin tiny model, two at once while a third waits with its queue position; the events stream of
the waiting one goes queued → running → succeeded; a running job is cancelled; ended jobs deleted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.jobs.submission import pack
from plugtune.store import Store
from plugtune.store.schema import metadata
from tests.jobs.jobkit import make_job
from tests.web.browsing import free_port

pytestmark = pytest.mark.slow

SLOW_ROLLOUT = """
import time
from plugtune import rollout

@rollout
def answer(ctx, policy, sample):
    time.sleep(0.5)
    policy.chat(sample.messages, max_tokens=2)
    return None
"""
DEADLINE_S = 420.0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    home = tmp_path / "home"
    port = free_port()
    env = dict(os.environ, PLUGTUNE_HOME=str(home), PLUGTUNE_DATABASE_URL=f"sqlite:///{home / 'plugtune.db'}")
    env.pop("PLUGTUNE_API_TOKEN", None)
    serve = subprocess.Popen(
        [sys.executable, "-m", "plugtune.cli", "serve", "--port", str(port), "--max-running", "2"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not (home / "serve.json").is_file():
            assert serve.poll() is None and time.monotonic() < deadline, "plugtune serve did not start"
            time.sleep(0.1)
        yield json.loads((home / "serve.json").read_text())["url"].rstrip("/"), home
    finally:
        serve.send_signal(signal.SIGINT)
        try:
            serve.wait(timeout=60)
        except subprocess.TimeoutExpired:
            serve.kill()


def _submit(base: str, job_file: Path) -> int:
    answer = httpx.post(
        f"{base}/api/jobs",
        data={"spec": job_file.read_text()},
        files={"project": ("p.tar.gz", pack(job_file.parent), "application/gzip")},
        timeout=60,
    )
    assert answer.status_code == 201, answer.text
    return int(answer.json()["job_id"])


def _job(base: str, job_id: int) -> dict[str, Any]:
    answer = httpx.get(f"{base}/api/jobs/{job_id}", timeout=30)
    assert answer.status_code == 200, answer.text
    job: dict[str, Any] = answer.json()["job"]
    return job


def _events(base: str, job_id: int, into: list[tuple[str, dict[str, Any]]]) -> None:
    with httpx.stream("GET", f"{base}/api/jobs/{job_id}/events", timeout=DEADLINE_S) as answer:
        name = ""
        for line in answer.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                into.append((name, json.loads(line.removeprefix("data: "))))


def _rows_of(home: Path, job_id: int) -> dict[str, int]:
    """How many rows each of the store's per-job tables holds for ``job_id``."""
    store = Store.open(f"sqlite:///{home / 'plugtune.db'}", retention_days=7)
    try:
        with store.read_connection() as conn:
            return {
                t.name: int(
                    conn.execute(select(func.count()).select_from(t).where(t.c.job_id == job_id)).scalar_one()
                )
                for t in metadata.sorted_tables
                if "job_id" in t.c
            }
    finally:
        store.close()


def _wait(what: str, check: Any, deadline: float) -> None:
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_submit_run_watch_cancel_and_delete_over_http(server: tuple[str, Path], tmp_path: Path) -> None:
    base, home = server
    deadline = time.monotonic() + DEADLINE_S
    slow = _submit(base, make_job(tmp_path / "slow", rollout=SLOW_ROLLOUT, hyper={"steps": 200}))
    quick_file = make_job(tmp_path / "quick")
    cli = CliRunner().invoke(app, ["submit", "--server", base, str(quick_file)])
    assert cli.exit_code == 0, cli.output
    quick = int(cli.output.split()[1])
    _wait(
        "both to start",
        lambda: _job(base, slow)["status"] != "queued" and _job(base, quick)["status"] != "queued",
        deadline,
    )
    waiting = _submit(base, make_job(tmp_path / "waiting"))
    assert _job(base, waiting)["queue_position"] == 1  # two run, it is next

    events: list[tuple[str, dict[str, Any]]] = []
    watcher = threading.Thread(target=_events, args=(base, waiting, events), daemon=True)
    watcher.start()

    both_running = False

    def quick_done() -> bool:
        nonlocal both_running
        jobs = {j["id"]: j["status"] for j in httpx.get(f"{base}/api/jobs", timeout=30).json()["items"]}
        both_running |= jobs[slow] == "running" and jobs[quick] == "running"
        return jobs[quick] in ("succeeded", "failed", "cancelled")

    _wait("the quick job to end", quick_done, deadline)
    assert both_running, "--max-running 2 never ran two jobs at once"
    assert _job(base, quick)["status"] == "succeeded", _job(base, quick)

    _wait("the slow job to run", lambda: _job(base, slow)["status"] == "running", deadline)
    cancel = httpx.post(f"{base}/api/jobs/{slow}/cancel", timeout=30)
    assert cancel.status_code == 202, cancel.text
    assert cancel.json()["status"] in ("running", "cancelled")
    _wait("the slow job to be cancelled", lambda: _job(base, slow)["status"] == "cancelled", deadline)
    assert httpx.post(f"{base}/api/jobs/{slow}/cancel", timeout=30).status_code == 409

    watcher.join(timeout=max(1.0, deadline - time.monotonic()))
    assert not watcher.is_alive(), "the events stream did not end"
    statuses = [data["status"] for name, data in events if name == "job"]
    assert statuses[0] == "queued" and events[0][1]["queue_position"] == 1, events[:3]
    assert "running" in statuses and statuses[-1] == "succeeded", statuses
    assert events[-1][0] == "end" and events[-1][1]["status"] == "succeeded"
    steps = [data["steps_done"] for name, data in events if name == "job"]
    assert steps == sorted(steps) and steps[-1] == 2

    files = home / "jobs" / str(quick)
    assert files.is_dir()
    assert _rows_of(home, quick)["trajectories"] > 0 and _rows_of(home, quick)["log_lines"] > 0
    assert httpx.delete(f"{base}/api/jobs/{quick}", timeout=30).status_code == 204
    assert not files.exists() and httpx.get(f"{base}/api/jobs/{quick}", timeout=30).status_code == 404
    assert set(_rows_of(home, quick).values()) == {0}, _rows_of(home, quick)
    assert _rows_of(home, waiting)["trajectories"] > 0  # the other jobs keep theirs
    listed = httpx.get(f"{base}/api/jobs", timeout=30).json()
    assert quick not in [j["id"] for j in listed["items"]] and listed["total"] == 2
