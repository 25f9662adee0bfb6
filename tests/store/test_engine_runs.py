"""Engine runs: worker processes of one run key share one job (SQLite and PostgreSQL)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from plugtune.store import Store
from plugtune.store.engine_runs import EngineMember

from .conftest import Target

CHILD = """
import sys
from plugtune.store import Store
url, schema, key = sys.argv[1], sys.argv[2] or None, sys.argv[3]
store = Store.open(url, schema=schema)
job_id, created = store.join_engine_run(key, "verl-run", {"engine": "verl"})
print(job_id, int(created))
"""


def test_the_first_process_of_a_run_key_creates_its_job_and_the_others_join_it(store: Store) -> None:
    job_id, created = store.join_engine_run("ray:session_1:01000000", "verl-run", {"engine": "verl"})
    assert created and store.get_job(job_id) is not None
    assert store.join_engine_run("ray:session_1:01000000", "other name", {}) == (job_id, False)
    other, created_other = store.join_engine_run("ray:session_2:01000000", "verl-run", {})
    assert created_other and other != job_id
    assert store.engine_run("ray:session_1:01000000") == (job_id, 2, 2)
    assert store.leave_engine_run("ray:session_1:01000000") == 1
    assert store.leave_engine_run("ray:session_1:01000000") == 0
    assert store.leave_engine_run("ray:session_1:01000000") == 0  # never below 0
    assert store.engine_run("nobody") is None
    assert [j.name for j in store.list_jobs()] == ["verl-run", "verl-run"]
    store.delete_job(job_id)  # its engine run goes with it
    assert store.engine_run("ray:session_1:01000000") is None
    with pytest.raises(ValueError, match="a run key is 1 to 200 characters"):
        store.join_engine_run("", "x", {})


def test_processes_joining_one_run_key_at_once_get_one_job(target: Target) -> None:
    target.open().close()  # the tables exist
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, target.url, target.schema or "", "ray:s:02000000"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    answers = []
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        answers.append(tuple(int(v) for v in out.split()))
    assert len({job for job, _ in answers}) == 1
    assert sorted(created for _, created in answers) == [0, 0, 0, 1]
    store = target.open()
    assert store.engine_run("ray:s:02000000") == (answers[0][0], 4, 4)
    assert store.count_jobs() == 1
    store.close()


def test_members_are_recorded_and_the_running_attempt_follows_those_left(store: Store) -> None:
    first, second, third = (EngineMember(pid, "host-a", 1000.0 + pid) for pid in (101, 102, 103))
    job_id, created = store.join_engine_run("ray:s:03", "verl-run", {"engine": "verl"}, member=first)
    assert created
    store.join_engine_run("ray:s:03", "verl-run", {}, member=second)
    store.join_engine_run("ray:s:03", "verl-run", {}, member=third)
    attempt = store.start_attempt(job_id, first.pid)
    members = store.engine_run_members("ray:s:03")
    assert [(m.pid, m.host, m.started) for m in members] == [
        (101, "host-a", 1101.0),
        (102, "host-a", 1102.0),
        (103, "host-a", 1103.0),
    ]
    assert all(m.id for m in members)

    assert store.leave_engine_run("ray:s:03", first) == 2  # the creator leaves first
    assert store.list_attempts(job_id)[-1].pid == second.pid  # its attempt goes to the next member
    assert store.leave_engine_run("ray:s:03", third) == 1
    assert store.list_attempts(job_id)[-1].pid == second.pid  # not third's to hand over
    assert [m.pid for m in store.engine_run_members("ray:s:03")] == [second.pid]

    [stored_second] = store.engine_run_members("ray:s:03")
    assert store.drop_engine_run_members("ray:s:03", [stored_second]) == 0  # killed: counted out
    assert store.drop_engine_run_members("ray:s:03", [stored_second]) is None  # once
    assert store.engine_run("ray:s:03") == (job_id, 0, 3)
    assert store.list_attempts(job_id)[-1].number == attempt

    store.join_engine_run("ray:s:03", "verl-run", {}, member=first)
    store.delete_job(job_id)  # its members go with it
    assert store.engine_run_members("ray:s:03") == []


PROGRESS = """
import sys, time
from plugtune.store import Store, StoreWriter
url, schema, job_id = sys.argv[1], sys.argv[2] or None, int(sys.argv[3])
steps, pause = sys.argv[4], float(sys.argv[5])
store = Store.open(url, schema=schema)
writer = StoreWriter(store, job_id, steps_forward_only=True)
for step in steps.split(","):
    writer.set_steps_done(int(step))
    writer.flush()
    time.sleep(pause)
writer.close()
"""


def test_steps_done_never_goes_back_when_several_processes_report_it(target: Target) -> None:
    store = target.open()
    job_id, _ = store.join_engine_run("ray:s:04", "verl-run", {"engine": "verl"})

    def worker(steps: str, pause: float) -> subprocess.Popen[str]:
        argv = [
            sys.executable,
            "-c",
            PROGRESS,
            target.url,
            target.schema or "",
            str(job_id),
            steps,
            str(pause),
        ]
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    # an agent loop ahead, a reward worker behind, reporting at the same time
    children = [worker(",".join(str(s) for s in range(1, 11)), 0.02), worker("1,2,2,3,3,4", 0.05)]
    seen: list[int] = []
    deadline = time.monotonic() + 120
    while any(c.poll() is None for c in children) and time.monotonic() < deadline:
        job = store.get_job(job_id)
        assert job is not None
        seen.append(job.steps_done)
        time.sleep(0.005)
    for child in children:
        _, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
    late = worker("2", 0.0)  # a worker one step behind after the others ended
    assert late.wait(timeout=60) == 0
    job = store.get_job(job_id)
    assert job is not None and job.steps_done == 10
    assert seen == sorted(seen), seen
    store.close()
