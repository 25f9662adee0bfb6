"""The store: one object over the database that every other layer reads and writes.

Thread-safety: a ``Store`` may be shared by any number of threads; each call checks a
connection out of the engine's pool and runs in its own transaction. Every write method is one
transaction that is committed (and, on SQLite, fsynced) before it returns. Several processes
may open the same database at once (SQLite WAL + busy timeout, or PostgreSQL). A forked child
must open its own ``Store`` (connections are not shared across ``fork``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

from sqlalchemy import Connection

from plugtune.settings import Settings
from plugtune.store.attempt_code import AttemptCodeTable
from plugtune.store.attempts import AttemptsTable
from plugtune.store.cancels import CancelsTable
from plugtune.store.database import Database, normalize_url
from plugtune.store.engine_runs import EngineRunsTable
from plugtune.store.jobs import JobsTable
from plugtune.store.logs import LogsTable, insert_logs
from plugtune.store.metrics import MetricsTable, insert_metrics
from plugtune.store.plugins import PluginsTable
from plugtune.store.regrades import RegradesTable
from plugtune.store.resume import ResumeTable
from plugtune.store.trajectories import TrajectoriesTable, upsert_trajectory_rows
from plugtune.types import LogLine, MetricPoint, TrajectoryRecord

log = logging.getLogger(__name__)

DAY_S = 86_400.0


class Store(
    JobsTable,
    AttemptsTable,
    CancelsTable,
    PluginsTable,
    LogsTable,
    MetricsTable,
    TrajectoriesTable,
    ResumeTable,
    RegradesTable,
    EngineRunsTable,
    AttemptCodeTable,
):
    """Jobs, attempts, plugins and code, logs, metrics, trajectories and checkpoints.

    Open with :meth:`open`; reads return frozen records (``plugtune.store.records``); database
    failures raise :class:`plugtune.errors.PlatformError` saying what failed and what to do.
    """

    def __init__(
        self, db: Database, *, retention_days: float, clock: Callable[[], float] = time.time
    ) -> None:
        self._db = db
        self._clock = clock
        self._retention_s = retention_days * DAY_S

    @classmethod
    def open(
        cls,
        url: str | None = None,
        *,
        schema: str | None = None,
        retention_days: float | None = None,
        clock: Callable[[], float] = time.time,
        settings: Settings | None = None,
    ) -> Store:
        """Open (creating the file, folder and tables if needed) the database at ``url``.

        ``url`` defaults to ``Settings.database_url`` (``$PLUGTUNE_DATABASE_URL`` or SQLite at
        ``.plugtune/plugtune.db``); ``postgresql://`` means the psycopg 3 driver. ``schema``
        (PostgreSQL only) keeps this store's tables in their own schema. Idempotent.
        """
        if url is None or retention_days is None:
            settings = settings or Settings.from_env()
            url = settings.database_url if url is None else url
            retention_days = settings.retention_days if retention_days is None else retention_days
        db = Database(normalize_url(url), schema=schema)
        try:
            db.create_schema()
        except BaseException:
            db.close()
            raise
        log.debug("store open at %s", db.url.render_as_string(hide_password=True))
        return cls(db, retention_days=retention_days, clock=clock)

    @property
    def url(self) -> str:
        return self._db.url.render_as_string(hide_password=True)

    @property
    def is_sqlite(self) -> bool:
        return self._db.is_sqlite

    def write_batch(
        self,
        job_id: int,
        *,
        logs: Sequence[LogLine] = (),
        metrics: Sequence[MetricPoint] = (),
        trajectories: Sequence[TrajectoryRecord] = (),
    ) -> None:
        """Write log lines, metric points and trajectories of one job in one durable transaction."""
        if not (logs or metrics or trajectories):
            return
        with self._db.write("writing a batch of monitoring data") as conn:
            insert_logs(conn, job_id, logs)
            insert_metrics(conn, self._db, job_id, metrics)
            upsert_trajectory_rows(conn, self._db, job_id, trajectories, self._clock())

    def read_connection(self, what: str = "reading the store") -> AbstractContextManager[Connection]:
        """A connection for a layer that composes its own Core query on ``plugtune.store.schema``
        tables, with the store's error translation (``what`` names the read in errors). Prefer the
        methods above; this is for the rare read they do not offer."""
        return self._db.read(what)

    def drop_all(self) -> None:
        """Delete every table (on PostgreSQL with a schema: the schema). Tests and resets only."""
        self._db.drop_schema()

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
