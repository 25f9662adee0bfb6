"""Every try of a plugin call leaves its verdict on the trajectory (issue 24, item 12): a rollout that
returned Status.RETRY and then succeeded, a grader that said Status.RETRY on each of its tries."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import run_job
from plugtune.settings import Settings
from plugtune.store import Store
from tests.jobs.jobkit import make_job

pytestmark = pytest.mark.slow

ROLLOUT = """
from plugtune import Retry, rollout

@rollout
def answer(ctx, policy, sample):
    policy.chat(sample.messages, max_tokens=sample.sampling.max_tokens)
    if ctx.attempt == 1:
        raise Retry("the calculator was busy")
"""

GRADER = """
from plugtune import Retry, grader

@grader
def exact(ctx, sample, trajectory):
    if sample.extra["answer"] == "3":
        raise Retry(f"the judge was unsure on try {ctx.attempt}")
    return 1.0
"""

ROWS = [
    {"messages": [{"role": "user", "content": "What is 1+2?"}], "extra": {"answer": "3"}},
    {"messages": [{"role": "user", "content": "What is 3+4?"}], "extra": {"answer": "7"}},
]


def test_every_try_of_a_retried_call_stays_on_its_trajectory(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    job_file = make_job(
        tmp_path / "retries",
        rollout=ROLLOUT,
        grader=GRADER,
        rows=ROWS,
        hyper={"steps": 1, "batch_size": 2, "group_size": 2, "save_every_n_steps": 1},
        extra={
            "failure_policy": {"max_attempts": 3, "on_exhausted": "drop_sample"},
            "circuit_breaker": {"max_error_share": 1.0},  # most calls here say Status.RETRY on purpose
        },
    )
    job_id, invalid = create_job(store, job_file)
    assert invalid is None, invalid
    status = run_job(store, home, job_id)
    job = store.get_job(job_id)
    assert status == "succeeded", job.error if job else None
    records = store.trajectories(job_id, limit=10)
    assert len(records) == 4
    for summary in records:
        record = store.get_trajectory(job_id, summary.trajectory_id)
        assert record is not None
        first = record.errors[0]  # the rollout's first try said Status.RETRY; its second succeeded
        assert (first.plugin, first.cause, first.attempt) == ("answer", "Status retry", 1)
        assert "the calculator was busy" in first.message
        assert record.attempt == 2
        if record.sample_index == 1:
            assert record.status == "success" and len(record.errors) == 1
            assert summary.error_cause == ""  # a success is listed without an error
            continue
        graded = record.errors[1:]  # the grader's three tries, each with its own reason
        assert [(e.plugin, e.cause, e.attempt) for e in graded] == [
            ("exact", "Status retry", n) for n in (1, 2, 3)
        ]
        assert [e.message.rsplit(" ", 1)[-1] for e in graded] == ["1", "2", "3"]
        assert record.status == "failed" and summary.error_cause == "Status retry"
        assert "(try 3)" in record.discard_reason
