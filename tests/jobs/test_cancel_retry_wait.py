"""A job waiting for its automatic retry can always be cancelled: `jobs cancel`, the server's
scheduler, and Ctrl-C in `plugtune run`, each ending cleanly with a clear message."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import Scheduler
from plugtune.settings import Settings
from plugtune.store import Store
from tests.jobs.jobkit import make_job

runner = CliRunner()


def failed_waiting(store: Store, root: Path, *, retry_in_s: float | None = 900.0) -> int:
    """A job whose attempt failed with a platform error; its automatic retry is ``retry_in_s`` away."""
    job_id, invalid = create_job(store, make_job(root))
    assert invalid is None
    store.transition(job_id, "running", "attempt starting")
    store.transition(job_id, "failed", "internal error: attempt died")
    if retry_in_s is not None:
        store.update_job(job_id, next_retry_at=time.time() + retry_in_s, auto_retries=1)
    return job_id


def test_jobs_cancel_cancels_a_job_waiting_for_its_automatic_retry(
    tmp_path: Path, home: Settings, store: Store
) -> None:
    job_id = failed_waiting(store, tmp_path / "job")
    result = runner.invoke(app, ["jobs", "cancel", str(job_id)])
    assert result.exit_code == 0, result.output
    assert f"job {job_id} cancelled" in result.output
    job = store.get_job(job_id)
    assert job is not None and job.status == "cancelled" and job.next_retry_at is None
    assert store.list_transitions(job_id)[-1].reason == "cancelled while waiting for an automatic retry"
    shown = runner.invoke(app, ["jobs", "show", str(job_id)])
    assert "cancelled" in shown.output and "automatic retry" not in shown.output


def test_the_server_scheduler_cancels_a_job_waiting_for_its_automatic_retry(
    tmp_path: Path, home: Settings, store: Store
) -> None:
    job_id = failed_waiting(store, tmp_path / "job")
    Scheduler(store, home).cancel(job_id)
    job = store.get_job(job_id)
    assert job is not None and job.status == "cancelled" and job.next_retry_at is None


def test_a_failed_job_with_no_retry_pending_has_nothing_to_cancel(
    tmp_path: Path, home: Settings, store: Store
) -> None:
    job_id = failed_waiting(store, tmp_path / "job", retry_in_s=None)
    result = runner.invoke(app, ["jobs", "cancel", str(job_id)])
    assert result.exit_code == 2
    assert "no automatic retry is pending" in result.output and "Traceback" not in result.output
    job = store.get_job(job_id)
    assert job is not None and job.status == "failed"


def _run_until_waiting(tmp_path: Path, store: Store) -> tuple[subprocess.Popen[bytes], Path]:
    """`plugtune run` in its own process, its first attempt killed (a platform error): it then
    waits 600 s for the automatic retry."""
    job_file = make_job(tmp_path / "job")
    spec = yaml.safe_load(job_file.read_text())
    spec["retry"] = {"platform_delay_s": 600, "max_auto_retries": 3}
    job_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp_path / "run.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "plugtune.cli", "run", str(job_file)], stdout=sink, stderr=sink
        )
    killed = False
    for _ in range(600):  # at most ~120 s
        job = store.get_job(1)
        attempts = store.list_attempts(1) if job is not None else []
        if not killed and attempts and attempts[-1].pid and attempts[-1].status == "running":
            os.kill(int(attempts[-1].pid), signal.SIGKILL)
            killed = True
        if killed and job is not None and job.status == "failed" and job.next_retry_at is not None:
            return proc, out
        assert proc.poll() is None, out.read_text()
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("the job never reached its automatic-retry wait:\n" + out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c", "jobs cancel"])
def test_plugtune_run_waiting_for_a_retry_ends_cleanly_when_cancelled(
    tmp_path: Path, home: Settings, store: Store, how: str
) -> None:
    proc, out = _run_until_waiting(tmp_path, store)
    try:
        if how == "ctrl-c":
            proc.send_signal(signal.SIGINT)
        else:
            cancelled = runner.invoke(app, ["jobs", "cancel", "1"])
            assert cancelled.exit_code == 0, cancelled.output
        rc = proc.wait(timeout=60)  # not the 600 s the retry was due in
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.read_text()
    assert rc == 1, text
    assert "job 1 cancelled" in text and "plugtune jobs retry 1" in text
    assert "Traceback" not in text and "IllegalTransitionError" not in text
    job = store.get_job(1)
    assert job is not None and job.status == "cancelled" and job.next_retry_at is None
