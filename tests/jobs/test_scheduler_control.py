"""The scheduler's controls: a cancel that arrives while an attempt is being started stops it, and
max_running is checked."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import AttemptRunner, Scheduler
from plugtune.settings import Settings
from plugtune.store import Store
from tests.jobs.jobkit import make_job


def test_a_cancel_before_the_attempt_process_exists_stops_the_attempt(
    tmp_path: Path, home: Settings, store: Store
) -> None:
    job_id, invalid = create_job(store, make_job(tmp_path / "c", hyper={"steps": 50}))
    assert invalid is None
    runner = AttemptRunner(store, home)
    runner.cancel()  # the scheduler's cancel in the moment before Popen: there is no process yet
    store.transition(job_id, "running", "attempt starting")
    started = time.monotonic()
    end = runner.run(job_id)
    assert end.status == "cancelled"  # it used to run all 50 steps and succeed
    assert time.monotonic() - started < 60
    job = store.get_job(job_id)
    assert job is not None and job.steps_done < 50


def test_max_running_must_be_at_least_one(home: Settings, store: Store) -> None:
    with pytest.raises(ValueError, match="max_running must be >= 1, got 0"):
        Scheduler(store, home, max_running=0)
    assert Scheduler(store, home, max_running=3).running() == []
