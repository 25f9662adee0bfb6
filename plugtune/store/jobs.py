"""Jobs: creation, status transitions (with history), progress fields and classified errors."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Row, delete, func, insert, select, update

from plugtune.store.base import StoreBase, dumps, loads
from plugtune.store.records import (
    TRANSITIONS,
    IllegalTransitionError,
    Job,
    JobStatus,
    NotFoundError,
    Transition,
)
from plugtune.store.schema import job_errors, job_transitions, jobs, metadata, plugins
from plugtune.types import TAXONOMY, ErrorRecord

_UPDATABLE = frozenset(
    {"name", "spec", "spec_yaml", "steps_done", "steps_total", "next_retry_at", "auto_retries"}
)


class JobsTable(StoreBase):
    def create_job(self, name: str, spec: dict[str, Any], *, spec_yaml: str = "") -> int:
        """Record a new job in ``queued`` and return its id."""
        now = self._clock()
        with self._db.write("creating a job") as conn:
            job_id = conn.execute(
                insert(jobs).returning(jobs.c.id),
                {
                    "name": name,
                    "spec": dumps(spec),
                    "spec_yaml": spec_yaml,
                    "status": JobStatus.QUEUED.value,
                    "created_at": now,
                    "updated_at": now,
                    "steps_done": 0,
                    "steps_total": 0,
                    "auto_retries": 0,
                },
            ).scalar_one()
            conn.execute(
                insert(job_transitions),
                {
                    "job_id": job_id,
                    "from_status": None,
                    "to_status": "queued",
                    "time": now,
                    "reason": "created",
                },
            )
        return int(job_id)

    def get_job(self, job_id: int) -> Job | None:
        with self._db.read("reading a job") as conn:
            row = conn.execute(select(jobs).where(jobs.c.id == job_id)).first()
        return None if row is None else _job(row)

    def list_jobs(self, status: str | None = None, *, limit: int = 50, offset: int = 0) -> list[Job]:
        """Jobs newest first, optionally only those in one status."""
        query = select(jobs).order_by(jobs.c.id.desc()).limit(limit).offset(offset)
        if status is not None:
            query = query.where(jobs.c.status == JobStatus(status).value)
        with self._db.read("listing jobs") as conn:
            return [_job(row) for row in conn.execute(query)]

    def count_jobs(self, status: str | None = None) -> int:
        query = select(func.count()).select_from(jobs)
        if status is not None:
            query = query.where(jobs.c.status == JobStatus(status).value)
        with self._db.read("counting jobs") as conn:
            return int(conn.execute(query).scalar_one())

    def delete_job(self, job_id: int) -> None:
        """Remove a job and every row that belongs to it (attempts, errors, plugins, logs, metrics,
        trajectories, checkpoints); the code files stay, other jobs may share them. The caller checks
        that the job has ended."""
        owned = [t for t in reversed(metadata.sorted_tables) if t is not jobs and "job_id" in t.c]
        with self._db.write("deleting a job") as conn:
            require_job(conn, job_id, lock=True)
            for table in owned:
                conn.execute(delete(table).where(table.c.job_id == job_id))
            conn.execute(delete(jobs).where(jobs.c.id == job_id))

    def update_job(self, job_id: int, **fields: Any) -> None:
        """Set fields: name, spec, spec_yaml, steps_done, steps_total, next_retry_at, auto_retries."""
        unknown = set(fields) - _UPDATABLE
        if unknown:
            raise TypeError(f"update_job cannot set {sorted(unknown)}; it sets {sorted(_UPDATABLE)}")
        values = dict(fields, updated_at=self._clock())
        if "spec" in values:
            values["spec"] = dumps(values["spec"])
        with self._db.write("updating a job") as conn:
            require_job(conn, job_id)
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(**values))

    def transition(
        self, job_id: int, to_status: str, reason: str = "", *, spec: dict[str, Any] | None = None
    ) -> Transition:
        """Move a job to ``to_status`` and record it; raise IllegalTransitionError if not allowed.
        ``spec``: the job's new spec, set in the same transaction (only if the move is allowed)."""
        wanted = JobStatus(to_status)
        now = self._clock()
        with self._db.write("changing a job's status") as conn:
            current = JobStatus(require_job(conn, job_id, lock=True).status)
            if wanted not in TRANSITIONS[current]:
                raise IllegalTransitionError(job_id, current.value, wanted.value)
            values: dict[str, Any] = {"status": wanted.value, "updated_at": now}
            if spec is not None:
                values["spec"] = dumps(spec)
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(**values))
            if wanted is JobStatus.QUEUED:  # a retry: its plugins wait for the next attempt to deploy them
                conn.execute(
                    update(plugins)
                    .where(plugins.c.job_id == job_id)
                    .values(status="waiting", failure_reason="")
                )
            record = Transition(job_id, current.value, wanted.value, now, reason)
            conn.execute(insert(job_transitions), record.to_dict())
        return record

    def list_transitions(self, job_id: int) -> list[Transition]:
        query = (
            select(job_transitions).where(job_transitions.c.job_id == job_id).order_by(job_transitions.c.id)
        )
        with self._db.read("reading a job's history") as conn:
            return [
                Transition(
                    job_id=r.job_id,
                    from_status=r.from_status,
                    to_status=r.to_status,
                    time=r.time,
                    reason=r.reason,
                )
                for r in conn.execute(query)
            ]

    def set_job_error(self, job_id: int, error: ErrorRecord, *, attempt: int | None = None) -> None:
        """Make ``error`` the job's current error and append it to the job's error history (of
        ``attempt``): its taxonomy's five and its evidence."""
        missing = [k for k in ("type", "owner") if not getattr(error, k)]
        if missing:
            raise ValueError(f"a job error needs {missing}; got {error.to_dict()}")
        evidence = dict(error.evidence)
        fields = {k: str(getattr(error, k) or "") for k in TAXONOMY}
        now = self._clock()
        with self._db.write("recording a job error") as conn:
            require_job(conn, job_id)
            conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id)
                .values(
                    updated_at=now,
                    error_evidence=dumps(evidence),
                    **{f"error_{k}": v for k, v in fields.items()},
                )
            )
            conn.execute(
                insert(job_errors),
                {"job_id": job_id, "attempt": attempt, "time": now, "evidence": dumps(evidence), **fields},
            )

    def clear_job_error(self, job_id: int) -> None:
        """Clear the job's current error (its history stays), e.g. when a retry starts."""
        cleared = {f"error_{k}": None for k in (*TAXONOMY, "evidence")}
        with self._db.write("clearing a job error") as conn:
            require_job(conn, job_id)
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(updated_at=self._clock(), **cleared))

    def list_job_errors(self, job_id: int) -> list[ErrorRecord]:
        """Every error the job has had, oldest first (the retry history)."""
        query = select(job_errors).where(job_errors.c.job_id == job_id).order_by(job_errors.c.id)
        with self._db.read("reading a job's errors") as conn:
            return [
                _error({k: getattr(r, k) for k in TAXONOMY}, r.evidence, time=r.time, attempt=r.attempt)
                for r in conn.execute(query)
            ]


def require_job(conn: Connection, job_id: int, *, lock: bool = False) -> Row[Any, Any]:
    query = select(jobs.c.id, jobs.c.status).where(jobs.c.id == job_id)
    if lock:
        query = query.with_for_update()
    row = conn.execute(query).first()
    if row is None:
        raise NotFoundError(f"job {job_id} does not exist")
    return row


def _job(row: Row[Any, Any]) -> Job:
    error = None
    if row.error_type is not None:
        taxonomy = {k: getattr(row, f"error_{k}") for k in TAXONOMY}
        error = _error(taxonomy, row.error_evidence, time=None, attempt=None)
    return Job(
        id=row.id,
        name=row.name,
        spec=loads(row.spec),
        spec_yaml=row.spec_yaml,
        status=row.status,
        created_at=row.created_at,
        updated_at=row.updated_at,
        steps_done=row.steps_done,
        steps_total=row.steps_total,
        error=error,
        next_retry_at=row.next_retry_at,
        auto_retries=row.auto_retries,
    )


def _error(taxonomy: dict[str, Any], evidence: str | None, **fields: Any) -> ErrorRecord:
    """A stored job error: its five columns and its evidence (which holds plugin, traceback, ...)."""
    return ErrorRecord.from_dict({**taxonomy, "evidence": loads(evidence) or {}}, **fields)
