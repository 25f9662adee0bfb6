"""What the API and the pages both do: find a job or a plugin, read a page of logs or trajectories,
open a trajectory with its log lines, and retry a job."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from plugtune.jobs import control
from plugtune.jobs.caller import waiting_summary
from plugtune.jobs.control import NotRetryableError, retry_job
from plugtune.jobs.plugin_metrics import latest_stats
from plugtune.jobs.report import job_warnings
from plugtune.jobs.scheduler import JobNotFoundError
from plugtune.store import Store
from plugtune.store.records import Attempt, IllegalTransitionError, Job, NotFoundError, Plugin
from plugtune.web import queries
from plugtune.web.models import (
    CheckpointOut,
    JobOut,
    JobReportOut,
    ListedJobOut,
    LogOut,
    NeighborsOut,
    ReportAttemptOut,
    ReportPluginOut,
    TrajectoryLogs,
    TrajectoryOut,
    TrajectorySummaryOut,
)
from plugtune.web.queries import LogFilter, TrajectoryFilter
from plugtune.web.views import (
    attempts_out,
    error_out,
    job_out,
    log_out,
    plugin_out,
    summary_out,
    trajectory_out,
)

Row = TypeVar("Row", LogOut, TrajectorySummaryOut)

ENDED = ("succeeded", "failed", "cancelled")

TRAJECTORY_LOG_LINES = 500  # shown with a trajectory; the Logs page pages through the rest
LOG_ORDERS = ("newest", "oldest")
LOG_COUNT_CAP = 1_000_000  # line counts stop here ("1,000,000+"): cheap on any job


class Missing(LookupError):
    """Raised when a job, plugin, trajectory or code version asked for does not exist."""


class Conflict(ValueError):
    """Raised when an action does not apply to the job's current state (e.g. retrying a running job)."""


@dataclass(frozen=True)
class Page(Generic[Row]):
    """One newest-first keyset page: its rows and the cursors of the pages around it."""

    items: list[Row]
    before: int | None  # cursor of the next (older) page; None on the last page
    has_newer: bool  # is there a page above (newer rows)?
    newer_before: int | None  # cursor of that page; None means the first page


def require_job(store: Store, job_id: int) -> Job:
    job = store.get_job(job_id)
    if job is None:
        raise Missing(f"job {job_id} does not exist")
    return job


def job_view(store: Store, job: Job) -> JobOut:
    """The job as the API shows it; an error's plugin reference (name or entry) becomes the plugin's
    name; with its queue position, duration and ETA."""
    out = job_out(job, queue_positions(store))
    if out.error is not None and out.error.plugin:
        name = plugin_name(store.list_plugins(job.id), out.error.plugin)
        out = out.model_copy(update={"error": out.error.model_copy(update={"plugin": name})})
    duration, eta = timing(job, store.list_attempts(job.id), time.time())
    return out.model_copy(update={"duration_s": duration, "eta_s": eta, "waiting": waiting_of(store, job)})


def job_report(store: Store, job_id: int) -> JobReportOut:
    """What ``plugtune jobs show --json`` prints (JobReportOut): the job as the API shows it
    (job_view), its attempts oldest first, error history, plugins, trajectory counts, newest metrics,
    each plugin's ctx.metric stats, warnings and newest checkpoint. Raises Missing when there is no
    such job."""
    job = require_job(store, job_id)
    newest = store.latest_metrics([job_id], plugin="")
    latest = {m.name: m.value for m in newest}
    plugins = store.list_plugins(job_id)
    errors = store.list_job_errors(job_id)
    attempts = attempts_out(store.list_attempts(job_id), errors, store.list_transitions(job_id))
    checkpoint = store.latest_checkpoint(job_id)
    return JobReportOut(
        **dict(job_view(store, job)),
        steps_total=job.steps_total,
        attempts=[ReportAttemptOut(**dict(a), job_id=job_id) for a in reversed(attempts)],
        errors=[e for e in (error_out(x) for x in errors) if e is not None],
        plugins=[
            ReportPluginOut(
                **dict(plugin_out(p)), job_id=job_id, role=p.role, monitoring_expired=p.monitoring_expired
            )
            for p in plugins
        ],
        trajectories=store.trajectory_status_counts(job_id),
        metrics=latest,
        plugin_metrics=latest_stats(latest, {m.name: m.step for m in newest}, [p.name for p in plugins]),
        warnings=job_warnings(store, job_id),
        checkpoint=CheckpointOut(**checkpoint.to_dict()) if checkpoint is not None else None,
    )


def waiting_of(store: Store, job: Job) -> str | None:
    """What a running job waits for (a dependency's outage, from its latest metrics), or None."""
    if job.status != "running":
        return None
    latest = {m.name: m.value for m in store.latest_metrics([job.id], plugin="")}
    return waiting_summary(latest) or None


def job_list(store: Store, jobs: list[Job]) -> list[JobOut]:
    positions = queue_positions(store)
    return [job_out(j, positions) for j in jobs]


def job_listing(store: Store, jobs: list[Job]) -> list[ListedJobOut]:
    """The jobs as ``plugtune jobs list --json`` prints them (the API's JobOut with their job.yaml)."""
    positions = queue_positions(store)
    return [
        ListedJobOut(
            **dict(job_out(j, positions)), steps_total=j.steps_total, spec=j.spec, spec_yaml=j.spec_yaml
        )
        for j in jobs
    ]


def queue_positions(store: Store) -> dict[int, int]:
    """Queued job id -> its place in the queue (1 runs next: the scheduler takes the oldest)."""
    return control.queue_positions(store)


def timing(job: Job, attempts: list[Attempt], now: float) -> tuple[float | None, float | None]:
    """(seconds since the first attempt started, to the job's end or now; seconds to the last step
    at the running attempt's pace, None until it has done a step)."""
    if not attempts:
        return None, None
    ended = job.updated_at if job.status in ENDED else None
    duration = max(0.0, (ended or now) - attempts[0].started_at)
    last = attempts[-1]
    done = job.steps_done - last.resumed_from_step
    if job.status != "running" or last.status != "running" or done <= 0 or not job.steps_total:
        return duration, None
    per_step = (now - last.started_at) / done
    return duration, max(0.0, per_step * (job.steps_total - job.steps_done))


def plugin_name(plugins: list[Plugin], ref: str) -> str:
    """The name of the plugin ``ref`` names (errors from the runtime name a plugin by its entry)."""
    for p in plugins:
        if ref in (p.name, p.entry):
            return p.name
    return ref


def failure_traceback(store: Store, job: Job, plugin: Plugin) -> str:
    """The traceback of the job's error when that error is this plugin's (shown on its code view)."""
    error = job.error
    if error is None or plugin_name([plugin], str(error.evidence.get("plugin") or "")) != plugin.name:
        return ""
    return str(error.evidence.get("traceback") or "")


def require_plugin(store: Store, job_id: int, name: str) -> Plugin:
    plugin = store.get_plugin(job_id, name)
    if plugin is None:
        names = ", ".join(p.name for p in store.list_plugins(job_id)) or "none"
        raise Missing(f"job {job_id} has no plugin {name!r} (its plugins: {names})")
    return plugin


def plugin_code(store: Store, job_id: int, name: str) -> tuple[Plugin, dict[str, bytes]]:
    plugin = require_plugin(store, job_id, name)
    files = store.get_code(plugin.code_hash) if plugin.code_hash else {}
    return plugin, files


def log_page(store: Store, job_id: int, flt: LogFilter, *, before: int | None, limit: int) -> Page[LogOut]:
    rows = store.logs(job_id, **flt.store_kwargs(), before_id=before, limit=limit + 1)
    items = [log_out(r) for r in rows[:limit]]
    has_newer, newer_before = False, None
    if before is not None and items:
        has_newer, newer_before = queries.newer_logs_cursor(store, job_id, flt, items[0].id, limit)
    elif before is not None:
        has_newer = True
    return Page(items, items[-1].id if len(rows) > limit else None, has_newer, newer_before)


def log_tail(
    store: Store, job_id: int, flt: LogFilter, *, after: int, limit: int
) -> tuple[list[LogOut], int]:
    """The newest ``limit`` lines after ``after``, and how many lines between were left out."""
    rows = store.logs(job_id, **flt.store_kwargs(), after_id=after, limit=limit)
    skipped = 0
    if rows and len(rows) >= limit:
        oldest_shown = rows[-1].id
        skipped = store.count_logs(
            job_id, **flt.store_kwargs(), after_id=after, before_id=oldest_shown, cap=LOG_COUNT_CAP
        )
    return [log_out(r) for r in rows], skipped


def log_forward(
    store: Store, job_id: int, flt: LogFilter, *, after: int, limit: int
) -> tuple[list[LogOut], int | None]:
    """The oldest ``limit`` lines after ``after``, oldest first, and the next page's ``after``."""
    rows = store.logs(job_id, **flt.store_kwargs(), after_id=after, limit=limit + 1, oldest_first=True)
    items = [log_out(r) for r in rows[:limit]]
    return items, items[-1].id if len(rows) > limit else None


def trajectory_page(
    store: Store, job_id: int, flt: TrajectoryFilter, *, before: int | None, limit: int
) -> Page[TrajectorySummaryOut]:
    rows = store.trajectories(job_id, **flt.store_kwargs(), before_id=before, limit=limit + 1)
    items = [summary_out(r) for r in rows[:limit]]
    has_newer, newer_before = False, None
    if before is not None and items:
        has_newer, newer_before = queries.newer_trajectories_cursor(store, job_id, flt, items[0].row, limit)
    elif before is not None:
        has_newer = True
    return Page(items, items[-1].row if len(rows) > limit else None, has_newer, newer_before)


def trajectory_detail(store: Store, job_id: int, trajectory_id: str) -> TrajectoryOut:
    record = store.get_trajectory(job_id, trajectory_id)
    if record is None:
        raise Missing(f"job {job_id} has no trajectory {trajectory_id!r}")
    rows = store.logs(job_id, trajectory_id=trajectory_id, limit=TRAJECTORY_LOG_LINES)
    logs = TrajectoryLogs(
        items=[log_out(r) for r in reversed(rows)], truncated=len(rows) >= TRAJECTORY_LOG_LINES
    )
    return trajectory_out(record, logs)


def neighbors(store: Store, job_id: int, trajectory_id: str, flt: TrajectoryFilter) -> NeighborsOut:
    try:
        newer, older = store.trajectory_neighbors(job_id, trajectory_id, **flt.store_kwargs())
    except NotFoundError as e:
        raise Missing(str(e)) from e
    return NeighborsOut(prev=newer, next=older)


def group(store: Store, job_id: int, group_id: str) -> list[TrajectoryOut]:
    empty = TrajectoryLogs(items=[], truncated=False)
    return [trajectory_out(r, empty) for r in store.group(job_id, group_id)]


VALIDATION = ("Invalid data", "Invalid value")


def retry_note(store: Store, job: Job) -> str:
    """What a retry of the job will do, as the Retry button says it."""
    if job.error is not None and job.error.type in VALIDATION and not store.list_attempts(job.id):
        return (
            "validates job.yaml and the data again: fix the problems above first "
            "(the same files fail the same way)"
        )
    checkpoint = store.latest_checkpoint(job.id)
    if checkpoint is None:
        return "restarts at step 0: no checkpoint was saved"
    return f"resumes from the checkpoint of step {checkpoint.step}"


def retry(store: Store, job_id: int, on_retry: Callable[[str], None] | None) -> Job:
    """Manual retry: the job goes back to the queue (it resumes from its last checkpoint, or restarts
    at step 0 without one)."""
    job = require_job(store, job_id)
    if job.status not in ("failed", "cancelled"):
        raise Conflict(f"job {job_id} is {job.status}; only a failed or cancelled job can be retried")
    try:
        retry_job(store, job_id)
    except (IllegalTransitionError, NotFoundError, JobNotFoundError, NotRetryableError) as e:
        raise Conflict(str(e)) from e
    if on_retry is not None:
        on_retry(str(job_id))
    return require_job(store, job_id)
