"""Attempts (one process run of a job each) and the checkpoints a retry resumes from."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, func, insert, or_, select, update

from plugtune.store.base import StoreBase, dumps, loads
from plugtune.store.jobs import require_job
from plugtune.store.records import Attempt, Checkpoint, NotFoundError
from plugtune.store.schema import attempts, checkpoints, plugins
from plugtune.types import ErrorRecord

ATTEMPT_STATUSES = frozenset({"running", "succeeded", "failed", "cancelled"})
_OPEN = ("waiting", "running")


class AttemptsTable(StoreBase):
    def start_attempt(self, job_id: int, pid: int | None, resumed_from_step: int = 0) -> int:
        """Record a new attempt of the job (status ``running``) and return its number (1, 2, ...)."""
        with self._db.write("starting an attempt") as conn:
            require_job(conn, job_id, lock=True)
            last = conn.execute(
                select(func.max(attempts.c.number)).where(attempts.c.job_id == job_id)
            ).scalar()
            number = int(last or 0) + 1
            conn.execute(
                insert(attempts),
                {
                    "job_id": job_id,
                    "number": number,
                    "pid": pid,
                    "started_at": self._clock(),
                    "status": "running",
                    "resumed_from_step": resumed_from_step,
                },
            )
        return number

    def end_attempt(self, job_id: int, number: int, status: str, error: ErrorRecord | None = None) -> None:
        """Close an attempt with its final status and, when it failed, the classified error."""
        if status not in ATTEMPT_STATUSES - {"running"}:
            raise ValueError(
                f"an attempt ends as one of {sorted(ATTEMPT_STATUSES - {'running'})}, not {status!r}"
            )
        with self._db.write("ending an attempt") as conn:
            done = conn.execute(
                update(attempts)
                .where(attempts.c.job_id == job_id, attempts.c.number == number)
                .values(
                    status=status,
                    ended_at=self._clock(),
                    error=None if error is None else dumps(error.to_dict()),
                )
            )
            if done.rowcount == 0:
                raise NotFoundError(f"job {job_id} has no attempt {number}")
            _settle_plugins(conn, job_id, self._clock(), self._retention_s, error)

    def list_attempts(self, job_id: int) -> list[Attempt]:
        query = select(attempts).where(attempts.c.job_id == job_id).order_by(attempts.c.number)
        with self._db.read("reading attempts") as conn:
            return [_attempt(r) for r in conn.execute(query)]

    def attempts_of_pids(self, pids: list[int]) -> list[Attempt]:
        """The attempts, of any job, whose process had one of these pids (oldest first: a pid may
        have been reused by a later attempt)."""
        if not pids:
            return []
        query = select(attempts).where(attempts.c.pid.in_(pids)).order_by(attempts.c.started_at)
        with self._db.read("finding attempts by pid") as conn:
            return [_attempt(r) for r in conn.execute(query)]

    def add_checkpoint(self, job_id: int, step: int, path: str) -> Checkpoint:
        """Record that the job's state after ``step`` is saved at ``path``."""
        record = Checkpoint(job_id=job_id, step=step, path=path, created_at=self._clock())
        with self._db.write("recording a checkpoint") as conn:
            require_job(conn, job_id)
            conn.execute(insert(checkpoints), record.to_dict())
        return record

    def latest_checkpoint(self, job_id: int) -> Checkpoint | None:
        """The checkpoint with the highest step (the newest one if a step was saved twice)."""
        query = (
            select(checkpoints)
            .where(checkpoints.c.job_id == job_id)
            .order_by(checkpoints.c.step.desc(), checkpoints.c.id.desc())
            .limit(1)
        )
        with self._db.read("reading checkpoints") as conn:
            row = conn.execute(query).first()
        if row is None:
            return None
        return Checkpoint(job_id=row.job_id, step=row.step, path=row.path, created_at=row.created_at)

    def list_checkpoints(self, job_id: int) -> list[Checkpoint]:
        query = select(checkpoints).where(checkpoints.c.job_id == job_id).order_by(checkpoints.c.step)
        with self._db.read("reading checkpoints") as conn:
            return [
                Checkpoint(job_id=r.job_id, step=r.step, path=r.path, created_at=r.created_at)
                for r in conn.execute(query)
            ]


def _attempt(r: Any) -> Attempt:
    return Attempt(
        job_id=r.job_id,
        number=r.number,
        pid=r.pid,
        started_at=r.started_at,
        ended_at=r.ended_at,
        status=r.status,
        error=None if r.error is None else ErrorRecord.from_dict(loads(r.error), attempt=r.number),
        resumed_from_step=r.resumed_from_step,
    )


def _settle_plugins(
    conn: Connection, job_id: int, now: float, retention_s: float, error: ErrorRecord | None
) -> None:
    """No plugin stays "running" or "waiting" after its attempt ended (an attempt that died could not
    say so): the one the attempt's error names (by name or entry) ends as failed, running ones as
    completed, and the ones never deployed (another failed first) as not started."""
    c = plugins.c
    ended = {"ended_at": now, "retention_expires_at": now + retention_s}
    named = error.plugin if error is not None else ""
    if error is not None and named:
        conn.execute(
            update(plugins)
            .where(c.job_id == job_id, or_(c.name == named, c.entry == named), c.status.in_(_OPEN))
            .values(status="failed", failure_reason=_reason(error), **ended)
        )
    conn.execute(
        update(plugins).where(c.job_id == job_id, c.status == "running").values(status="completed", **ended)
    )
    conn.execute(
        update(plugins).where(c.job_id == job_id, c.status == "waiting").values(status="not started", **ended)
    )


def _reason(error: ErrorRecord) -> str:
    return f"{error.cause or error.type or 'error'} [{error.plugin}]: {error.message}"
