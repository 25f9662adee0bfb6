"""Automatic retries, the support bundle, the circuit breaker and the server's scheduler, for real."""

from __future__ import annotations

import os
import signal
import time
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.jobs.control import create_job, delete_job, retry_job
from plugtune.jobs.scheduler import Scheduler, run_job
from plugtune.settings import Settings
from plugtune.store import Store
from tests.jobs.jobkit import make_job

pytestmark = pytest.mark.slow


SLOW_GRADER = """
import time
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    time.sleep(0.3)
    return 1.0 if trajectory.completion.strip() == sample.extra["answer"] else 0.0
"""


def _kill_running_attempt(store: Store, sig: int, after_steps: int = 1) -> object:
    killed: set[int] = set()

    def progress(jid: int) -> None:
        job = store.get_job(jid)
        attempts = store.list_attempts(jid)
        if job is None or not attempts or attempts[-1].status != "running" or not attempts[-1].pid:
            return
        pid = attempts[-1].pid
        if pid not in killed and job.steps_done >= after_steps:
            killed.add(pid)
            os.kill(pid, sig)

    return progress


def test_after_the_last_automatic_retry_a_support_bundle_is_written(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    job_id, _ = create_job(store, make_job(tmp_path / "b", hyper={"steps": 30}))
    status = run_job(store, home, job_id, progress=_kill_running_attempt(store, signal.SIGKILL))  # type: ignore[arg-type]
    assert status == "failed"
    job = store.get_job(job_id)
    assert job is not None and job.error is not None
    assert job.error.type == "internal error" and job.auto_retries == 1
    assert len(store.list_attempts(job_id)) == 2
    bundle = Path(job.error.evidence["support_bundle"])
    assert str(bundle) in job.error.message
    names = zipfile.ZipFile(bundle).namelist()
    assert {"job.json", "error.json", "attempts.json", "logs.jsonl", "environment.json"} <= set(names)
    assert any(n.startswith("code/") and n.endswith("rollout.py") for n in names)


@pytest.mark.parametrize("launched", ["foreground", "in the background"])
def test_an_unexplained_interrupt_is_an_unknown_error_retried_automatically(
    tmp_path: Path, store: Store, home: Settings, launched: str
) -> None:
    """Also when the process that runs the job ignores SIGINT, as one started with `&` from a
    script does (its children inherit SIG_IGN): the attempt went on and succeeded."""
    # each step takes a while (a grader that sleeps 0.3 s): the interrupt lands mid-run however
    # late the test's poll sees step 1 under load (30 quick steps could all end before it did)
    job_id, _ = create_job(store, make_job(tmp_path / "u", grader=SLOW_GRADER, hyper={"steps": 30}))
    before = signal.signal(
        signal.SIGINT, signal.SIG_IGN if launched != "foreground" else signal.getsignal(signal.SIGINT)
    )
    try:
        status = run_job(store, home, job_id, progress=_kill_running_attempt(store, signal.SIGINT))  # type: ignore[arg-type]
    finally:
        signal.signal(signal.SIGINT, before)
    assert status == "failed"
    first = store.list_attempts(job_id)[0].error
    assert first is not None
    assert (first.type, first.owner, first.cause) == (
        "unknown error",
        "platform",
        "KeyboardInterrupt",
    )
    assert store.get_job(job_id).auto_retries == 1  # type: ignore[union-attr]


def test_an_overlapped_job_killed_mid_run_resumes_and_records_each_step_once(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    """overlap_rollouts: step N+1's rollouts run while step N trains. An interrupted attempt is
    retried from its last checkpoint with the same prompts; each step's trajectories are stored once."""
    steps = 12
    job_file = make_job(tmp_path / "o", hyper={"steps": steps, "overlap_rollouts": True})
    job_id, _ = create_job(store, job_file)
    kill = _kill_running_attempt(store, signal.SIGINT, after_steps=2)

    def first_attempt_only(jid: int) -> None:
        if len(store.list_attempts(jid)) == 1:
            kill(jid)  # type: ignore[operator]

    assert run_job(store, home, job_id, progress=first_attempt_only) == "succeeded"  # type: ignore[arg-type]
    attempts = store.list_attempts(job_id)
    assert len(attempts) == 2 and attempts[1].resumed_from_step >= 2, attempts
    job = store.get_job(job_id)
    assert job is not None and job.steps_done == steps
    for step in range(1, steps + 1):
        records = store.trajectories(job_id, step=step, limit=100)
        assert len(records) == 4, (step, [r.trajectory_id for r in records])  # 2 prompts x 2 rollouts


@pytest.mark.parametrize("overlap", [False, True], ids=["sequential", "overlapped"])
def test_the_circuit_breaker_stops_a_job_whose_plugins_mostly_fail(
    tmp_path: Path, store: Store, home: Settings, overlap: bool
) -> None:
    flaky = """
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    raise RuntimeError("grader service unreachable")
"""
    job_file = make_job(
        tmp_path / "cb",
        grader=flaky,
        hyper={"steps": 5, "overlap_rollouts": overlap},
        extra={
            "failure_policy": {"max_attempts": 1, "on_exhausted": "drop_sample"},
            "circuit_breaker": {"max_error_share": 0.3, "min_calls": 2},
        },
    )
    job_id, _ = create_job(store, job_file)
    assert run_job(store, home, job_id) == "failed"
    job = store.get_job(job_id)
    assert job is not None and job.error is not None
    assert (job.error.type, job.error.cause) == ("Call plugin error", "500")
    assert "stopped early" in job.error.message
    assert "grader.py" in job.error.evidence["traceback"], "the first failure's traceback is the evidence"
    assert job.steps_done == 1
    failed = store.trajectories(job_id, status="failed", limit=10)
    assert failed, "the dropped samples are recorded as failed trajectories"


def test_the_server_scheduler_runs_submitted_jobs_and_manual_retries(
    tmp_path: Path, store: Store, home: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fault goes with the attempt's environment (a secret is read from it at every attempt); the
    # grader's folder cannot carry it: a retry runs the code that was submitted.
    bad = """
import os
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    if os.environ["PT_BROKEN"] == "1":
        raise ValueError("broken on purpose")
    return 1.0
"""
    job_file = make_job(tmp_path / "s", grader=bad, extra={"secrets": ["PT_BROKEN"]})
    monkeypatch.setenv("PT_BROKEN", "1")
    job_id, _ = create_job(store, job_file)
    scheduler = Scheduler(store, home, poll_s=0.2)
    scheduler.start()
    try:
        _wait_for(store, job_id, "failed")
        monkeypatch.setenv("PT_BROKEN", "0")
        retry_job(store, job_id)
        _wait_for(store, job_id, "succeeded")
    finally:
        scheduler.stop()
    attempts = store.list_attempts(job_id)
    assert [a.status for a in attempts] == ["failed", "succeeded"]
    assert [e.cause for e in store.list_job_errors(job_id)] == ["500"]


def test_a_retried_job_that_succeeds_keeps_no_pending_retry(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    """The automatic retry of a killed attempt succeeds: next_retry_at is gone and `jobs show` says
    nothing about an automatic retry (it said "automatic retry 1 in 0 s"); the job can be deleted."""
    # 30 steps, as the other kill tests: with 3 the job could end before the 0.5 s poll saw a step
    job_id, _ = create_job(store, make_job(tmp_path / "r", hyper={"steps": 30}))
    kill = _kill_running_attempt(store, signal.SIGKILL)

    def first_attempt_only(jid: int) -> None:
        if len(store.list_attempts(jid)) == 1:
            kill(jid)  # type: ignore[operator]

    assert run_job(store, home, job_id, progress=first_attempt_only) == "succeeded"  # type: ignore[arg-type]
    job = store.get_job(job_id)
    assert job is not None and job.auto_retries == 1 and job.next_retry_at is None
    shown = CliRunner().invoke(app, ["jobs", "show", str(job_id)])
    assert shown.exit_code == 0 and "automatic retry" not in shown.output, shown.output
    delete_job(store, home.home, job_id)  # refused while a retry was still recorded as pending


def test_the_server_clears_a_due_retry_when_it_queues_the_job(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    job_id, _ = create_job(store, make_job(tmp_path / "d", hyper={"steps": 1}))
    store.transition(job_id, "running", "attempt starting")
    store.transition(job_id, "failed", "internal error: the test's platform failure")
    store.update_job(job_id, next_retry_at=time.time() - 1, auto_retries=1)
    scheduler = Scheduler(store, home, poll_s=0.2)
    scheduler.start()
    try:
        _wait_for(store, job_id, "succeeded")
    finally:
        scheduler.stop()
    job = store.get_job(job_id)
    assert job is not None and job.next_retry_at is None
    assert "automatic retry" not in CliRunner().invoke(app, ["jobs", "show", str(job_id)]).output


def _wait_for(store: Store, job_id: int, status: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = store.get_job(job_id)
        if job is not None and job.status == status:
            return
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not become {status}: {store.get_job(job_id)}")


def test_plugin_logs_reach_the_store_while_a_step_is_still_running(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    slow = """
import time
from plugtune import rollout

@rollout
def answer(ctx, policy, sample):
    ctx.logger.info("thinking about %s", sample.index)
    time.sleep(4)
    policy.chat(sample.messages, max_tokens=2)
"""
    job_id, _ = create_job(store, make_job(tmp_path / "tail", rollout=slow, hyper={"steps": 1}))
    seen_mid_step: list[bool] = []

    def progress(jid: int) -> None:
        job = store.get_job(jid)
        if job is not None and job.status == "running" and job.steps_done == 0 and not seen_mid_step:
            if store.logs(jid, text="thinking about", limit=1):
                seen_mid_step.append(True)

    assert run_job(store, home, job_id, progress=progress) == "succeeded"
    assert seen_mid_step, "the live tail saw the plugin's line before the step ended"
