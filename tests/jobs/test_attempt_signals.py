"""A SIGTERM of a job's attempt is the user's cancel only when the user asked for one (the control
plane records the request in the store before it signals); any other SIGTERM is a platform error
that is retried automatically. Real attempt processes, real signals."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import request_cancel, run_job
from plugtune.settings import Settings
from plugtune.store import Store
from tests.jobs.jobkit import make_job

pytestmark = pytest.mark.slow


def _once_running(store: Store, act: Callable[[int, int], None]) -> Callable[[int], None]:
    """A ``progress`` hook that calls ``act(job_id, pid)`` once, when the attempt has done a step."""
    done: list[int] = []

    def progress(job_id: int) -> None:
        job = store.get_job(job_id)
        attempts = store.list_attempts(job_id)
        if done or job is None or job.steps_done < 1 or not attempts:
            return
        last = attempts[-1]
        if last.status == "running" and last.pid:
            done.append(last.pid)
            act(job_id, last.pid)

    return progress


def test_a_sigterm_from_outside_is_an_internal_error_retried_automatically(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    job_file = make_job(tmp_path / "t", hyper={"steps": 40})
    job_id, _ = create_job(store, job_file)
    kill = _once_running(store, lambda _job, pid: os.kill(pid, signal.SIGTERM))
    status = run_job(store, home, job_id, progress=kill, wait_for_retries=False)
    assert status == "failed"
    job = store.get_job(job_id)
    assert job is not None and job.error is not None
    assert (job.error.type, job.error.owner, job.error.cause) == (
        "internal error",
        "platform",
        "attempt terminated",
    )
    assert "no one cancelled the job" in job.error.message
    assert job.next_retry_at is not None and job.auto_retries == 1  # the retry policy's retry
    attempt = store.list_attempts(job_id)[-1]
    assert attempt.status == "failed" and attempt.error is not None
    assert attempt.error.cause == "attempt terminated"
    assert store.list_transitions(job_id)[-1].to_status == "failed"
    # the stopped step's trajectories name the platform error, not a cancel
    reasons = [t.discard_reason for t in store.trajectories(job_id, limit=1000)]
    assert not any("the job was cancelled" in r for r in reasons)


def test_a_cancel_the_user_asked_for_still_ends_cancelled(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    job_id, _ = create_job(store, make_job(tmp_path / "c", hyper={"steps": 40}))
    cancel = _once_running(store, lambda jid, _pid: request_cancel(store, jid))  # `jobs cancel`, the API
    status = run_job(store, home, job_id, progress=cancel)
    assert status == "cancelled"
    job = store.get_job(job_id)
    assert job is not None and job.error is None and job.next_retry_at is None and job.auto_retries == 0
    assert store.list_attempts(job_id)[-1].status == "cancelled"
    assert store.list_transitions(job_id)[-1].reason == "cancelled by the user"


def test_a_cancel_request_of_an_earlier_run_does_not_make_a_later_sigterm_a_cancel(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    job_id, _ = create_job(store, make_job(tmp_path / "r", hyper={"steps": 40}))
    store.request_cancel(job_id, "cancelled by the user")  # left from an earlier run
    kill = _once_running(store, lambda _job, pid: os.kill(pid, signal.SIGTERM))
    status = run_job(store, home, job_id, progress=kill, wait_for_retries=False)
    assert status == "failed"
    job = store.get_job(job_id)
    assert job is not None and job.error is not None and job.error.cause == "attempt terminated"
