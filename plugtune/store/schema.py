"""The store's tables and the indexes the console's queries need (SQLAlchemy Core).

Times are epoch seconds (double precision). JSON documents are stored as text; token arrays as
packed little-endian bytes (see ``trajectories.py``). Every monitoring table is keyed by
``job_id`` first so one job's pages never scan another job's rows.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

metadata = MetaData()

SCHEMA_VERSION = 4  # bump when a table changes; Store.open refuses a database of another version

#: What turns a database of an older version into the next one (``{trajectories}``: the qualified
#: table name). Version 2: trajectories.phase (train | eval). Version 3:
#: trajectories.discard_reason (why a trajectory gave no gradient; '' for the older ones). Version 4:
#: trajectories.trainer_logprobs and dropped_spans (the token view's; NULL for the older ones).
#: ``{blob}``: the dialect's binary type.
MIGRATIONS: dict[int, list[str]] = {
    1: [
        "ALTER TABLE {trajectories} ADD COLUMN phase VARCHAR(16) NOT NULL DEFAULT 'train'",
        "CREATE INDEX ix_trajectories_phase ON {trajectories} (job_id, phase, id)",
    ],
    2: ["ALTER TABLE {trajectories} ADD COLUMN discard_reason TEXT NOT NULL DEFAULT ''"],
    3: [
        "ALTER TABLE {trajectories} ADD COLUMN trainer_logprobs {blob}",
        "ALTER TABLE {trajectories} ADD COLUMN dropped_spans TEXT",
    ],
}

# BIGINT on PostgreSQL, but INTEGER on SQLite so the column is the rowid (autoincrement, no copy).
RowId = BigInteger().with_variant(Integer(), "sqlite")
Time = Float(precision=53)


def _job_fk() -> Column[int]:
    return Column("job_id", Integer, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False)


store_meta = Table(
    "plugtune_meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

jobs = Table(
    "jobs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(200), nullable=False),
    Column("spec", Text, nullable=False),  # JSON
    Column("spec_yaml", Text, nullable=False, default=""),
    Column("status", String(16), nullable=False),
    Column("created_at", Time, nullable=False),
    Column("updated_at", Time, nullable=False),
    Column("steps_done", Integer, nullable=False, default=0),
    Column("steps_total", Integer, nullable=False, default=0),
    Column("error_type", String(64)),
    Column("error_owner", String(16)),
    Column("error_cause", String(64)),
    Column("error_message", Text),
    Column("error_hint", Text),
    Column("error_evidence", Text),  # JSON
    Column("next_retry_at", Time),
    Column("auto_retries", Integer, nullable=False, default=0),
)
Index("ix_jobs_status", jobs.c.status, jobs.c.id)

job_transitions = Table(
    "job_transitions",
    metadata,
    Column("id", RowId, primary_key=True, autoincrement=True),
    _job_fk(),
    Column("from_status", String(16)),
    Column("to_status", String(16), nullable=False),
    Column("time", Time, nullable=False),
    Column("reason", Text, nullable=False, default=""),
)
Index("ix_job_transitions_job", job_transitions.c.job_id, job_transitions.c.id)

attempts = Table(
    "attempts",
    metadata,
    _job_fk(),
    Column("number", Integer, nullable=False),
    Column("pid", Integer),
    Column("started_at", Time, nullable=False),
    Column("ended_at", Time),
    Column("status", String(16), nullable=False),
    Column("error", Text),  # JSON
    Column("resumed_from_step", Integer, nullable=False, default=0),
    UniqueConstraint("job_id", "number", name="uq_attempts_job_number"),
)

job_errors = Table(
    "job_errors",
    metadata,
    Column("id", RowId, primary_key=True, autoincrement=True),
    _job_fk(),
    Column("attempt", Integer),
    Column("time", Time, nullable=False),
    Column("type", String(64), nullable=False),
    Column("owner", String(16), nullable=False),
    Column("cause", String(64), nullable=False, default=""),
    Column("message", Text, nullable=False, default=""),
    Column("hint", Text, nullable=False, default=""),
    Column("evidence", Text, nullable=False, default="{}"),  # JSON
)
Index("ix_job_errors_job", job_errors.c.job_id, job_errors.c.id)

plugins = Table(
    "plugins",
    metadata,
    _job_fk(),
    Column("name", String(200), nullable=False),
    Column("role", String(16), nullable=False),  # rollout | grader | group_grader
    Column("entry", Text, nullable=False),
    Column("status", String(16), nullable=False),  # waiting | running | completed | failed | not started
    Column("failure_reason", Text, nullable=False, default=""),
    Column("code_hash", String(128), nullable=False, default=""),
    Column("runtime", Text, nullable=False, default="{}"),  # JSON
    Column("started_at", Time),
    Column("ended_at", Time),
    Column("retention_expires_at", Time),
    Column("monitoring_purged_at", Time),
    UniqueConstraint("job_id", "name", name="uq_plugins_job_name"),
)
Index("ix_plugins_retention", plugins.c.retention_expires_at)

code_files = Table(
    "code_files",
    metadata,
    Column("code_hash", String(128), primary_key=True),
    Column("path", Text, primary_key=True),
    Column("content", LargeBinary, nullable=False),
)

metric_points = Table(
    "metric_points",
    metadata,
    Column("id", RowId, primary_key=True, autoincrement=True),
    _job_fk(),
    Column("plugin", String(200), nullable=False),  # "" for training metrics
    Column("name", String(200), nullable=False),
    Column("time", Time, nullable=False),
    Column("step", Integer),
    Column("value", Float(precision=53), nullable=False),
)
# Covering (value, step): a chart reads only this index, never the table.
Index(
    "ix_metric_points_series",
    metric_points.c.job_id,
    metric_points.c.plugin,
    metric_points.c.name,
    metric_points.c.time,
    metric_points.c.value,
    metric_points.c.step,
)

# One row per series with its newest point: series lists and "current value" reads (the jobs list,
# /metrics) cost O(series), not O(points). Kept up to date by every metric insert.
metric_series = Table(
    "metric_series",
    metadata,
    _job_fk(),
    Column("plugin", String(200), nullable=False),
    Column("name", String(200), nullable=False),
    Column("time", Time, nullable=False),
    Column("step", Integer),
    Column("value", Float(precision=53), nullable=False),
    UniqueConstraint("job_id", "plugin", "name", name="uq_metric_series"),
)

log_lines = Table(
    "log_lines",
    metadata,
    Column("id", RowId, primary_key=True, autoincrement=True),
    _job_fk(),
    Column("time", Time, nullable=False),
    Column("level", String(16), nullable=False),
    Column("plugin", String(200), nullable=False),
    Column("source", String(16), nullable=False),
    Column("call_id", String(64), nullable=False, default=""),
    Column("trajectory_id", String(200), nullable=False, default=""),
    Column("instance_id", String(64), nullable=False, default=""),
    Column("message", Text, nullable=False),
)
# Newest-first keyset pages: every filter the console offers has an index ending in id.
Index("ix_log_lines_job", log_lines.c.job_id, log_lines.c.id)
Index("ix_log_lines_plugin", log_lines.c.job_id, log_lines.c.plugin, log_lines.c.id)
Index("ix_log_lines_level", log_lines.c.job_id, log_lines.c.level, log_lines.c.id)
Index("ix_log_lines_trajectory", log_lines.c.job_id, log_lines.c.trajectory_id, log_lines.c.id)

trajectories = Table(
    "trajectories",
    metadata,
    Column("id", RowId, primary_key=True, autoincrement=True),
    _job_fk(),
    Column("trajectory_id", String(200), nullable=False),
    Column("group_id", String(200), nullable=False),
    Column("step", Integer, nullable=False),
    Column("sample_index", Integer, nullable=False),
    Column("rollout_index", Integer, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("policy_version", Integer, nullable=False),
    Column("status", String(16), nullable=False),
    Column("phase", String(16), nullable=False, default="train"),  # train | eval
    Column("reward", Float(precision=53)),
    Column("advantage", Float(precision=53)),
    Column("stop_reason", String(64), nullable=False, default=""),
    Column("discard_reason", Text, nullable=False, default=""),
    Column("reward_components", Text, nullable=False),  # JSON
    Column("messages", Text, nullable=False),  # JSON
    Column("tools", Text, nullable=False),  # JSON
    Column("prompt_ids", LargeBinary, nullable=False),  # int32 LE
    Column("response_ids", LargeBinary, nullable=False),  # int32 LE
    Column("response_mask", LargeBinary, nullable=False),  # uint8
    Column("response_logprobs", LargeBinary, nullable=False),  # float64 LE
    Column("trainer_logprobs", LargeBinary),  # float64 LE; NULL or empty: not scored by the trainer
    Column("dropped_spans", Text),  # JSON: the spans history rewrites cut (types.DroppedSpan)
    Column("errors", Text, nullable=False),  # JSON
    Column("metrics", Text, nullable=False),  # JSON
    Column("timing", Text, nullable=False),  # JSON
    Column("code_hash", Text, nullable=False),  # JSON
    # Denormalised for list pages, so a summary never reads messages or tokens.
    Column("prompt_tokens", Integer, nullable=False),
    Column("response_tokens", Integer, nullable=False),
    Column("plugins", Text, nullable=False),  # " name1 name2 " (code_hash keys + error plugins)
    Column("error_cause", String(64), nullable=False, default=""),
    Column("preview", Text, nullable=False, default=""),
    Column("created_at", Time, nullable=False),
    Column("updated_at", Time, nullable=False),
    UniqueConstraint("job_id", "trajectory_id", name="uq_trajectories_job_tid"),
)
Index("ix_trajectories_job", trajectories.c.job_id, trajectories.c.id)
Index("ix_trajectories_status", trajectories.c.job_id, trajectories.c.status, trajectories.c.id)
Index("ix_trajectories_step", trajectories.c.job_id, trajectories.c.step, trajectories.c.id)
Index("ix_trajectories_phase", trajectories.c.job_id, trajectories.c.phase, trajectories.c.id)
Index("ix_trajectories_reward", trajectories.c.job_id, trajectories.c.reward)
Index("ix_trajectories_group", trajectories.c.job_id, trajectories.c.group_id)

checkpoints = Table(
    "checkpoints",
    metadata,
    Column("id", RowId, primary_key=True, autoincrement=True),
    _job_fk(),
    Column("step", Integer, nullable=False),
    Column("path", Text, nullable=False),
    Column("created_at", Time, nullable=False),
)
Index("ix_checkpoints_job_step", checkpoints.c.job_id, checkpoints.c.step)

# A user's (or the control plane's) ask to cancel a running job, written before its attempt gets
# SIGTERM: the attempt and its supervisor tell a cancel from any other SIGTERM by it. One row a job,
# cleared when the job's next run starts. A new table: created on open, no schema version change.
cancel_requests = Table(
    "cancel_requests",
    metadata,
    Column("job_id", Integer, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("requested_at", Time, nullable=False),
    Column("reason", Text, nullable=False, default=""),
)

# A labelled re-grade of a job's trajectories (``plugtune regrade --failed-only``): each row is one
# trajectory's new grade beside its original, which is never rewritten (training used it). A new
# table: created on open, no schema version change.
regrades = Table(
    "regrades",
    metadata,
    Column("id", RowId, primary_key=True, autoincrement=True),
    _job_fk(),
    Column("label", String(200), nullable=False),
    Column("trajectory_id", String(200), nullable=False),
    Column("step", Integer, nullable=False),
    Column("graders", Text, nullable=False),  # JSON: the graders re-run
    Column("status", String(16), nullable=False),
    Column("reward", Float(precision=53)),
    Column("reward_components", Text, nullable=False),  # JSON
    Column("errors", Text, nullable=False),  # JSON
    Column("kind", String(32), nullable=False),  # the flip: "failed→scored", "unchanged", ...
    Column("created_at", Time, nullable=False),
)
Index("ix_regrades_job", regrades.c.job_id, regrades.c.label, regrades.c.id)

# The plugin code each attempt of a job ran: the whole set's hash, each plugin file's code hash (the
# files are in code_files) and where it came from (the submission, or `jobs retry --code DIR`). One
# row an attempt, written when it starts. A new table: created on open, no schema version change; an
# attempt recorded before it has no row (it ran the submitted code).
attempt_code = Table(
    "attempt_code",
    metadata,
    _job_fk(),
    Column("attempt", Integer, nullable=False),
    Column("code_hash", String(128), nullable=False),
    Column("plugins", Text, nullable=False),  # JSON: plugin file -> {code_hash, file, path}
    Column("source", Text, nullable=False, default=""),
    Column("created_at", Time, nullable=False),
    UniqueConstraint("job_id", "attempt", name="uq_attempt_code_job_attempt"),
)
