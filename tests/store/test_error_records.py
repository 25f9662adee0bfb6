"""A classified error is one record from the exception to the store and back: the rows it writes
are the ones older versions wrote, and rows older versions wrote read back the same."""

from __future__ import annotations

import json

from sqlalchemy import select, update

from plugtune.errors import Cause, DependencyCallError, DependencyCause, PluginCallError
from plugtune.store import Store
from plugtune.store.base import dumps
from plugtune.store.schema import attempts, job_errors, trajectories
from plugtune.types import ErrorRecord, TrajectoryRecord

FIVE = ("type", "owner", "cause", "message", "hint")

#: An attempt's error as plugtune stored it before the one record: the exception's ``to_dict()``
#: with the classification's evidence beside its own facts.
OLD_ATTEMPT_ERROR = {
    "type": "Call plugin error",
    "owner": "plugin",
    "cause": "Timeout",
    "message": "call exceeded 5 s",
    "hint": "raise timeout_s",
    "plugin": "plugins/grader.py:exact",
    "call_id": "c1",
    "instance_id": "i1",
    "trajectory_id": "s1-g0-r0",
    "traceback": "",
    "peak_memory_mb": 12.5,
    "code_hash": "abc",
    "evidence": {"decision": "plugin_error 3 of 3"},
}


def _old_job_evidence(error: dict[str, object]) -> str:
    """The evidence column the older ``set_job_error`` wrote for ``error``."""
    evidence = dict(error["evidence"])  # type: ignore[call-overload]
    evidence.update({k: v for k, v in error.items() if k not in FIVE and k != "evidence"})
    return dumps(evidence)


def test_an_attempt_error_an_older_version_stored_reads_back_and_is_kept_as_it_kept_it(
    store: Store, job_id: int
) -> None:
    number = store.start_attempt(job_id, pid=1)
    with store._db.write("an older version's attempt row") as conn:
        conn.execute(
            update(attempts)
            .where(attempts.c.job_id == job_id, attempts.c.number == number)
            .values(status="failed", error=json.dumps(OLD_ATTEMPT_ERROR))
        )
    error = store.list_attempts(job_id)[0].error
    assert error is not None
    assert [getattr(error, k) for k in FIVE] == [OLD_ATTEMPT_ERROR[k] for k in FIVE]
    assert (error.plugin, error.call_id, error.trajectory_id, error.traceback, error.attempt) == (
        "plugins/grader.py:exact",
        "c1",
        "s1-g0-r0",
        "",
        number,
    )
    assert list(error.evidence) == [
        "decision",
        "plugin",
        "call_id",
        "instance_id",
        "trajectory_id",
        "traceback",
        "peak_memory_mb",
        "code_hash",
    ]
    store.set_job_error(job_id, error, attempt=number)
    with store.read_connection("the job's error row") as conn:
        row = conn.execute(select(job_errors).where(job_errors.c.job_id == job_id)).one()
    assert row.evidence == _old_job_evidence(OLD_ATTEMPT_ERROR)  # byte for byte
    assert [getattr(row, k) for k in FIVE] == [OLD_ATTEMPT_ERROR[k] for k in FIVE]


def test_an_exceptions_error_is_stored_with_the_evidence_its_dict_gave(store: Store, job_id: int) -> None:
    exc = DependencyCallError(
        DependencyCause.RATE_LIMITED, "429 from judge", dependency="judge", plugin="exact", call_id="c2"
    )
    old = {**exc.to_dict(), "evidence": {"decision": "dependency judge: 3 tries"}}
    store.set_job_error(job_id, exc.record(evidence={"decision": "dependency judge: 3 tries"}), attempt=1)
    job = store.get_job(job_id)
    assert job is not None and job.error is not None
    assert job.error.to_dict() == {
        **{k: old[k] for k in FIVE},
        "evidence": json.loads(_old_job_evidence(old)),
        "time": None,
        "attempt": None,
    }
    with store.read_connection("the job's error row") as conn:
        assert conn.execute(select(job_errors.c.evidence)).scalar_one() == _old_job_evidence(old)
    (kept,) = store.list_job_errors(job_id)
    assert list(kept.to_dict()) == [*FIVE, "evidence", "time", "attempt"] and kept.attempt == 1
    assert kept.time is not None and kept.evidence["dependency"] == "judge"


def test_the_exceptions_dict_is_the_taxonomy_and_its_own_facts_in_order() -> None:
    exc = PluginCallError(Cause.OOM, "over 256 MB", plugin="solve", peak_memory_mb=300.0)
    assert list(exc.to_dict()) == [
        *FIVE,
        "plugin",
        "call_id",
        "instance_id",
        "trajectory_id",
        "traceback",
        "peak_memory_mb",
        "code_hash",
    ]
    assert exc.to_dict()["hint"] == exc.hint and exc.to_dict()["peak_memory_mb"] == 300.0


def test_a_trajectory_keeps_the_ten_fields_of_its_errors_as_before(store: Store, job_id: int) -> None:
    exc = PluginCallError(Cause.ERROR_500, "KeyError: 'x'", plugin="exact", call_id="c3", instance_id="i9")
    record = TrajectoryRecord(
        trajectory_id="s1-g0-r1",
        group_id="s1-g0",
        step=1,
        sample_index=0,
        rollout_index=1,
        attempt=1,
        policy_version=0,
        prompt_ids=[1],
        response_ids=[2],
        response_mask=[1],
        response_logprobs=[-0.5],
        messages=[],
        status="failed",
        errors=[exc.record(trajectory_id="s1-g0-r1", attempt=2)],
    )
    store.upsert_trajectories(job_id, [record])
    with store.read_connection("the trajectory row") as conn:
        stored = json.loads(conn.execute(select(trajectories.c.errors)).scalar_one())
    assert stored == [
        {
            "type": "Call plugin error",
            "owner": "plugin",
            "cause": "500",
            "message": "KeyError: 'x'",
            "hint": exc.hint,
            "plugin": "exact",
            "call_id": "c3",
            "trajectory_id": "s1-g0-r1",
            "attempt": 2,
            "traceback": "",
        }
    ]
    assert record.to_dict()["errors"] == stored
    (back,) = store.get_trajectory(job_id, "s1-g0-r1").errors  # type: ignore[union-attr]
    assert back.on_trajectory() == stored[0]


def test_a_record_made_by_hand_keeps_its_plugin_and_traceback_in_the_jobs_evidence(
    store: Store, job_id: int
) -> None:
    error = ErrorRecord("internal error", "platform", "boom", "m", plugin="solve", traceback="t.py:1")
    store.set_job_error(job_id, error)
    job = store.get_job(job_id)
    assert job is not None and job.error is not None
    assert (job.error.plugin, job.error.traceback) == ("solve", "t.py:1")
    assert job.error.evidence == {"plugin": "solve", "traceback": "t.py:1"}
