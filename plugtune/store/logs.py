"""Log lines of a job's plugins: batched inserts, keyset pages (newest or oldest first), filters, counts."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import Connection, Select, insert, select

from plugtune.store.base import MAX_PAGE, StoreBase, count_rows, page_size
from plugtune.store.database import contains_text
from plugtune.store.records import LogRow
from plugtune.store.schema import log_lines
from plugtune.types import LogLine


def insert_logs(conn: Connection, job_id: int, lines: Sequence[LogLine]) -> None:
    if lines:
        conn.execute(insert(log_lines), [_row(job_id, line) for line in lines])


def _row(job_id: int, line: LogLine) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "time": line.time,
        "level": line.level.upper(),
        "plugin": line.plugin,
        "source": line.source,
        "call_id": line.call_id,
        "trajectory_id": line.trajectory_id,
        "instance_id": line.instance_id,
        "message": line.message,
    }


class LogsTable(StoreBase):
    def add_logs(self, job_id: int, lines: Sequence[LogLine]) -> None:
        """Insert lines in one transaction (durable on return). Running jobs use StoreWriter."""
        with self._db.write("writing log lines") as conn:
            insert_logs(conn, job_id, lines)

    def logs(
        self,
        job_id: int,
        *,
        plugin: str | None = None,
        level: str | None = None,
        trajectory_id: str | None = None,
        text: str | None = None,
        before_id: int | None = None,
        after_id: int | None = None,
        limit: int = 100,
        oldest_first: bool = False,
    ) -> list[LogRow]:
        """One page of at most ``limit`` (capped at ``MAX_PAGE``) log lines, newest first.

        Next (older) page: ``before_id=page[-1].id``. Live tail: ``after_id=<newest id seen>``
        returns only newer lines (the newest ``limit`` of them: a reader that must see every line
        pages with ``oldest_first=True, after_id=page[-1].id`` instead, oldest first). ``text``
        matches a substring of the message, case-insensitively.
        """
        query = _filtered(select(log_lines), job_id, plugin, level, trajectory_id, text)
        if before_id is not None:
            query = query.where(log_lines.c.id < before_id)
        if after_id is not None:
            query = query.where(log_lines.c.id > after_id)
        order = log_lines.c.id.asc() if oldest_first else log_lines.c.id.desc()
        query = query.order_by(order).limit(page_size(limit))
        with self._db.read("reading log lines") as conn:
            return [_log_row(r) for r in conn.execute(query)]

    def newest_logs(self, job_id: int, count: int, **filters: Any) -> list[LogRow]:
        """The newest ``count`` matching lines (any number: read page by page), oldest first.
        ``filters``: ``plugin``, ``level``, ``trajectory_id``, ``text`` as for :meth:`logs`."""
        rows: list[LogRow] = []
        before: int | None = None
        while len(rows) < count:
            wanted = min(MAX_PAGE, count - len(rows))
            page = self.logs(job_id, before_id=before, limit=wanted, **filters)
            rows += page
            if len(page) < wanted:
                break
            before = page[-1].id
        return rows[::-1]

    def logs_after(self, job_id: int, after_id: int, **filters: Any) -> Iterator[LogRow]:
        """Every matching line with an id above ``after_id``, oldest first, read page by page (a
        follower passes the last id it printed, and misses none of a burst however large)."""
        while True:
            page = self.logs(job_id, after_id=after_id, limit=MAX_PAGE, oldest_first=True, **filters)
            yield from page
            if len(page) < MAX_PAGE:
                return
            after_id = page[-1].id

    def count_logs(
        self,
        job_id: int,
        *,
        plugin: str | None = None,
        level: str | None = None,
        trajectory_id: str | None = None,
        text: str | None = None,
        cap: int | None = None,
        after_id: int | None = None,
        before_id: int | None = None,
    ) -> int:
        """How many lines match (with ids between ``after_id`` and ``before_id``, both excluded, when
        given); with ``cap``, counting stops there (``min(count, cap)``, O(cap)), for "10,000+"
        labels that stay cheap on a million-line job."""
        ids = _filtered(select(log_lines.c.id), job_id, plugin, level, trajectory_id, text)
        if after_id is not None:
            ids = ids.where(log_lines.c.id > after_id)
        if before_id is not None:
            ids = ids.where(log_lines.c.id < before_id)
        with self._db.read("counting log lines") as conn:
            return count_rows(conn, ids, cap)


def _filtered(
    query: Select[Any],
    job_id: int,
    plugin: str | None,
    level: str | None,
    trajectory_id: str | None,
    text: str | None,
) -> Select[Any]:
    query = query.where(log_lines.c.job_id == job_id)
    if plugin is not None:
        query = query.where(log_lines.c.plugin == plugin)
    if level is not None:
        query = query.where(log_lines.c.level == level.upper())
    if trajectory_id is not None:
        query = query.where(log_lines.c.trajectory_id == trajectory_id)
    if text:
        query = query.where(contains_text(log_lines.c.message, text))
    return query


def _log_row(r: Any) -> LogRow:
    return LogRow(
        id=r.id,
        job_id=r.job_id,
        time=r.time,
        level=r.level,
        plugin=r.plugin,
        source=r.source,
        call_id=r.call_id,
        trajectory_id=r.trajectory_id,
        instance_id=r.instance_id,
        message=r.message,
    )
