"""One test per row of the failure taxonomy, each produced by a real cause in a real job."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import AttemptRunner, run_job
from plugtune.settings import Settings
from plugtune.store import Store
from tests.jobs.jobkit import make_job

pytestmark = pytest.mark.slow


def _run(store: Store, home: Settings, job_file: Path) -> tuple[int, str]:
    job_id, invalid = create_job(store, job_file)
    assert invalid is None, invalid
    return job_id, run_job(store, home, job_id)


def _error(store: Store, job_id: int) -> dict[str, str]:
    job = store.get_job(job_id)
    assert job is not None and job.error is not None
    return job.error.to_dict()


def test_a_job_that_succeeds_stores_trajectories_metrics_logs_and_checkpoints(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    job_id, status = _run(store, home, make_job(tmp_path / "ok"))
    assert status == "succeeded"
    assert store.count_trajectories(job_id) == 2 * 2 * 2
    assert {c.step for c in store.list_checkpoints(job_id)} == {1, 2}
    assert "reward/mean" in store.metric_names(job_id)
    assert store.logs(job_id, plugin="answer", text="answered", limit=1)
    assert [p.status for p in store.list_plugins(job_id)] == ["completed", "completed"]
    for plugin in ("answer", "exact"):  # even a short job leaves each plugin's resource metrics
        assert {"exec_qps", "memory_percent", "instances"} <= set(store.metric_names(job_id, plugin))
    assert (home.home / "jobs" / str(job_id) / "final" / "config.json").is_file()


def test_a_sleeping_rollout_is_a_timeout_owned_by_the_plugin(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    sleepy = """
import time
from plugtune import rollout

@rollout
def answer(ctx, policy, sample):
    ctx.logger.warning("about to sleep")
    time.sleep(60)
"""
    job_id, status = _run(
        store, home, make_job(tmp_path / "t", rollout=sleepy, rollout_runtime={"timeout_s": 1})
    )
    assert status == "failed"
    error = _error(store, job_id)
    assert (error["type"], error["owner"], error["cause"]) == ("Call plugin error", "plugin", "Timeout")
    assert "timeout_s" in error["hint"]
    plugins = {p.name: p for p in store.list_plugins(job_id)}
    assert plugins["answer"].status == "failed"
    assert store.logs(job_id, text="about to sleep", limit=1), "logs written before the timeout survive"
    assert store.get_job(job_id).next_retry_at is None  # type: ignore[union-attr]


def test_a_crashing_grader_is_a_500_with_the_users_line(tmp_path: Path, store: Store, home: Settings) -> None:
    crashing = """
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    return int(sample.extra["missing_key"])
"""
    job_id, status = _run(store, home, make_job(tmp_path / "c", grader=crashing))
    assert status == "failed"
    error = _error(store, job_id)
    assert (error["type"], error["cause"]) == ("Call plugin error", "500")
    assert "grader.py" in str(error["evidence"].get("traceback"))


def test_a_missing_data_file_is_invalid_data_before_any_compute(tmp_path: Path, store: Store) -> None:
    job_file = make_job(tmp_path / "d")
    (tmp_path / "d" / "data" / "train.jsonl").unlink()
    job_id, invalid = create_job(store, job_file)
    assert invalid is not None
    error = _error(store, job_id)
    assert (error["type"], error["owner"]) == ("Invalid data", "data")
    assert "train.jsonl" in error["message"]
    assert store.get_job(job_id).status == "failed"  # type: ignore[union-attr]
    assert store.list_attempts(job_id) == []


def test_a_malformed_line_is_invalid_value_naming_the_line(tmp_path: Path, store: Store) -> None:
    rows = [{"messages": [{"role": "user", "content": "1+1?"}], "extra": {"answer": "2"}}, "{not json"]
    job_id, invalid = create_job(store, make_job(tmp_path / "v", rows=rows))
    assert invalid is not None
    error = _error(store, job_id)
    assert (error["type"], error["owner"]) == ("Invalid value", "data")
    assert "train.jsonl:2" in error["message"]


def test_a_nan_producing_setting_is_loss_nan_with_the_batch(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    huge = """
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    return 1e308 if ctx.rollout_index == 0 else 0.0
"""
    # a weight of 10 on rewards near the float maximum overflows the summed reward to inf
    job_id, status = _run(store, home, make_job(tmp_path / "n", grader=huge, grader_weight=10.0))
    assert status == "failed"
    error = _error(store, job_id)
    assert (error["type"], error["owner"]) == ("Loss nan", "data")
    assert error["evidence"]["step"] == 1
    assert error["evidence"]["trajectory_ids"]


def test_a_killed_attempt_is_an_internal_error_retried_from_the_checkpoint(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    slow = """
import time
from plugtune import rollout

@rollout
def answer(ctx, policy, sample):
    if ctx.step == 3:
        time.sleep(1.0)
    policy.chat(sample.messages, max_tokens=sample.sampling.max_tokens)
"""
    job_file = make_job(tmp_path / "k", rollout=slow, hyper={"steps": 4})
    job_id, invalid = create_job(store, job_file)
    assert invalid is None
    killed: list[int] = []

    def kill_in_step_3(jid: int) -> None:
        job = store.get_job(jid)
        attempts = store.list_attempts(jid)
        if not killed and job is not None and job.steps_done >= 2 and attempts and attempts[-1].pid:
            killed.append(attempts[-1].pid)
            os.kill(attempts[-1].pid, signal.SIGKILL)

    status = run_job(store, home, job_id, progress=kill_in_step_3)
    assert killed, "the attempt was killed mid-run"
    assert status == "succeeded"
    attempts = store.list_attempts(job_id)
    assert [a.status for a in attempts] == ["failed", "succeeded"]
    assert attempts[0].error is not None and attempts[0].error.type == "internal error"
    assert attempts[1].resumed_from_step == 2
    history = store.list_job_errors(job_id)
    assert history and history[0].type == "internal error" and history[0].owner == "platform"
    assert store.count_trajectories(job_id) == 4 * 2 * 2  # nothing duplicated or lost
    steps = sorted(p.step for p in store.metrics(job_id, "", ["reward/mean"])["reward/mean"])
    assert steps == [1, 2, 3, 4]


def test_cancel_stops_the_attempt_cleanly(tmp_path: Path, store: Store, home: Settings) -> None:
    slow = """
import time
from plugtune import rollout

@rollout
def answer(ctx, policy, sample):
    time.sleep(0.5)
    policy.chat(sample.messages, max_tokens=2)
"""
    job_id, _ = create_job(store, make_job(tmp_path / "x", rollout=slow, hyper={"steps": 50}))
    runner = AttemptRunner(store, home)

    def cancel_when_running(jid: int) -> None:
        job = store.get_job(jid)
        if job is not None and job.steps_done >= 1:
            runner.cancel()

    started = time.monotonic()
    status = run_job(store, home, job_id, runner=runner, progress=cancel_when_running)
    assert status == "cancelled"
    assert time.monotonic() - started < 120
    assert store.list_attempts(job_id)[-1].status == "cancelled"
    assert threading.active_count() >= 1
