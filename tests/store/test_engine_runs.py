"""Engine runs: worker processes of one run key share one job (SQLite and PostgreSQL)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from plugtune.store import Store

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
