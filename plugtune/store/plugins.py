"""Plugins of a job (status, failure reason, the code that ran) and their monitoring retention."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Row, and_, delete, select, update

from plugtune.store.base import StoreBase, dumps, loads
from plugtune.store.database import upsert
from plugtune.store.jobs import require_job
from plugtune.store.records import NotFoundError, Plugin, PluginRole, PluginStatus
from plugtune.store.schema import code_files, log_lines, metric_points, metric_series, plugins

PURGE_CHUNK = 5000  # rows deleted per transaction, so a purge never holds the write lock for long
_ENDED = (PluginStatus.COMPLETED.value, PluginStatus.FAILED.value, PluginStatus.NOT_STARTED.value)


class PluginsTable(StoreBase):
    def upsert_plugin(
        self,
        job_id: int,
        name: str,
        role: str,
        entry: str,
        *,
        code_hash: str = "",
        runtime: dict[str, Any] | None = None,
    ) -> None:
        """Declare a plugin of a job (status ``waiting``), or update its entry, code and runtime."""
        values = {
            "job_id": job_id,
            "name": name,
            "role": PluginRole(role).value,
            "entry": entry,
            "status": PluginStatus.WAITING.value,
            "failure_reason": "",
            "code_hash": code_hash,
            "runtime": dumps(runtime or {}),
        }
        # Declared again before a retry deploys (no code yet): keep the code that ran last time, which
        # the console and a support bundle show if this attempt dies before its deploy.
        updated = ["role", "entry", "code_hash", "runtime"] if code_hash else ["role", "entry"]
        stmt = upsert(self._db, plugins, ["job_id", "name"], updated)
        with self._db.write("recording a plugin") as conn:
            require_job(conn, job_id)
            conn.execute(stmt, values)

    def set_plugin_status(
        self, job_id: int, name: str, status: str, *, failure_reason: str = "", at: float | None = None
    ) -> None:
        """Move a plugin to waiting / running / completed / failed / not started.

        ``running`` stamps started_at (first time) and clears a previous end; ``completed``,
        ``failed`` and ``not started`` stamp ended_at and start the monitoring retention clock.
        """
        new = PluginStatus(status)
        now = self._clock() if at is None else at
        values: dict[str, Any] = {"status": new.value, "failure_reason": failure_reason}
        if new is PluginStatus.RUNNING:
            values.update(ended_at=None, retention_expires_at=None, monitoring_purged_at=None)
        elif new.value in _ENDED:
            values.update(ended_at=now, retention_expires_at=now + self._retention_s)
        key = and_(plugins.c.job_id == job_id, plugins.c.name == name)
        with self._db.write("changing a plugin's status") as conn:
            done = conn.execute(update(plugins).where(key).values(**values))
            if done.rowcount == 0:
                raise NotFoundError(f"job {job_id} has no plugin {name!r}")
            if new is PluginStatus.RUNNING:
                conn.execute(
                    update(plugins).where(key, plugins.c.started_at.is_(None)).values(started_at=now)
                )

    def list_plugins(self, job_id: int) -> list[Plugin]:
        """The job's plugins: rollout first, then graders, then group graders; by name within a role."""
        query = select(plugins).where(plugins.c.job_id == job_id).order_by(plugins.c.name)
        with self._db.read("listing plugins") as conn:
            rows = [_plugin(r) for r in conn.execute(query)]
        order = [r.value for r in PluginRole]
        return sorted(rows, key=lambda p: order.index(p.role))

    def plugins_in_use(self, limit: int = 1000) -> list[Plugin]:
        """Plugins waiting or running, of every job (their attempt deploys or runs them), oldest job
        first; at most ``limit``."""
        query = (
            select(plugins)
            .where(plugins.c.status.in_([PluginStatus.WAITING.value, PluginStatus.RUNNING.value]))
            .order_by(plugins.c.job_id, plugins.c.name)
            .limit(limit)
        )
        with self._db.read("listing the plugins in use") as conn:
            return [_plugin(r) for r in conn.execute(query)]

    def get_plugin(self, job_id: int, name: str) -> Plugin | None:
        query = select(plugins).where(plugins.c.job_id == job_id, plugins.c.name == name)
        with self._db.read("reading a plugin") as conn:
            row = conn.execute(query).first()
        return None if row is None else _plugin(row)

    def plugin_monitoring_expired(self, job_id: int, name: str) -> bool:
        """True once the plugin's metric points and log lines were purged after its retention."""
        plugin = self.get_plugin(job_id, name)
        return plugin is not None and plugin.monitoring_expired

    def put_code(self, code_hash: str, files: dict[str, bytes]) -> None:
        """Store the files of one code version once; storing the same hash again is a no-op."""
        if not code_hash:
            raise ValueError("put_code needs a non-empty code_hash")
        rows = [
            {"code_hash": code_hash, "path": path, "content": bytes(data)} for path, data in files.items()
        ]
        if not rows:
            return
        with self._db.write("storing plugin code") as conn:
            conn.execute(upsert(self._db, code_files, ["code_hash", "path"], None), rows)

    def get_code(self, code_hash: str) -> dict[str, bytes]:
        """The files stored under ``code_hash`` (path -> content), sorted by path; {} if unknown."""
        query = select(code_files.c.path, code_files.c.content).where(code_files.c.code_hash == code_hash)
        with self._db.read("reading plugin code") as conn:
            return {r.path: bytes(r.content) for r in sorted(conn.execute(query), key=lambda r: r.path)}

    def purge_expired(self, now: float | None = None) -> int:
        """Delete metric points and log lines of plugins whose retention ended; return how many plugins."""
        now = self._clock() if now is None else now
        due = select(plugins.c.job_id, plugins.c.name).where(
            plugins.c.status.in_(_ENDED),
            plugins.c.retention_expires_at <= now,
            plugins.c.monitoring_purged_at.is_(None),
        )
        with self._db.read("finding expired plugins") as conn:
            expired = [(r.job_id, r.name) for r in conn.execute(due)]
        for job_id, name in expired:
            for table in (metric_points, log_lines):
                self._delete_in_chunks(table, job_id, name)
            with self._db.write("marking a plugin's monitoring as purged") as conn:
                series = metric_series.c
                conn.execute(delete(metric_series).where(series.job_id == job_id, series.plugin == name))
                conn.execute(
                    update(plugins)
                    .where(plugins.c.job_id == job_id, plugins.c.name == name)
                    .values(monitoring_purged_at=now)
                )
        return len(expired)

    def _delete_in_chunks(self, table: Any, job_id: int, plugin: str) -> None:
        chunk = (
            select(table.c.id).where(table.c.job_id == job_id, table.c.plugin == plugin).limit(PURGE_CHUNK)
        )
        while True:  # ends: every pass deletes PURGE_CHUNK rows or is the last one
            with self._db.write("purging expired monitoring data") as conn:
                deleted = conn.execute(delete(table).where(table.c.id.in_(chunk.scalar_subquery()))).rowcount
            if deleted < PURGE_CHUNK:
                return


def _plugin(row: Row[Any, Any]) -> Plugin:
    return Plugin(
        job_id=row.job_id,
        name=row.name,
        role=row.role,
        entry=row.entry,
        status=row.status,
        failure_reason=row.failure_reason,
        code_hash=row.code_hash,
        runtime=loads(row.runtime) or {},
        started_at=row.started_at,
        ended_at=row.ended_at,
        retention_expires_at=row.retention_expires_at,
        monitoring_expired=row.monitoring_purged_at is not None,
    )
