"""Log lines of a job's plugins: batched inserts, newest-first keyset pages, filters, counts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Select, insert, select

from plugtune.store.base import StoreBase, count_rows, page_size
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
    ) -> list[LogRow]:
        """One page of log lines, newest first.

        Next (older) page: ``before_id=page[-1].id``. Live tail: ``after_id=<newest id seen>``
        returns only newer lines (the newest ``limit`` of them). ``text`` matches a substring of
        the message, case-insensitively.
        """
        query = _filtered(select(log_lines), job_id, plugin, level, trajectory_id, text)
        if before_id is not None:
            query = query.where(log_lines.c.id < before_id)
        if after_id is not None:
            query = query.where(log_lines.c.id > after_id)
        query = query.order_by(log_lines.c.id.desc()).limit(page_size(limit))
        with self._db.read("reading log lines") as conn:
            return [_log_row(r) for r in conn.execute(query)]

    def count_logs(
        self,
        job_id: int,
        *,
        plugin: str | None = None,
        level: str | None = None,
        trajectory_id: str | None = None,
        text: str | None = None,
        cap: int | None = None,
    ) -> int:
        """How many lines match; with ``cap``, counting stops there (``min(count, cap)``, O(cap)),
        for "10,000+" labels that stay cheap on a million-line job."""
        ids = _filtered(select(log_lines.c.id), job_id, plugin, level, trajectory_id, text)
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
