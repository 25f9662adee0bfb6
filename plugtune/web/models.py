"""What the JSON API answers (pydantic models at the API edge; the pages render the same ones)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class DetailOut(BaseModel):
    """Every error answer of the API but a submission's problems: what is wrong and what to do."""

    detail: str


class ErrorOut(BaseModel):
    """A classified failure (DESIGN §2): who owns it, what the backend said, what to do."""

    type: str
    owner: str
    cause: str = ""
    message: str = ""
    hint: str = ""
    plugin: str = ""
    trajectory_id: str = ""
    traceback: str = ""
    evidence: dict[str, Any] = Field(default_factory=dict)
    time: float | None = Field(default=None, description="when the job recorded it (None: the current one)")
    attempt: int | None = Field(default=None, description="the job's attempt it ended (None: none)")


class JobOut(BaseModel):
    id: int
    name: str
    status: str
    created_at: float
    updated_at: float
    steps_done: int
    total_steps: int
    error: ErrorOut | None = None
    next_retry_at: float | None = None
    auto_retries: int = 0
    queue_position: int | None = Field(
        default=None,
        description="a queued job's place in the queue: 1 runs next (the scheduler runs the oldest first)",
    )
    duration_s: float | None = Field(
        default=None, description="since its first attempt started, to its end (or now)"
    )
    eta_s: float | None = Field(
        default=None, description="a running job's estimated time to its last step, at this attempt's pace"
    )
    waiting: str | None = Field(
        default=None,
        description="a running job that waits out a dependency's outage, e.g. 'waiting for dependency "
        "judge: unreachable since 12:03:05' (its calls are retried, not failed)",
    )


class ListedJobOut(JobOut):
    """A job as ``plugtune jobs list --json`` prints it: with its job.yaml (``spec`` validated,
    ``spec_yaml`` as submitted) and ``steps_total`` beside ``total_steps``, as it always has."""

    steps_total: int
    spec: dict[str, Any] = Field(default_factory=dict)
    spec_yaml: str = ""


class JobPage(BaseModel):
    items: list[JobOut]
    page: int
    page_size: int
    total: int = Field(description="how many jobs the filters select")
    limit: int = Field(default=50, description="rows per page")
    offset: int = Field(default=0, description="rows skipped before this page")


class AttemptOut(BaseModel):
    number: int
    trigger: str = Field(description="first run, automatic retry or manual retry")
    status: str
    started_at: float
    ended_at: float | None = None
    resumed_from_step: int = 0
    error: ErrorOut | None = None
    pid: int | None = Field(default=None, description="the attempt's process id")


class JobDetail(BaseModel):
    job: JobOut
    attempts: list[AttemptOut]
    errors: list[ErrorOut] = Field(description="every error the job has had, oldest first")
    warnings: list[str] = Field(
        default_factory=list,
        description="what trained silently wrong (off-policy samples, dropped policy tokens, groups "
        "without a gradient, replies cut at max_new_tokens; with example trajectory ids), oldest first",
    )
    config: dict[str, Any] = Field(
        default_factory=dict, description="the validated job.yaml: model, hyperparameters, data, plugins"
    )
    spec_yaml: str = Field(default="", description="job.yaml as it was submitted")
    retry_note: str = Field(
        default="", description="what a retry does: resume from step N, restart, revalidate"
    )


class PluginOut(BaseModel):
    name: str
    kind: str = Field(description="rollout, grader or group_grader")
    entry: str = ""
    status: str = Field(description="waiting, running, completed or failed")
    failure_reason: str = ""
    code_hash: str = ""
    runtime: dict[str, Any] = Field(default_factory=dict)
    started_at: float | None = None
    ended_at: float | None = None
    retention_expires_at: float | None = None
    monitoring_reclaimed: bool = False


class CheckpointOut(BaseModel):
    job_id: int
    step: int
    path: str
    created_at: float


class ReportAttemptOut(AttemptOut):
    """An attempt as ``plugtune jobs show --json`` prints it: with its job id, as it always has."""

    job_id: int


class ReportPluginOut(PluginOut):
    """A plugin as ``plugtune jobs show --json`` prints it: ``role`` and ``monitoring_expired``
    repeat ``kind`` and ``monitoring_reclaimed`` under the names it has always printed."""

    job_id: int
    role: str
    monitoring_expired: bool


class JobReportOut(JobOut):
    """What ``plugtune jobs show --json`` prints: the job as the API shows it, with its attempts
    (oldest first), error history, plugins, trajectory counts by status, the newest value of every
    training metric, each plugin's ctx.metric values of the newest step that has them, warnings and
    the newest checkpoint. ``steps_total`` repeats ``total_steps`` under the name it has always printed."""

    steps_total: int
    attempts: list[ReportAttemptOut]
    errors: list[ErrorOut] = Field(description="every error the job has had, oldest first")
    plugins: list[ReportPluginOut]
    trajectories: dict[str, int] = Field(description="how many trajectories by status")
    metrics: dict[str, float] = Field(description="the newest value of every training metric")
    plugin_metrics: dict[str, dict[str, dict[str, float]]] = Field(
        description="plugin -> ctx.metric name -> mean, min, max, count and step of the newest step"
    )
    warnings: list[str]
    checkpoint: CheckpointOut | None = None


class CodeFileOut(BaseModel):
    path: str
    text: str


class CodeOut(BaseModel):
    code_hash: str
    files: list[CodeFileOut]


class SeriesOut(BaseModel):
    name: str
    points: list[tuple[float, float | None]] = Field(description="[x, y] pairs; x is a time or a step")


class ChartOut(BaseModel):
    key: str
    title: str
    unit: str = ""
    x: str = Field(default="time", description="time (epoch seconds) or step")
    x_min: float | None = None
    x_max: float | None = None
    empty: str = Field(default="", description="what the chart says when it has no point")
    section: str = Field(
        default="",
        description="the heading it is drawn under: '' (training), or 'Plugin <name>' for "
        "a plugin's ctx.metric curves (mean, min and max per step)",
    )
    series: list[SeriesOut]


class ChartsOut(BaseModel):
    charts: list[ChartOut]


class DependencyPanelOut(BaseModel):
    """A service the plugin declared (job.yaml ``dependencies:`` or its decorator's) and what the
    policy-only relay measured of it."""

    name: str
    url: str
    rpm: int | None = Field(default=None, description="declared requests (connections) per minute")
    concurrency: int | None = Field(default=None, description="declared connections at once")
    timeout_s: float | None = None
    note: str = Field(default="", description="why it is not measured, when it is not")
    summary: dict[str, float] = Field(
        default_factory=dict,
        description="over the range: peak_requests_per_s, rate_limited_share (weighted by requests), "
        "peak_latency_p99_ms; empty when nothing was measured",
    )
    charts: list[ChartOut] = Field(
        description="requests/s, latency p50/p99, errors by cause, budget in use (open, limit, "
        "waiting), 429 share"
    )


class PluginMetricsOut(BaseModel):
    plugin: str
    range: str
    start: float
    end: float
    reclaimed: bool
    reclaimed_message: str = ""
    charts: list[ChartOut]
    dependencies: list[DependencyPanelOut] = Field(
        default_factory=list, description="a panel per declared dependency of the plugin"
    )


class LogOut(BaseModel):
    id: int
    time: float
    level: str
    plugin: str
    source: str = ""
    trajectory_id: str = ""
    call_id: str = ""
    message: str


class ListedLogOut(LogOut):
    """A log line as ``plugtune logs --json`` prints it: with its job id and the plugin instance
    that wrote it, as it always has."""

    job_id: int
    instance_id: str = ""


class LogPage(BaseModel):
    items: list[LogOut] = Field(description="newest first (order=oldest: oldest first)")
    before: int | None = Field(default=None, description="cursor of the next (older) page")
    after: int | None = Field(
        default=None, description="order=oldest: cursor of the next (newer) page; None: no more lines now"
    )
    skipped: int = Field(
        default=0,
        description="live tail (after=): newer lines than `after` left out of this answer, older than "
        "its items (more arrived than `limit`); order=oldest reads every one (capped at 1,000,000)",
    )
    job_status: str = ""


DISCARD_REASON = (
    "why it gave the policy no gradient ('' when it did): a plugin discarded it or its group, it "
    "failed and was dropped, it was unscorable, its group's rewards were all equal, or its step was "
    "not applied (the job stopped or was cancelled)"
)


class TrajectorySummaryOut(BaseModel):
    id: str
    row: int = Field(description="stable row id; the list's order and keyset cursor")
    group_id: str
    step: int
    status: str
    phase: str = Field(default="train", description="train, or eval (a data.validation row)")
    reward: float | None = None
    advantage: float | None = None
    plugins: list[str] = Field(default_factory=list)
    error_cause: str = ""
    preview: str = ""
    discard_reason: str = Field(default="", description=DISCARD_REASON)


class TrajectoryPage(BaseModel):
    items: list[TrajectorySummaryOut]
    before: int | None = Field(default=None, description="cursor of the next (older) page")


class ToolCallOut(BaseModel):
    id: str = ""
    name: str
    arguments: str


class MessageOut(BaseModel):
    role: str
    name: str = ""
    content: str = ""
    tool_call_id: str = ""
    tool_calls: list[ToolCallOut] = Field(default_factory=list)


class TrajectoryErrorOut(BaseModel):
    type: str = ""
    owner: str = ""
    cause: str = ""
    message: str = ""
    plugin: str = ""
    attempt: int = 1
    traceback: str = ""


class TrajectoryLogs(BaseModel):
    items: list[LogOut] = Field(description="oldest first")
    truncated: bool = False


class TrajectoryOut(BaseModel):
    id: str
    group_id: str
    step: int
    attempt: int
    status: str
    phase: str = Field(default="train", description="train, or eval (a data.validation row)")
    stop_reason: str = ""
    discard_reason: str = Field(default="", description=DISCARD_REASON)
    reward: float | None = None
    advantage: float | None = None
    reward_components: dict[str, float | None] = Field(default_factory=dict)
    errors: list[TrajectoryErrorOut] = Field(default_factory=list)
    messages: list[MessageOut] = Field(default_factory=list)
    code_hash: dict[str, str] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(
        default_factory=dict,
        description="the rollout's ctx.metric values by name, each grader's as <grader>/<name>, and "
        "history/rewrites and history/dropped_policy_tokens: how often a call rewrote the "
        "conversation, and the policy tokens that cut from training",
    )
    prompt_ids: list[int] = Field(
        default_factory=list, description="the prompt's token ids, as the policy saw them"
    )
    response_ids: list[int] = Field(
        default_factory=list, description="every token after the prompt: the policy's and tool/template ones"
    )
    response_mask: list[int] = Field(
        default_factory=list, description="per response token: 1 = sampled by the policy"
    )
    response_logprobs: list[float] = Field(
        default_factory=list,
        description="per response token: its sampling log-prob (0.0 where the mask is 0)",
    )
    logs: TrajectoryLogs


class NeighborsOut(BaseModel):
    prev: str | None = Field(default=None, description="the trajectory above in the list (newer)")
    next: str | None = Field(default=None, description="the trajectory below in the list (older)")


class GroupOut(BaseModel):
    group_id: str
    trajectories: list[TrajectoryOut]


class QuarantinedRowOut(BaseModel):
    """A dataset row the job quarantined (a poison row): every trajectory of it failed with the same
    non-transient cause on ``hyperparameters.poison_after`` steps, so it is no longer sampled."""

    file: str = Field(description="the training dataset file")
    line: int = Field(description="the row's 1-based line in it")
    row: int = Field(description="the row's 0-based index among the dataset's rows")
    cause: str = Field(description="500, EOF, FaaS OOM, Invalid reward or Status failure")
    plugin: str = Field(description="the plugin whose calls failed")
    steps: list[int] = Field(description="the steps in which every trajectory of the row failed so")
    trajectory_id: str = Field(description="one of its failed trajectories")


class QuarantineOut(BaseModel):
    rows: list[QuarantinedRowOut]
    export_command: str = Field(description="the command that writes the dataset without them")


class RetryOut(BaseModel):
    job_id: int
    status: str
    message: str


class ProblemOut(BaseModel):
    """One thing wrong with a submitted job: where (file in the project, line, field) and what to do."""

    file: str
    line: int | None = None
    field: str | None = None
    message: str
    hint: str = ""


class SubmittedOut(BaseModel):
    job_id: int
    status: str
    url: str = Field(description="the job's console page")


class DryRunOut(BaseModel):
    ok: bool
    problems: list[ProblemOut] = Field(default_factory=list)


class ProblemsOut(BaseModel):
    detail: str
    problems: list[ProblemOut]
    job_id: int | None = Field(
        default=None, description="the job recorded as failed (absent for a dry run or a refused upload)"
    )


class CancelOut(BaseModel):
    job_id: int
    status: str = Field(description="cancelled, or still running while its attempt stops")
    message: str


class JobEventOut(BaseModel):
    """The data of a `job` event of GET /api/jobs/{id}/events."""

    id: int
    status: str
    steps_done: int
    steps_total: int
    error_cause: str | None = None
    updated_at: float
    queue_position: int | None = None
    waiting: str | None = None
