"""The store: SQLAlchemy Core over SQLite (WAL, default) or PostgreSQL (by URL).

store = Store.open()                      # Settings.database_url
job_id = store.create_job("demo", spec)
store.transition(job_id, "running", "attempt 1 started")
with StoreWriter(store, job_id) as writer:  # batched, durable once flush() returns
    writer.add_logs(lines)
    writer.flush()
page = store.logs(job_id, plugin="rollout", limit=100)        # newest first
older = store.logs(job_id, plugin="rollout", before_id=page[-1].id)
"""

from plugtune.store.attempt_code import AttemptCode
from plugtune.store.database import sqlite_file
from plugtune.store.records import (
    TRANSITIONS,
    Attempt,
    Checkpoint,
    IllegalTransitionError,
    Job,
    JobStatus,
    LatestMetric,
    LogRow,
    NotFoundError,
    Plugin,
    PluginRole,
    PluginStatus,
    SeriesPoint,
    TrajectorySummary,
    Transition,
)
from plugtune.store.store import Store
from plugtune.store.writer import StoreWriter

__all__ = [
    "TRANSITIONS",
    "Attempt",
    "AttemptCode",
    "Checkpoint",
    "IllegalTransitionError",
    "Job",
    "JobStatus",
    "LatestMetric",
    "LogRow",
    "NotFoundError",
    "Plugin",
    "PluginRole",
    "PluginStatus",
    "SeriesPoint",
    "Store",
    "StoreWriter",
    "sqlite_file",
    "TrajectorySummary",
    "Transition",
]
