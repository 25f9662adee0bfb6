"""``JobWatch``: a job's live state read once per poll for every event stream that follows it.

Each ``GET /api/jobs/{id}/events`` connection asks ``await watch.read(job_id)`` every poll; readers of
the same job within ``max_age_s`` share one store read (the first one reads, the others wait for it
and take its answer), so a job page open in 50 browser tabs costs the store what one tab costs.
"""

from __future__ import annotations

import asyncio
import time

from starlette.concurrency import run_in_threadpool

from plugtune.store import Store
from plugtune.store.records import Job
from plugtune.web import service
from plugtune.web.models import JobEventOut


def job_event(store: Store, job: Job) -> JobEventOut:
    """A job's live state as the events stream sends it."""
    position = service.queue_positions(store).get(job.id) if job.status == "queued" else None
    cause = (job.error.cause or job.error.type) if job.error is not None else None
    return JobEventOut(
        id=job.id,
        status=job.status,
        steps_done=job.steps_done,
        steps_total=job.steps_total,
        error_cause=cause,
        updated_at=job.updated_at,
        queue_position=position,
        waiting=service.waiting_of(store, job),
    )


class JobWatch:
    """The last read of each followed job: ``(job, its event)``, or ``None`` once it is deleted."""

    def __init__(self, store: Store, max_age_s: float) -> None:
        self.store, self.max_age_s = store, max_age_s
        self.reads = 0  # store reads made (tests: shared between streams)
        self._last: dict[int, tuple[float, tuple[Job, JobEventOut] | None]] = {}
        self._locks: dict[int, asyncio.Lock] = {}

    async def read(self, job_id: int) -> tuple[Job, JobEventOut] | None:
        lock = self._locks.setdefault(job_id, asyncio.Lock())
        async with lock:
            cached = self._last.get(job_id)
            if cached is not None and time.monotonic() - cached[0] < self.max_age_s:
                return cached[1]
            self.reads += 1
            answer = await run_in_threadpool(self._read, job_id)
            self._last[job_id] = (time.monotonic(), answer)
            return answer

    def _read(self, job_id: int) -> tuple[Job, JobEventOut] | None:
        job = self.store.get_job(job_id)
        return None if job is None else (job, job_event(self.store, job))
