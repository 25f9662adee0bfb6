from __future__ import annotations

import pytest

from plugtune.errors import Cause, PluginCallError
from plugtune.store import IllegalTransitionError, NotFoundError, Store
from plugtune.types import ErrorRecord

from .conftest import Target


def test_create_and_get_job(store: Store) -> None:
    spec = {
        "name": "arith",
        "hyperparameters": {"steps": 30, "learning_rate": 1e-4},
        "plugins": {"graders": []},
    }
    job_id = store.create_job("arith", spec, spec_yaml="name: arith\n")
    job = store.get_job(job_id)
    assert job is not None
    assert (job.name, job.spec, job.spec_yaml, job.status) == ("arith", spec, "name: arith\n", "queued")
    assert job.error is None and job.steps_done == 0 and job.auto_retries == 0
    assert store.get_job(job_id + 1000) is None


def test_open_is_idempotent_and_data_survives_reopen(target: Target) -> None:
    first = target.open()
    job_id = first.create_job("a", {})
    first.close()
    second = target.open()
    again = target.open()
    assert second.get_job(job_id) is not None and again.count_jobs() == 1
    second.close()
    again.close()


def test_list_jobs_newest_first_filtered_and_paginated(store: Store) -> None:
    ids = [store.create_job(f"job{i}", {"i": i}) for i in range(7)]
    for job_id in ids[:3]:
        store.transition(job_id, "running")
    assert [j.id for j in store.list_jobs(limit=3)] == ids[::-1][:3]
    assert [j.id for j in store.list_jobs(limit=3, offset=3)] == ids[::-1][3:6]
    assert [j.id for j in store.list_jobs(status="running")] == ids[:3][::-1]
    assert store.count_jobs() == 7 and store.count_jobs("queued") == 4
    with pytest.raises(ValueError):
        store.list_jobs(status="sleeping")


def test_transitions_are_recorded_in_order(store: Store, job_id: int) -> None:
    store.transition(job_id, "validating", "checking data")
    store.transition(job_id, "running", "attempt 1")
    store.transition(job_id, "failed", "plugin error")
    store.transition(job_id, "queued", "manual retry")
    history = [(t.from_status, t.to_status, t.reason) for t in store.list_transitions(job_id)]
    assert history == [
        (None, "queued", "created"),
        ("queued", "validating", "checking data"),
        ("validating", "running", "attempt 1"),
        ("running", "failed", "plugin error"),
        ("failed", "queued", "manual retry"),
    ]
    job = store.get_job(job_id)
    assert job is not None and job.status == "queued"
    assert job.updated_at >= job.created_at


@pytest.mark.parametrize(
    ("path", "illegal"),
    [
        ([], "succeeded"),
        (["running", "succeeded"], "queued"),
        (["running"], "running"),
        (["cancelled"], "running"),
    ],
)
def test_illegal_transition_is_refused_with_a_clear_error(
    store: Store, job_id: int, path: list[str], illegal: str
) -> None:
    for status in path:
        store.transition(job_id, status)
    before = store.get_job(job_id)
    with pytest.raises(IllegalTransitionError, match=f"cannot become {illegal}") as info:
        store.transition(job_id, illegal)
    assert f"job {job_id} is {before.status if before else ''}" in str(info.value)
    assert store.get_job(job_id) == before
    assert len(store.list_transitions(job_id)) == len(path) + 1


def test_transition_and_update_of_a_missing_job(store: Store) -> None:
    with pytest.raises(NotFoundError, match="job 999 does not exist"):
        store.transition(999, "running")
    with pytest.raises(NotFoundError):
        store.update_job(999, steps_done=1)


def test_update_job_progress_fields(store: Store, job_id: int) -> None:
    store.update_job(job_id, steps_done=3, steps_total=30, next_retry_at=1234.5, auto_retries=2)
    job = store.get_job(job_id)
    assert job is not None
    assert (job.steps_done, job.steps_total, job.next_retry_at, job.auto_retries) == (3, 30, 1234.5, 2)
    store.update_job(job_id, next_retry_at=None)
    assert store.get_job(job_id).next_retry_at is None  # type: ignore[union-attr]
    with pytest.raises(TypeError, match="cannot set \\['status'\\]"):
        store.update_job(job_id, status="running")


def test_job_error_current_and_history(store: Store, job_id: int) -> None:
    error = PluginCallError(
        Cause.TIMEOUT,
        "call exceeded 5 s",
        plugin="solve",
        call_id="c1",
        traceback="File plugins/r.py, line 3",
    ).record(evidence={"log_ids": [1, 2]})
    store.set_job_error(job_id, error, attempt=1)
    job = store.get_job(job_id)
    assert job is not None and job.error is not None
    assert (job.error.type, job.error.owner, job.error.cause) == ("Call plugin error", "plugin", "Timeout")
    assert job.error.hint == error.hint and job.error.message == "call exceeded 5 s"
    assert job.error.evidence["plugin"] == "solve" and job.error.evidence["log_ids"] == [1, 2]
    assert "line 3" in job.error.evidence["traceback"]

    died = ErrorRecord.from_dict({"type": "internal error", "owner": "platform", "message": "died"})
    store.set_job_error(job_id, died, attempt=2)
    store.clear_job_error(job_id)
    assert store.get_job(job_id).error is None  # type: ignore[union-attr]
    history = store.list_job_errors(job_id)
    assert [(e.type, e.attempt) for e in history] == [("Call plugin error", 1), ("internal error", 2)]
    with pytest.raises(ValueError, match="needs \\['owner'\\]"):
        store.set_job_error(job_id, ErrorRecord.from_dict({"type": "internal error"}))


def test_attempts_are_numbered_and_closed(store: Store, job_id: int) -> None:
    assert store.start_attempt(job_id, pid=100) == 1
    killed = ErrorRecord.from_dict({"type": "internal error", "message": "killed"})
    store.end_attempt(job_id, 1, "failed", error=killed)
    assert store.start_attempt(job_id, pid=101, resumed_from_step=5) == 2
    first, second = store.list_attempts(job_id)
    assert (first.pid, first.status, first.error, first.ended_at is not None) == (
        100,
        "failed",
        ErrorRecord.from_dict({"type": "internal error", "message": "killed"}, attempt=1),
        True,
    )
    assert (second.number, second.status, second.resumed_from_step, second.ended_at) == (
        2,
        "running",
        5,
        None,
    )
    with pytest.raises(ValueError):
        store.end_attempt(job_id, 2, "exploded")
    with pytest.raises(NotFoundError):
        store.end_attempt(job_id, 9, "failed")
    with pytest.raises(NotFoundError):
        store.start_attempt(12345, pid=1)


def test_checkpoints_latest_is_highest_step(store: Store, job_id: int) -> None:
    assert store.latest_checkpoint(job_id) is None
    store.add_checkpoint(job_id, 5, "/ckpt/5")
    store.add_checkpoint(job_id, 10, "/ckpt/10")
    store.add_checkpoint(job_id, 10, "/ckpt/10-again")
    latest = store.latest_checkpoint(job_id)
    assert latest is not None and (latest.step, latest.path) == (10, "/ckpt/10-again")
    assert [c.step for c in store.list_checkpoints(job_id)] == [5, 10, 10]


def test_evidence_with_records_and_sets_is_stored_as_json(store: Store, job_id: int) -> None:
    from plugtune.types import LogLine

    line = LogLine(time=1.0, level="ERROR", plugin="solve", message="boom")
    store.set_job_error(
        job_id,
        ErrorRecord("internal error", "platform", "", "", evidence={"logs": [line], "ids": {7}, "raw": b"x"}),
    )
    job = store.get_job(job_id)
    assert job is not None and job.error is not None
    assert job.error.evidence == {"logs": [line.to_dict()], "ids": [7], "raw": "x"}
