"""Filters as the console passes them to the Store, and the reads the Store's API lacks.

Jobs: the list's search (name substring, status, error cause) with its total, one query each, so
the page and ``GET /api/jobs`` select the same rows.

A newest-first keyset page knows the cursor of the page below it (its last row); the
"Previous" link needs the cursor of the page above it. For trajectories the Store answers that
(``order="oldest", after_id=...``). For log lines ``Store.logs(after_id=...)`` returns the
*newest* lines above a cursor (the live tail), not the adjacent ones, so this module asks the
database directly, with the Store's own filter (``plugtune.store.logs._filtered``) so both reads
always select the same rows. Both are index range scans: page 1 and page 10,000 cost the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, and_, func, or_, select

from plugtune.store import Store
from plugtune.store import logs as store_logs
from plugtune.store.jobs import _job
from plugtune.store.records import Job
from plugtune.store.schema import jobs, log_lines

MAX_CAUSES = 100  # error causes offered by the jobs list's filter


@dataclass(frozen=True)
class LogFilter:
    plugin: str | None = None
    level: str | None = None
    trajectory_id: str | None = None
    text: str | None = None

    def store_kwargs(self) -> dict[str, Any]:
        return {
            "plugin": self.plugin,
            "level": self.level,
            "trajectory_id": self.trajectory_id,
            "text": self.text,
        }


@dataclass(frozen=True)
class JobFilter:
    """The jobs list's search: ``q`` a substring of the name (any case), ``status`` exact, ``cause``
    the error's cause (its type when the error has no cause, e.g. ``Invalid value``)."""

    q: str | None = None
    status: str | None = None
    cause: str | None = None

    def where(self, query: Select[Any]) -> Select[Any]:
        c = jobs.c
        if self.q:
            query = query.where(func.lower(c.name).contains(self.q.lower(), autoescape=True))
        if self.status:
            query = query.where(c.status == self.status)
        if self.cause:
            no_cause = or_(c.error_cause.is_(None), c.error_cause == "")
            query = query.where(or_(c.error_cause == self.cause, and_(no_cause, c.error_type == self.cause)))
        return query


def job_page(store: Store, flt: JobFilter, *, limit: int, offset: int) -> tuple[list[Job], int]:
    """One page of the jobs ``flt`` selects, newest first, and how many it selects in all."""
    rows = flt.where(select(jobs)).order_by(jobs.c.id.desc()).limit(limit).offset(offset)
    count = flt.where(select(func.count()).select_from(jobs))
    with store._db.read("listing jobs") as conn:
        found = [_job(row) for row in conn.execute(rows)]
        total = int(conn.execute(count).scalar_one())
    return found, total


def job_causes(store: Store) -> list[tuple[str, str]]:
    """The error causes of the stored jobs (a job's error type when it has no cause) as (cause,
    label: the cause with its error type), sorted by cause."""
    c = jobs.c
    cause = func.coalesce(func.nullif(c.error_cause, ""), c.error_type)
    query = (
        select(cause, c.error_type)
        .where(c.error_type.is_not(None))
        .distinct()
        .order_by(cause, c.error_type)
        .limit(MAX_CAUSES)
    )
    with store._db.read("listing error causes") as conn:
        found = [(str(row[0]), str(row[1])) for row in conn.execute(query)]
    labels: dict[str, list[str]] = {}
    for value, error_type in found:
        if value != error_type:
            labels.setdefault(value, []).append(error_type)
        else:
            labels.setdefault(value, [])
    return [(value, f"{value} ({', '.join(types)})" if types else value) for value, types in labels.items()]


@dataclass(frozen=True)
class TrajectoryFilter:
    status: str | None = None
    phase: str | None = None
    step: int | None = None
    plugin: str | None = None
    text: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None

    def store_kwargs(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "phase": self.phase,
            "step": self.step,
            "plugin": self.plugin,
            "text": self.text,
            "min_reward": self.min_reward,
            "max_reward": self.max_reward,
        }


def newer_logs_cursor(
    store: Store, job_id: int, flt: LogFilter, first_id: int, page_size: int
) -> tuple[bool, int | None]:
    """For a log page whose top row is ``first_id``: (is there a newer page, its ``before`` cursor)."""
    c = log_lines.c
    ids = store_logs._filtered(select(c.id), job_id, **flt.store_kwargs())
    query = ids.where(c.id > first_id).order_by(c.id.asc()).limit(page_size + 1)
    # The Store has no public connection accessor; its Database gives the Store's own transaction
    # handling and error translation (PlatformError).
    with store._db.read("paging log lines") as conn:
        found = [int(row[0]) for row in conn.execute(query)]
    return _cursor(found, page_size)


def newer_trajectories_cursor(
    store: Store, job_id: int, flt: TrajectoryFilter, first_row: int, page_size: int
) -> tuple[bool, int | None]:
    """For a trajectory page whose top row is ``first_row``: (is there a newer page, its cursor)."""
    rows = store.trajectories(
        job_id, **flt.store_kwargs(), order="oldest", after_id=first_row, limit=page_size + 1
    )
    return _cursor([r.id for r in rows], page_size)


def _cursor(newer_ids_ascending: list[int], page_size: int) -> tuple[bool, int | None]:
    # The page above holds the page_size ids just above the current top; None: it is the first page.
    if not newer_ids_ascending:
        return False, None
    if len(newer_ids_ascending) <= page_size:
        return True, None
    return True, newer_ids_ascending[page_size - 1] + 1
