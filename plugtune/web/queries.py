"""The few reads the console needs that the Store's API does not offer (SQLAlchemy Core on its tables).

Filters are the store's own (its module-level ``_filtered``), so a page here and a page from
``Store.logs`` / ``Store.trajectories`` always hold the same rows. The lookups are keyset reads
on the store's ``(job_id, ..., id)`` indexes, so they cost the same on page 1 and page 10,000:
the row id of a trajectory, the trajectory just above one in the list, the cursor of the page
above a page (the "Previous" link of newest-first lists), and the newest value of each metric.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Select, Table, func, select

from plugtune.store import Store
from plugtune.store import logs as store_logs
from plugtune.store import trajectories as store_trajectories
from plugtune.store.schema import log_lines, metric_points, trajectories


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

    def ids(self, job_id: int) -> Select[Any]:
        """The ids of the job's matching log lines, filtered exactly as ``Store.logs`` filters."""
        return store_logs._filtered(select(log_lines.c.id), job_id, **self.store_kwargs())


@dataclass(frozen=True)
class TrajectoryFilter:
    status: str | None = None
    step: int | None = None
    plugin: str | None = None
    text: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None

    def store_kwargs(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "step": self.step,
            "plugin": self.plugin,
            "text": self.text,
            "min_reward": self.min_reward,
            "max_reward": self.max_reward,
        }

    def ids(self, job_id: int) -> Select[Any]:
        """The row ids of the job's matching trajectories, filtered exactly as ``Store.trajectories``."""
        c = trajectories.c
        return store_trajectories._filtered(select(c.id, c.trajectory_id), job_id, **self.store_kwargs())


@contextmanager
def _read(store: Store, what: str) -> Iterator[Connection]:
    # The Store has no public connection accessor; its Database gives the same transaction
    # handling and error translation (PlatformError) as the Store's own reads.
    with store._db.read(what) as conn:
        yield conn


def trajectory_row_id(store: Store, job_id: int, trajectory_id: str) -> int | None:
    c = trajectories.c
    query = select(c.id).where(c.job_id == job_id, c.trajectory_id == trajectory_id)
    with _read(store, "finding a trajectory") as conn:
        value = conn.execute(query).scalar()
    return None if value is None else int(value)


def neighbor_trajectory(
    store: Store, job_id: int, row_id: int, flt: TrajectoryFilter, *, newer: bool
) -> str | None:
    """The trajectory just above (newer) or below (older) row ``row_id`` in the filtered list."""
    c = trajectories.c
    query = flt.ids(job_id)
    if newer:
        query = query.where(c.id > row_id).order_by(c.id.asc())
    else:
        query = query.where(c.id < row_id).order_by(c.id.desc())
    with _read(store, "finding the next trajectory") as conn:
        row = conn.execute(query.limit(1)).first()
    return None if row is None else str(row.trajectory_id)


def newer_page_cursor(
    store: Store, table: Table, ids: Select[Any], first_id: int, page_size: int
) -> tuple[bool, int | None]:
    """For a newest-first page whose top row is ``first_id``: (is there a newer page, its cursor).

    ``ids`` selects the filtered rows' ids. The cursor is the ``before`` id that shows the page
    just above; None means the first page.
    """
    query = ids.where(table.c.id > first_id).order_by(table.c.id.asc()).limit(page_size + 1)
    with _read(store, "paging") as conn:
        found = [int(row[0]) for row in conn.execute(query)]
    if not found:
        return False, None
    if len(found) <= page_size:
        return True, None
    return True, found[page_size - 1] + 1


def last_values(store: Store, job_ids: list[int]) -> list[tuple[int, str, str, float]]:
    """(job, plugin, metric name, newest value) of every series of the given jobs."""
    if not job_ids:
        return []
    c = metric_points.c
    newest = (
        select(c.job_id, c.plugin, c.name, func.max(c.time).label("time"))
        .where(c.job_id.in_(job_ids))
        .group_by(c.job_id, c.plugin, c.name)
        .subquery()
    )
    query = (
        select(c.job_id, c.plugin, c.name, func.max(c.value))
        .join(
            newest,
            (c.job_id == newest.c.job_id)
            & (c.plugin == newest.c.plugin)
            & (c.name == newest.c.name)
            & (c.time == newest.c.time),
        )
        .group_by(c.job_id, c.plugin, c.name)
        .order_by(c.job_id, c.plugin, c.name)
    )
    with _read(store, "reading the newest metric values") as conn:
        return [(int(j), str(p), str(n), float(v)) for j, p, n, v in conn.execute(query)]
