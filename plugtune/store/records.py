"""What the store's reads return: frozen records, JSON-ready through ``to_dict()``.

Trajectories come back as :class:`plugtune.types.TrajectoryRecord` (full) or
:class:`TrajectorySummary` (list pages: no messages, no token arrays).
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from typing import Any

from plugtune.types import ErrorRecord


class JobStatus(str, enum.Enum):
    QUEUED = "queued"
    VALIDATING = "validating"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


# Legal job state changes. Retrying a failed or cancelled job puts it back in the queue; a failed
# job waiting for its automatic retry can be cancelled (plugtune.jobs.control decides when).
TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.QUEUED: frozenset(
        {JobStatus.VALIDATING, JobStatus.RUNNING, JobStatus.FAILED, JobStatus.CANCELLED}
    ),
    JobStatus.VALIDATING: frozenset(
        {JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.FAILED, JobStatus.CANCELLED}
    ),
    JobStatus.RUNNING: frozenset(
        {JobStatus.QUEUED, JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED}
    ),
    JobStatus.SUCCEEDED: frozenset(),
    JobStatus.FAILED: frozenset({JobStatus.QUEUED, JobStatus.CANCELLED}),
    JobStatus.CANCELLED: frozenset({JobStatus.QUEUED}),
}


class PluginStatus(str, enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    NOT_STARTED = "not started"  # its attempt ended before it was deployed (another one failed first)


class PluginRole(str, enum.Enum):
    ROLLOUT = "rollout"
    GRADER = "grader"
    GROUP_GRADER = "group_grader"


class IllegalTransitionError(ValueError):
    """Raised when a job is asked to move to a status its current status cannot reach."""

    def __init__(self, job_id: int, current: str, wanted: str) -> None:
        allowed = sorted(s.value for s in TRANSITIONS[JobStatus(current)])
        reachable = ", ".join(allowed) if allowed else "nothing (it is final)"
        super().__init__(
            f"job {job_id} is {current}; it cannot become {wanted} (from {current} it can become: "
            f"{reachable})"
        )
        self.job_id = job_id
        self.current = current
        self.wanted = wanted


class NotFoundError(LookupError):
    """Raised when a write names a job (or attempt, plugin) the store does not hold."""


class DamagedRecordError(ValueError):
    """Raised when a stored row cannot be read back as what was written (a column's bytes or JSON
    damaged, or written by something else); the message names the row and the column."""


class _Record:
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]


@dataclass(frozen=True)
class Job(_Record):
    id: int
    name: str
    spec: dict[str, Any]
    spec_yaml: str
    status: str
    created_at: float
    updated_at: float
    steps_done: int
    steps_total: int
    error: ErrorRecord | None  # the current one (time and attempt None); the history is list_job_errors
    next_retry_at: float | None
    auto_retries: int

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "error": self.error.to_dict() if self.error else None}


@dataclass(frozen=True)
class Transition(_Record):
    job_id: int
    from_status: str | None
    to_status: str
    time: float
    reason: str


@dataclass(frozen=True)
class Attempt(_Record):
    job_id: int
    number: int
    pid: int | None
    started_at: float
    ended_at: float | None
    status: str  # running | succeeded | failed | cancelled
    error: ErrorRecord | None
    resumed_from_step: int

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "error": self.error.to_dict() if self.error else None}


@dataclass(frozen=True)
class Plugin(_Record):
    job_id: int
    name: str
    role: str
    entry: str
    status: str
    failure_reason: str
    code_hash: str
    runtime: dict[str, Any]
    started_at: float | None
    ended_at: float | None
    retention_expires_at: float | None
    monitoring_expired: bool  # its metric points and log lines were purged after retention


@dataclass(frozen=True)
class LogRow(_Record):
    id: int  # keyset cursor: pass the last row's id as before_id for the next (older) page
    job_id: int
    time: float
    level: str
    plugin: str
    source: str
    call_id: str
    trajectory_id: str
    instance_id: str
    message: str


@dataclass(frozen=True)
class SeriesPoint(_Record):
    time: float
    value: float
    step: int | None = None
    count: int = 1  # raw points averaged into this one by downsampling


@dataclass(frozen=True)
class LatestMetric(_Record):
    """The newest point of one series."""

    job_id: int
    plugin: str  # "" for training metrics
    name: str
    time: float
    value: float
    step: int | None


@dataclass(frozen=True)
class TrajectorySummary(_Record):
    id: int  # row id: stable across upserts; newest-first order and keyset cursor
    job_id: int
    trajectory_id: str
    group_id: str
    step: int
    sample_index: int
    rollout_index: int
    attempt: int
    policy_version: int
    status: str
    phase: str  # train | eval
    reward: float | None
    advantage: float | None
    stop_reason: str
    prompt_tokens: int
    response_tokens: int
    plugins: list[str]
    error_cause: str
    preview: str
    discard_reason: str = ""  # why it gave no gradient ('' when it did)


@dataclass(frozen=True)
class Checkpoint(_Record):
    job_id: int
    step: int
    path: str
    created_at: float
