"""An engine's job in the server's hands: ``plugtune serve`` started during a TRL or verl run
leaves it alone while its process lives, fails it when that process is gone (no retry: the
engine's launcher started it), cancels it without signalling the engine's process (the run
stops itself), and refuses to retry it."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments

from plugtune.integrations import recording
from plugtune.integrations import trl as pt
from plugtune.integrations.recording import EngineRun
from plugtune.jobs.control import NotRetryableError, retry_job
from plugtune.jobs.scheduler import Scheduler, request_cancel
from plugtune.settings import Settings
from plugtune.store import Store
from tests.integrations.conftest import TASK

GRADERS = [f"{TASK}/plugins/grader.py:exact_match"]


def _recover(store: Store, home: Settings) -> None:
    scheduler = Scheduler(store, home, poll_s=60)
    scheduler.start()  # recover_interrupted first
    scheduler.stop()


def test_a_server_started_during_an_engine_run_leaves_it_running_and_it_ends_as_its_engine_says(
    store: Store, home: Settings
) -> None:
    run = EngineRun.open(engine="trl", graders=GRADERS, store=store)
    try:
        _recover(store, home)  # its process (this one) lives
        job = store.get_job(run.job_id)
        assert job is not None and job.status == "running" and job.spec["engine"] == "trl"
        assert job.spec["engine_host"] == socket.gethostname()
    finally:
        run.close()
    assert store.get_job(run.job_id).status == "succeeded"  # type: ignore[union-attr]
    assert [a.status for a in store.list_attempts(run.job_id)] == ["succeeded"]


def _engine_job(store: Store, pid: int, host: str) -> int:
    job_id = store.create_job("a trl run", {"engine": "trl", "engine_host": host, "graders": []})
    store.transition(job_id, "running", "trl run started")
    store.start_attempt(job_id, pid)
    return job_id


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_an_engine_run_whose_process_is_gone_fails_with_that_cause_and_is_not_retried(
    store: Store, home: Settings
) -> None:
    pid = _dead_pid()
    here = _engine_job(store, pid, socket.gethostname())
    elsewhere = _engine_job(store, pid, "another-host")  # nothing here can tell: left alone
    _recover(store, home)
    job = store.get_job(here)
    assert job is not None and job.status == "failed" and job.error is not None
    assert (job.error.type, job.error.owner, job.error.cause) == (
        "unknown error",
        "platform",
        "engine process stopped",
    )
    assert f"pid {pid}" in job.error.message and "trl" in job.error.hint
    assert job.next_retry_at is None and job.auto_retries == 0  # the engine's launcher starts runs
    assert [a.status for a in store.list_attempts(here)] == ["failed"]
    assert store.get_job(elsewhere).status == "running"  # type: ignore[union-attr]
    with pytest.raises(NotRetryableError, match="run that script"):
        retry_job(store, here)
    assert store.get_job(here).status == "failed"  # type: ignore[union-attr]


def test_cancelling_a_trl_run_stops_it_after_its_step_without_a_signal_to_its_process(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recording, "CANCEL_CHECK_S", 0.0)
    run = pt.open_run(GRADERS, store=store)
    callback = run.callback()
    args = TrainingArguments(output_dir=str(store.url).rsplit("/", 1)[0], use_cpu=True, report_to="none")
    control = TrainerControl()
    callback.on_step_end(args, TrainerState(global_step=1), control)
    assert not control.should_training_stop
    # the run's attempt is this test's process: a SIGTERM would end the test here
    request_cancel(store, run.run.job_id)
    callback.on_step_end(args, TrainerState(global_step=2), control)
    assert control.should_training_stop  # TRL ends train() after this step
    callback.on_train_end(args, TrainerState(global_step=2), control)
    job = store.get_job(run.run.job_id)
    assert job is not None and job.status == "cancelled"
    assert [a.status for a in store.list_attempts(run.run.job_id)] == ["cancelled"]
