"""kill -9 mid-job, repeated at random (seeded) steps: of the attempt process, and of ``plugtune
serve`` itself. The job resumes each time and ends with every step's trajectories stored exactly
once, none missing, and no process of a killed attempt left behind.

Bounded here (1 kill of an attempt, 2 of the server); ``make chaos`` kills 8 and 5 times.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import run_job
from plugtune.settings import Settings
from plugtune.store import Store
from tests.jobs.jobkit import ROLLOUT, make_job

LONG = os.environ.get("PLUGTUNE_CHAOS") == "long"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600 if LONG else 600)]
SEED = int(os.environ.get("PLUGTUNE_CHAOS_SEED", "12"))
PER_STEP = 4  # batch_size 2 x group_size 2
WAIT_S = 120.0  # a bound for each wait: a resume and a few steps on a busy 2-core machine


# Steps of at least 0.4 s: the scheduler's progress polls (every 0.5 s) see an attempt reach its
# kill step before it has finished the job.
SLOW_ROLLOUT = ROLLOUT.replace(
    "    reply = policy.chat(", "    import time\n\n    time.sleep(0.4)\n    reply = policy.chat("
)


def kill_steps(rng: random.Random, steps: int, kills: int) -> list[int]:
    """``kills`` distinct steps in 1..steps-1 after which to kill, ascending."""
    return sorted(rng.sample(range(1, steps), kills))


def assert_each_step_stored_once(store: Store, job_id: int, steps: int) -> str:
    """Every step 1..steps holds PER_STEP trajectories, each id once; returns the figures."""
    counts = {}
    for step in range(1, steps + 1):
        records = store.trajectories(job_id, step=step, limit=10 * PER_STEP)
        ids = [r.trajectory_id for r in records]
        counts[step] = len(ids)
        assert len(set(ids)) == len(ids), f"step {step}: trajectory ids stored twice: {sorted(ids)}"
    total = store.count_trajectories(job_id)
    figures = f"trajectories per step {counts}, {total} in all"
    assert set(counts.values()) == {PER_STEP}, figures
    assert total == steps * PER_STEP, figures
    return figures


def job_processes(root: Path) -> list[str]:
    """Live processes of this test's jobs: attempts (PLUGTUNE_HOME under ``root``), their runtime's
    zygotes and instances (their code folder is under ``root``)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(proc.info["cmdline"] or [])
            if str(root) in cmdline or str(root) in proc.environ().get("PLUGTUNE_HOME", ""):
                found.append(f"{proc.pid} {cmdline[:120]}")
        except psutil.Error:
            continue
    return found


def assert_no_job_processes(root: Path, within_s: float = 15.0) -> None:
    deadline = time.monotonic() + within_s
    while (left := job_processes(root)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes of killed attempts outlived them: {left}"


def wait_until(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout_s:.0f} s waiting for: {what}")
        time.sleep(0.2)


def test_attempts_killed_at_random_steps_resume_and_store_each_step_once(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    steps, kills = (24, 8) if LONG else (6, 1)
    rng = random.Random(SEED)
    job_file = make_job(
        tmp_path / "k",
        rollout=SLOW_ROLLOUT,
        hyper={"steps": steps},
        extra={"retry": {"platform_delay_s": 0.2, "max_auto_retries": kills + 1}},
    )
    job_id, _ = create_job(store, job_file)
    killed: list[tuple[int, int]] = []  # (pid, step)
    targets: dict[int, int] = {}  # attempt pid -> the step after which it is killed

    def kill_at_random_step(jid: int) -> None:
        job, attempts = store.get_job(jid), store.list_attempts(jid)
        if job is None or not attempts or attempts[-1].status != "running" or not attempts[-1].pid:
            return
        pid, resumed = int(attempts[-1].pid), attempts[-1].resumed_from_step
        target = targets.setdefault(pid, resumed + rng.randint(1, 2))
        if len(killed) < kills and job.steps_done >= target and target < steps:
            killed.append((pid, job.steps_done))
            os.kill(pid, signal.SIGKILL)

    started = time.monotonic()
    status = run_job(store, home, job_id, progress=kill_at_random_step)
    elapsed = time.monotonic() - started
    attempts = store.list_attempts(job_id)
    summary = (
        f"kill -9 of attempts after steps {[s for _, s in killed]}: {status} in "
        f"{elapsed:.0f} s, {len(attempts)} attempts resumed from {[a.resumed_from_step for a in attempts]}"
    )
    print(summary)
    assert status == "succeeded", summary
    assert len(killed) == kills and len(attempts) == kills + 1, summary
    assert [a.error.type for a in attempts[:-1] if a.error] == ["internal error"] * kills, summary
    assert all(a.resumed_from_step >= s for a, (_, s) in zip(attempts[1:], killed, strict=True)), summary
    print(assert_each_step_stored_once(store, job_id, steps))
    assert_no_job_processes(tmp_path)


def has_ended(store: Store, job_id: int) -> bool:
    job = store.get_job(job_id)
    return job is not None and (job.status == "succeeded" or job.status == "failed" and not job.next_retry_at)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(home: Settings, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PLUGTUNE_HOME=str(home.home), PLUGTUNE_DATABASE_URL=home.database_url)
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "plugtune.cli", "serve", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def test_the_server_killed_mid_job_at_random_steps_resumes_it_and_stores_each_step_once(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    steps, kills = (12, 5) if LONG else (6, 2)
    rng = random.Random(SEED + 1)
    at = kill_steps(rng, steps, kills)
    retry = {"platform_delay_s": 0.2, "max_auto_retries": kills + 1}
    job_file = make_job(tmp_path / "s", hyper={"steps": steps}, extra={"retry": retry})
    job_id, _ = create_job(store, job_file)
    log, port = tmp_path / "serve.log", _free_port()
    server = _serve(home, port, log)
    killed: list[int] = []
    try:
        for step in at:
            wait_until(
                f"job {job_id} to pass step {step} (serve log {log})",
                lambda s=step: (store.get_job(job_id).steps_done or 0) >= s,  # type: ignore[union-attr,misc]
                WAIT_S,
            )
            server.kill()
            server.wait(10)
            killed.append(store.get_job(job_id).steps_done)  # type: ignore[union-attr]
            server = _serve(home, port, log)
        wait_until(
            f"job {job_id} to succeed after the server was killed after steps {killed} (serve log {log})",
            lambda: has_ended(store, job_id),
            WAIT_S,
        )
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
    job = store.get_job(job_id)
    assert job is not None
    attempts = store.list_attempts(job_id)
    summary = (
        f"kill -9 of plugtune serve after steps {killed}: {job.status}, attempts "
        f"{[(a.status, a.resumed_from_step) for a in attempts]}"
    )
    print(summary)
    assert job.status == "succeeded", f"{summary}\n{job.error}\n{log.read_text()[-3000:]}"
    print(assert_each_step_stored_once(store, job_id, steps))
    assert_no_job_processes(tmp_path)
