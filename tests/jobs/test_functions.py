"""The functions in use and what killed attempts left (issue 24, item 6): a real job's attempt deploys
real plugins; `plugtune functions` and /api/functions show each one's job, limits and instances
against the quota; once the attempt is killed, the daemon its grader started at import is a
leftover that `plugtune functions --end-stale` ends (and its uid lease with it)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import recover_interrupted
from plugtune.runtime.processes import pids, read_status
from plugtune.runtime.sandbox import LEASES, closed_python_paths, mount_view_problem
from plugtune.settings import Settings
from plugtune.store import Store
from plugtune.web import create_app
from plugtune.web.templating import ts
from tests.jobs.jobkit import make_job
from tests.web.browsing import free_port

runner = CliRunner()
BASE = "http://127.0.0.1:8321"
AS_ROOT = pytest.mark.skipif(
    os.geteuid() != 0 or (bool(closed_python_paths()) and mount_view_problem() is not None),
    reason="a uid per function (and its lease) needs the runtime to run as root",
)

# Forks a daemon at import (double fork + setsid, named TOKEN) that outlives a killed attempt.
DAEMON_GRADER = """
import ctypes, os, signal, time
from plugtune import grader

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        ctypes.CDLL(None).prctl(15, os.environ["TOKEN"].encode()[:15], 0, 0, 0)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(0.2)
    os._exit(0)
os.wait()

@grader
def exact(ctx, sample, trajectory):
    return 1.0
"""


def _named(token: str) -> list[int]:
    """Running processes (not zombies) named ``token``."""
    out = []
    for pid in pids():
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        status = read_status(pid) if comm == token else None
        if status is not None and not status.zombie:
            out.append(pid)
    return out


def _start_attempt(store: Store, root: Path, token: str) -> tuple[int, subprocess.Popen[bytes]]:
    job_file = make_job(
        root,
        grader=DAEMON_GRADER,
        hyper={"steps": 500, "save_every_n_steps": 1000},
        rollout_runtime={"memory_mb": 700, "max_instances": 3},
        extra={"env": {"TOKEN": token}},
    )
    job_id, invalid = create_job(store, job_file)
    assert invalid is None
    store.transition(job_id, "running", "attempt starting")
    proc = subprocess.Popen(
        [sys.executable, "-m", "plugtune.jobs.attempt", str(job_id)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return job_id, proc


def _wait_sampled(store: Store, job_id: int, proc: subprocess.Popen[bytes]) -> None:
    """Until both plugins run and the rollout's instance count was stored (at most ~120 s)."""
    for _ in range(600):
        if proc.poll() is not None:
            attempts = store.list_attempts(job_id)
            raise AssertionError(f"the attempt ended early: {attempts[-1].error if attempts else ''}")
        plugins = store.list_plugins(job_id)
        sampled = {m.plugin for m in store.latest_metrics([job_id]) if m.name == "instances"}
        if len(plugins) == 2 and all(p.status == "running" for p in plugins) and "answer" in sampled:
            return
        time.sleep(0.2)
    raise AssertionError("the job's plugins were never running and sampled")


@AS_ROOT
@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["cli", "console"])
def test_functions_shows_a_running_jobs_functions_and_ends_what_its_killed_attempt_left(
    tmp_path: Path, home: Settings, store: Store, how: str
) -> None:
    token_name = f"ptfn{os.getpid() % 100000}{how[:2]}"
    job_id, proc = _start_attempt(store, tmp_path / "job", token_name)
    try:
        _wait_sampled(store, job_id, proc)
        shown = runner.invoke(app, ["functions", "--json"])
        assert shown.exit_code == 0, shown.output
        view = json.loads(shown.output)
        mine = {f["plugin"]: f for f in view["functions"] if f["job_id"] == job_id}
        assert set(mine) == {"answer", "exact"}
        rollout = mine["answer"]
        assert rollout["status"] == "running" and rollout["attempt"] == 1
        assert rollout["attempt_pid"] == proc.pid and rollout["attempt_alive"] is True
        assert rollout["limits"]["memory_mb"] == 700 and rollout["limits"]["max_instances"] == 3
        assert rollout["instances"] >= 1 and rollout["memory_reserved_mb"] == 700 * rollout["instances"]
        assert view["quota"] == {"max_functions": 32, "max_instances": 64, "total_memory_mb": 16384}
        (use,) = [u for u in view["use"] if u["job_id"] == job_id]
        assert use["functions"] == 2 and use["instances"] >= 1
        text = runner.invoke(app, ["functions"]).output
        assert f"job {job_id} attempt 1: 2 of 32 functions" in text
        assert "answer (rollout) running" in text and "memory_mb 700" in text

        client = TestClient(create_app(store), base_url=BASE)
        api = client.get("/api/functions").json()
        assert {f["plugin"] for f in api["functions"] if f["job_id"] == job_id} == {"answer", "exact"}
        page = client.get("/functions")
        assert page.status_code == 200 and f'href="/jobs/{job_id}/plugins?plugin=answer"' in page.text
        tab = client.get(f"/jobs/{job_id}/plugins?plugin=answer").text
        assert 'memory_mb=700 <span class="muted">(job.yaml)</span>' in tab  # effective, and whence
        assert "cpu=1.0;" in tab and "max_pids=256" in tab  # the decorator's defaults
        assert "kept while it runs, then 7 days after it ends" in tab
        config = client.get(f"/jobs/{job_id}").text
        assert (
            "plugins.rollout.runtime" in config
            and "memory_mb=700, timeout_s=30.0, max_concurrency=8, max_instances=3" in config
        )

        (daemon,) = _named(token_name)
        now = json.loads(runner.invoke(app, ["functions", "--json"]).output)["functions"]
        procs = {f["plugin"]: f["processes"] for f in now if f["job_id"] == job_id}  # as root: per uid
        for plugin in ("answer", "exact"):
            roles = [p["role"] for p in procs[plugin]]
            assert roles.count("zygote") == 1 and "instance" in roles, procs
            assert all(p["rss_mb"] > 1 for p in procs[plugin]), procs
        assert [p["role"] for p in procs["exact"] if p["pid"] == daemon] == ["started by it"]
        assert not [p for p in procs["answer"] if p["pid"] == daemon]
        assert f"pid {daemon} started by it" in runner.invoke(app, ["functions"]).output
        assert f"pid {daemon} started by it" in client.get("/functions").text
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    daemon_uid = read_status(daemon).uid  # type: ignore[union-attr]
    assert (LEASES / str(daemon_uid)).exists()
    unsettled = json.loads(runner.invoke(app, ["functions", "--json"]).output)  # no server looked yet
    assert {f["attempt_alive"] for f in unsettled["functions"] if f["job_id"] == job_id} == {False}
    assert f"job {job_id}: its attempt's process (pid {proc.pid}) is gone" in " ".join(unsettled["notes"])
    recover_interrupted(store, home)  # what the server does: the job ends, its plugins with it
    job = store.get_job(job_id)
    assert job is not None and job.status == "failed"

    listed = runner.invoke(app, ["functions", "--json"])
    view = json.loads(listed.output)
    assert not [f for f in view["functions"] if f["job_id"] == job_id]
    left = [x for x in view["leftovers"] if x["job_id"] == job_id]  # a lease per plugin, its cgroup
    assert {x["kind"] for x in left} >= {"uid lease"}
    assert any(daemon in x["processes"] for x in left)
    assert all(x["holder_pid"] == proc.pid and x["attempt"] == 1 for x in left)
    text = runner.invoke(app, ["functions"]).output
    assert f"uid lease uid {daemon_uid}: job {job_id} (failed) attempt 1" in text
    assert "plugtune functions --end-stale" in text

    rollout = store.get_plugin(job_id, "answer")
    assert rollout is not None and rollout.retention_expires_at is not None
    client = TestClient(create_app(store), base_url=BASE)
    tab = client.get(f"/jobs/{job_id}/plugins?plugin=answer").text
    assert (
        f"its metrics and log lines expire at {ts(rollout.retention_expires_at)} (7 days after it ended"
        in tab
    )
    if how == "cli":
        ended = runner.invoke(app, ["functions", "--end-stale"])
        assert ended.exit_code == 0, ended.output
        assert f"uid {daemon_uid}" in ended.output and "gave back" in ended.output
    else:
        page = client.get("/functions").text
        assert f"uid {daemon_uid}" in page and 'id="end-stale"' in page
        token = re.search(r'name="csrf_token" value="([0-9a-f]{64})"', page)
        assert token is not None
        form = {"content-type": "application/x-www-form-urlencoded", "origin": BASE}
        forged = client.post("/functions/end-stale", headers=form, content=b"csrf_token=" + b"0" * 64)
        assert forged.status_code == 403 and _named(token_name) == [daemon]
        done = client.post(
            "/functions/end-stale", headers=form, content=f"csrf_token={token.group(1)}".encode()
        )
        assert done.status_code == 200 and re.search(r"gave back [1-9]\d* uid\(s\)", done.text)
    assert _named(token_name) == [] and not (LEASES / str(daemon_uid)).exists()
    assert not [x for x in left if x["kind"] == "cgroup" and Path(x["what"]).exists()]
    after = json.loads(runner.invoke(app, ["functions", "--json"]).output)
    assert not [x for x in after["leftovers"] if x["job_id"] == job_id]


@pytest.mark.timeout(300)
def test_serve_options_set_the_quota_and_retention_of_the_jobs_it_runs(
    tmp_path: Path, home: Settings, store: Store
) -> None:
    """`serve --max-functions 1 --retention-days 0.5`: a job of two plugins fails to deploy its second
    with a Create faas fault that says how to raise that quota, and its plugins' monitoring data is
    kept half a day; /api/functions shows the server's quota and retention."""
    import httpx

    job_file = make_job(tmp_path / "job")  # a rollout and a grader: two functions
    port = free_port()
    env = dict(os.environ, PLUGTUNE_HOME=str(home.home), PLUGTUNE_DATABASE_URL=home.database_url)
    out = tmp_path / "serve.out"
    with out.open("wb") as sink:
        serve = subprocess.Popen(
            [sys.executable, "-m", "plugtune.cli", "serve", "--port", str(port), "--max-functions", "1"]
            + ["--retention-days", "0.5"],
            env=env,
            stdout=sink,
            stderr=sink,
        )
    try:
        deadline = time.monotonic() + 60
        while not (home.home / "serve.json").is_file():
            assert serve.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.1)
        view = httpx.get(f"http://127.0.0.1:{port}/api/functions", timeout=30).json()
        assert view["quota"]["max_functions"] == 1 and view["retention_days"] == 0.5
        assert runner.invoke(app, ["submit", str(job_file)]).exit_code == 0
        for _ in range(600):  # at most ~120 s
            job = store.get_job(1)
            if job is not None and job.status == "failed":
                break
            assert serve.poll() is None, out.read_text()
            time.sleep(0.2)
        assert job is not None and job.status == "failed" and job.error is not None, out.read_text()
    finally:
        serve.send_signal(signal.SIGINT)
        serve.wait(timeout=60)
    assert job.error.cause == "Create faas fault"
    assert "quota exceeded: 1 functions are deployed (max_functions=1: raise it with " in job.error.message
    assert "`plugtune serve --max-functions N` or PLUGTUNE_MAX_FUNCTIONS" in job.error.message
    assert "plugtune serve --max-functions N --max-instances N --total-memory-mb N" in job.error.hint
    ended = [p for p in store.list_plugins(1) if p.ended_at is not None]
    assert ended and all(
        p.retention_expires_at is not None and abs(p.retention_expires_at - p.ended_at - 43_200) < 1
        for p in ended
    )


def test_the_plugin_tab_shows_job_yamls_limits_until_the_plugin_is_deployed(
    tmp_path: Path, home: Settings, store: Store
) -> None:
    from plugtune.jobs.plugins import record_waiting
    from plugtune.spec.validation import validate_job

    job_file = make_job(tmp_path / "job", rollout_runtime={"memory_mb": 700})
    job_id, invalid = create_job(store, job_file)
    assert invalid is None
    record_waiting(store, job_id, validate_job(job_file))  # what an attempt does before it deploys
    client = TestClient(create_app(store), base_url=BASE)
    tab = client.get(f"/jobs/{job_id}/plugins?plugin=answer").text
    assert 'memory_mb=700 <span class="muted">(job.yaml)</span>' in tab
    assert "job.yaml's settings; the others are known once it is deployed" in tab
    grader = client.get(f"/jobs/{job_id}/plugins?plugin=exact").text
    assert "known once it is deployed (job.yaml sets none)" in grader
    assert client.get("/api/functions").json()["functions"] == []  # queued: nothing deploys yet
    store.transition(job_id, "running", "attempt starting")
    waiting = {f["plugin"]: f for f in client.get("/api/functions").json()["functions"]}
    assert waiting["answer"]["status"] == "waiting" and waiting["answer"]["limits"] == {}
    assert waiting["answer"]["attempt"] is None and not client.get("/api/functions").json()["notes"]
