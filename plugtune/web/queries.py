"""Filters as the console passes them to the Store, and the one read the Store's API lacks.

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

from sqlalchemy import select

from plugtune.store import Store
from plugtune.store import logs as store_logs
from plugtune.store.schema import log_lines


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
