"""Cancel requests: the record that tells a user's cancel from any other SIGTERM of an attempt."""

from __future__ import annotations

from sqlalchemy import delete, select

from plugtune.store.base import StoreBase
from plugtune.store.database import upsert
from plugtune.store.jobs import require_job
from plugtune.store.schema import cancel_requests


class CancelsTable(StoreBase):
    def request_cancel(self, job_id: int, reason: str) -> None:
        """Record that the job's running attempt is to be cancelled (before it is sent SIGTERM)."""
        stmt = upsert(self._db, cancel_requests, ["job_id"], ["requested_at", "reason"])
        with self._db.write("recording a cancel request") as conn:
            require_job(conn, job_id)
            conn.execute(stmt, {"job_id": job_id, "requested_at": self._clock(), "reason": reason})

    def cancel_request(self, job_id: int) -> str | None:
        """The reason of the job's cancel request since its run started; None when there is none."""
        query = select(cancel_requests.c.reason).where(cancel_requests.c.job_id == job_id)
        with self._db.read("reading a cancel request") as conn:
            found = conn.execute(query).scalar()
        return None if found is None else str(found)

    def clear_cancel_request(self, job_id: int) -> None:
        """Forget the job's cancel request (its next run starts: an old request is not for it)."""
        with self._db.write("clearing a cancel request") as conn:
            conn.execute(delete(cancel_requests).where(cancel_requests.c.job_id == job_id))
