"""Jobs a stopped server left "running" are settled when a scheduler starts (kill -9 of the
server: see tests/chaos/test_kill_chaos.py for the whole path with real processes)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from plugtune.jobs.scheduler import Scheduler
from plugtune.settings import Settings
from plugtune.store import Store

SPEC = {"retry": {"platform_delay_s": 30, "max_auto_retries": 3}}


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _running_job(store: Store) -> int:
    job_id = store.create_job("left-running", SPEC)
    store.transition(job_id, "running", "attempt starting")
    return job_id


def test_a_job_whose_attempt_died_with_its_server_fails_as_internal_and_is_retried(
    store: Store, home: Settings
) -> None:
    job_id = _running_job(store)
    pid = _dead_pid()
    store.start_attempt(job_id, pid, 0)
    scheduler = Scheduler(store, home, poll_s=60)
    scheduler.start()
    scheduler.stop()
    job = store.get_job(job_id)
    assert job is not None and job.status == "failed" and job.error is not None
    assert (job.error.type, job.error.cause) == ("internal error", "supervisor stopped")
    assert f"pid {pid}" in job.error.message
    assert job.next_retry_at is not None and job.auto_retries == 1
    assert [a.status for a in store.list_attempts(job_id)] == ["failed"]


def test_a_job_whose_attempt_finished_after_its_server_died_succeeds(store: Store, home: Settings) -> None:
    job_id = _running_job(store)
    number = store.start_attempt(job_id, _dead_pid(), 0)
    store.end_attempt(job_id, number, "succeeded")
    scheduler = Scheduler(store, home, poll_s=60)
    scheduler.start()
    scheduler.stop()
    assert store.get_job(job_id).status == "succeeded"  # type: ignore[union-attr]


def test_a_job_with_a_live_attempt_process_is_left_to_its_supervisor(store: Store, home: Settings) -> None:
    job_id = _running_job(store)
    env = {"PLUGTUNE_DATABASE_URL": home.database_url}
    sleeper = "import sys, time; time.sleep(30)"
    # Named like an attempt of this job in this store, as `ps` shows it.
    proc = subprocess.Popen(
        [sys.executable, "-c", sleeper, "-m", "plugtune.jobs.attempt", str(job_id)], env=env
    )
    try:
        store.start_attempt(job_id, proc.pid, 0)
        scheduler = Scheduler(store, home, poll_s=60)
        scheduler.start()
        scheduler.stop()
        assert store.get_job(job_id).status == "running"  # type: ignore[union-attr]
        assert [a.status for a in store.list_attempts(job_id)] == ["running"]
    finally:
        proc.kill()
        proc.wait()


def test_a_server_killed_while_it_settles_a_failed_attempt_never_leaves_the_job_failed_without_its_retry(
    store: Store, home: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from plugtune.jobs import scheduler as scheduling

    job_id = _running_job(store)
    store.start_attempt(job_id, _dead_pid(), 0)
    real = scheduling.schedule_retry

    def killed_here(*args: Any, **kwargs: Any) -> float | None:  # the server dies at this write
        monkeypatch.setattr(scheduling, "schedule_retry", real)
        raise SystemExit("kill -9")

    monkeypatch.setattr(scheduling, "schedule_retry", killed_here)
    with pytest.raises(SystemExit):
        scheduling.recover_interrupted(store, home)
    assert store.get_job(job_id).status == "running"  # type: ignore[union-attr]  # not failed yet
    assert scheduling.recover_interrupted(store, home) == [job_id]  # the next server settles it
    job = store.get_job(job_id)
    assert job is not None and job.status == "failed" and job.next_retry_at is not None
    assert (job.error.type, job.error.cause) == ("internal error", "supervisor stopped")  # type: ignore[union-attr]
