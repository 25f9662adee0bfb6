"""An engine run's job follows its live processes (verl's workers, real processes here): the one
that created the job may exit first, ``plugtune serve``'s housekeeping then leaves the job running
while another member lives and fails it once every member is gone without leaving (SIGKILL); the
job's steps_done never goes back when members report steps behind one another. SQLite and
PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugtune.jobs.scheduler import Scheduler, recover_interrupted
from plugtune.settings import Settings
from plugtune.store import Store
from tests.store.conftest import Target, postgres_session, postgres_skip_reason, target

__all__ = ["postgres_session", "postgres_skip_reason", "target"]  # the store tests' fixtures

WORKER = """
import sys
from plugtune.integrations.recording import EngineRun
from plugtune.sdk import Context, Sample, Trajectory
from plugtune.store import Store

url, schema, key, grader = sys.argv[1], sys.argv[2] or None, sys.argv[3], sys.argv[4]
run = EngineRun.open(engine="verl", graders=[grader], store=Store.open(url, schema=schema), run_key=key)
print("joined", run.job_id, flush=True)
sample = Sample(messages=[{"role": "user", "content": "1+1=?"}], extra={})
for line in sys.stdin:
    word, *rest = line.split()
    if word == "step":  # a step's call, then its flush (steps_done), as verl's workers do
        step = int(rest[0])
        trajectory = Trajectory(trajectory_id=f"t-{step}", messages=[*sample.messages])
        run.call(run.graders[0], Context(step=step), sample, trajectory)
        run.flush(step)
        print("ok", flush=True)
    elif word == "exit":
        sys.exit(0)  # the EngineRun's exit hook ends this process's part of the run
"""

GRADER = """
from plugtune.sdk import Context, Sample, Trajectory, grader


@grader
def score(ctx: Context, sample: Sample, trajectory: Trajectory) -> float:
    return 1.0
"""


class Worker:
    """One worker process of the run: joins on start, then runs steps and exits when told."""

    def __init__(self, target: Target, key: str, grader: str) -> None:
        argv = [sys.executable, "-c", WORKER, target.url, target.schema or "", key, grader]
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        word, job_id = self._answer().split()
        assert word == "joined"
        self.job_id, self.pid = int(job_id), self.proc.pid

    def _answer(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # bounded: the test's timeout and the child's own exit
        if not line:
            _, err = self.proc.communicate(timeout=60)
            raise AssertionError(f"the worker stopped: {err[-3000:]}")
        return line.strip()

    def step(self, step: int) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"step {step}\n")
        self.proc.stdin.flush()
        assert self._answer() == "ok"

    def exit(self) -> None:
        _, err = self.proc.communicate("exit\n", timeout=120)
        assert self.proc.returncode == 0, err[-3000:]

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)  # no exit hook runs
        self.proc.communicate(timeout=60)


@pytest.fixture
def grader(tmp_path: Path) -> str:
    (tmp_path / "grader.py").write_text(GRADER)
    return f"{tmp_path / 'grader.py'}:score"


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:  # a failed test leaves none behind
        if worker.proc.poll() is None:
            worker.kill()


@pytest.fixture
def store(target: Target) -> Iterator[Store]:
    s = target.open()
    yield s
    s.close()


def test_the_job_runs_on_after_its_creator_exits_and_ends_when_the_last_member_leaves(
    target: Target, store: Store, grader: str, workers: list[Worker], home: Settings
) -> None:
    first = Worker(target, "verl-run-a", grader)
    workers.append(first)
    second = Worker(target, "verl-run-a", grader)
    workers.append(second)
    job_id = first.job_id
    assert second.job_id == job_id
    first.step(3)
    second.step(1)  # a worker behind the other: the job's progress stays at 3
    assert store.get_job(job_id).steps_done == 3  # type: ignore[union-attr]

    first.exit()  # the process that created the job (and its attempt) ends first
    job = store.get_job(job_id)
    assert job is not None and job.status == "running"
    assert store.list_attempts(job_id)[-1].pid == second.pid  # the attempt went to the one left
    assert recover_interrupted(store, home) == []  # serve's housekeeping: the run goes on
    assert store.get_job(job_id).status == "running"  # type: ignore[union-attr]

    second.step(4)
    second.exit()
    job = store.get_job(job_id)
    assert job is not None and job.status == "succeeded" and job.steps_done == 4
    assert [a.status for a in store.list_attempts(job_id)] == ["succeeded"]
    assert store.engine_run_members("verl-run-a") == []


def test_a_run_whose_every_member_was_killed_is_failed_by_serve_naming_the_run(
    target: Target, store: Store, grader: str, workers: list[Worker], home: Settings
) -> None:
    first = Worker(target, "verl-run-b", grader)
    workers.append(first)
    second = Worker(target, "verl-run-b", grader)
    workers.append(second)
    job_id = first.job_id
    first.step(1)
    first.kill()
    assert recover_interrupted(store, home) == []  # one member still lives
    second.kill()

    assert recover_interrupted(store, home) == [job_id]
    job = store.get_job(job_id)
    assert job is not None and job.status == "failed" and job.error is not None
    assert (job.error.type, job.error.owner, job.error.cause) == (
        "unknown error",
        "platform",
        "engine run stopped",
    )
    assert "'verl-run-b'" in job.error.message and str(second.pid) in job.error.message
    assert job.error.evidence["run_key"] == "verl-run-b"
    assert [a.status for a in store.list_attempts(job_id)] == ["failed"]
    assert recover_interrupted(store, home) == []  # settled once


def test_a_running_serve_fails_a_run_once_its_every_member_was_killed(
    target: Target,
    store: Store,
    grader: str,
    workers: list[Worker],
    home: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Scheduler, "ENGINE_RUNS_EVERY_S", 0.5)  # (30 s in serve)
    first = Worker(target, "verl-run-d", grader)
    workers.append(first)
    second = Worker(target, "verl-run-d", grader)
    workers.append(second)
    scheduler = Scheduler(store, home, poll_s=0.2)
    scheduler.start()  # serve, started while the run goes on
    try:
        first.step(1)
        first.exit()
        time.sleep(1.5)  # three checks: the member left lives
        assert store.get_job(first.job_id).status == "running"  # type: ignore[union-attr]
        second.kill()
        deadline = time.monotonic() + 30
        while store.get_job(first.job_id).status == "running" and time.monotonic() < deadline:  # type: ignore[union-attr]
            time.sleep(0.2)
    finally:
        scheduler.stop()
    job = store.get_job(first.job_id)
    assert job is not None and job.status == "failed" and job.error is not None
    assert job.error.cause == "engine run stopped" and "'verl-run-d'" in job.error.message


def test_the_last_live_member_ends_the_job_when_another_was_killed_without_leaving(
    target: Target, store: Store, grader: str, workers: list[Worker]
) -> None:
    first = Worker(target, "verl-run-c", grader)
    workers.append(first)
    second = Worker(target, "verl-run-c", grader)
    workers.append(second)
    second.step(2)
    second.kill()  # counted as a member still: no exit hook left the run
    first.step(2)
    first.exit()
    job = store.get_job(first.job_id)
    assert job is not None and job.status == "succeeded" and job.steps_done == 2
    assert store.engine_run("verl-run-c") == (first.job_id, 0, 2)
