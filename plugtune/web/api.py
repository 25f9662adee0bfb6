"""The JSON API under /api: everything the console shows, paginated. OpenAPI schema at /openapi.json."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from plugtune.jobs.report import job_warnings, quarantined_rows
from plugtune.store import Store
from plugtune.store.records import JobStatus
from plugtune.web import charts, code_api, queries, service
from plugtune.web.codeview import zip_code
from plugtune.web.guard import MULTIPART
from plugtune.web.models import (
    ChartsOut,
    CodeFileOut,
    CodeOut,
    GroupOut,
    JobDetail,
    JobPage,
    LogPage,
    NeighborsOut,
    PluginMetricsOut,
    PluginOut,
    ProblemsOut,
    QuarantinedRowOut,
    QuarantineOut,
    RetryOut,
    TrajectoryOut,
    TrajectoryPage,
)
from plugtune.web.params import (
    LEVELS,
    MAX_ID,
    MAX_PAGE,
    PHASES,
    TRAJECTORY_STATUSES,
    BadParameter,
    FilePath,
    JobForm,
    JobId,
    LogForm,
    PluginName,
    RecordId,
    TrajectoryForm,
    choice,
    number,
)
from plugtune.web.views import attempts_out, error_out, plugin_out

router = APIRouter(prefix="/api", tags=["api"])

Limit = Annotated[int, Query(ge=1, le=500, description="rows per page")]
Before = Annotated[
    int | None,
    Query(ge=1, le=MAX_ID, description="cursor: rows older than this (the `before` of the last page)"),
]
STATUSES = tuple(s.value for s in JobStatus)


def _one_of(values: tuple[str, ...], description: str) -> Any:
    """A query parameter whose schema lists what it accepts (blank: not set, as forms send it)."""
    return Query(description=description, json_schema_extra={"enum": ["", *values]})


JobStatusParam = Annotated[str | None, _one_of(STATUSES, "the job's status")]
LevelParam = Annotated[str | None, _one_of(LEVELS + tuple(v.lower() for v in LEVELS), "the line's level")]
TrajectoryStatus = Annotated[str | None, _one_of(TRAJECTORY_STATUSES, "the trajectory's status")]
Phase = Annotated[str | None, _one_of(PHASES, "train, or eval (data.validation)")]


def _store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


@router.get("/jobs", response_model=JobPage)
def list_jobs(
    request: Request,
    q: Annotated[str | None, Query(description="text the job's name contains (any case)")] = None,
    status: JobStatusParam = None,
    cause: Annotated[
        str | None, Query(description="the error's cause (its type when it has none, e.g. Invalid value)")
    ] = None,
    limit: Annotated[int | None, Query(ge=1, le=200, description="rows per page (with offset)")] = None,
    offset: Annotated[int | None, Query(ge=0, le=MAX_ID, description="rows to skip (with limit)")] = None,
    page: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 1,
    page_size: Annotated[int, Query(ge=1, le=200)] = 50,
) -> JobPage:
    """Jobs, newest first, filtered by name (`q`), `status` and error `cause`; paged by `limit` and
    `offset` (or `page` and `page_size`), with the `total` the filters select."""
    store = _store(request)
    form = JobForm.parse(q, status, cause, STATUSES)
    size = limit if limit is not None else page_size
    skip = offset if offset is not None else (page - 1) * page_size
    jobs, total = queries.job_page(store, form.to_filter(), limit=size, offset=skip)
    return JobPage(
        items=service.job_list(store, jobs),
        page=skip // size + 1,
        page_size=size,
        total=total,
        limit=size,
        offset=skip,
    )


@router.get("/jobs/{job_id}", response_model=JobDetail)
def get_job(request: Request, job_id: JobId) -> JobDetail:
    """A job with its current error (type, owner, message, hint), its attempts, its error history
    and its warnings."""
    store = _store(request)
    job = service.require_job(store, job_id)
    errors = store.list_job_errors(job_id)
    return JobDetail(
        job=service.job_view(store, job),
        attempts=attempts_out(store.list_attempts(job_id), errors, store.list_transitions(job_id)),
        errors=[e for e in (error_out(x) for x in errors) if e is not None],
        warnings=job_warnings(store, job_id),
        config={k: v for k, v in job.spec.items() if k not in ("job_file", "base_dir")},
        spec_yaml=job.spec_yaml,
        retry_note=service.retry_note(store, job),
    )


@router.post(
    "/jobs/{job_id}/retry",
    response_model=RetryOut,
    responses={
        422: {"model": ProblemsOut, "description": "the new code was refused; nothing was changed"},
    },
)
async def retry_job(request: Request, job_id: JobId) -> Response:
    """Retry a failed (or cancelled) job by hand: it is queued again and resumes from its last
    checkpoint (restarts at step 0 when it has none; a job that failed validation is validated again)
    with the code it ran. With new plugin code: send the project as `multipart/form-data` (a
    `project` archive, .zip / .tar.gz of its folder, or `project_files` parts named by their path in
    it), as `plugtune jobs retry ID --code DIR` does: each plugin file at the path job.yaml names,
    validated against the stored job.yaml and data, linted and tested on the job's own newest failed
    groups in the sandbox; 422 lists every problem and changes nothing."""
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind == MULTIPART:
        return await code_api.retry_upload(request, job_id)
    job = await run_in_threadpool(service.retry, _store(request), job_id, request.app.state.on_retry)
    out = RetryOut(job_id=job.id, status=job.status, message=f"job {job.id} is {job.status} again")
    return JSONResponse(out.model_dump())


@router.get("/jobs/{job_id}/curves", response_model=ChartsOut)
def training_curves(request: Request, job_id: JobId) -> ChartsOut:
    """Training curves by step: reward (mean and per grader), loss, KL, response length, plugin errors;
    once the job evaluated data.validation, eval pass@1 / pass@k, eval reward and length too."""
    store = _store(request)
    job = service.require_job(store, job_id)
    return ChartsOut(charts=charts.training_charts(store, job_id, job.status))


@router.get("/jobs/{job_id}/quarantine", response_model=QuarantineOut)
def quarantined(request: Request, job_id: JobId) -> QuarantineOut:
    """The dataset rows the job quarantined (poison rows: every trajectory of the row failed with the
    same non-transient cause on hyperparameters.poison_after steps), by file and line, in the order
    it quarantined them, and the command that writes the dataset without them."""
    store = _store(request)
    service.require_job(store, job_id)
    return QuarantineOut(
        rows=[
            QuarantinedRowOut(
                file=q.file,
                line=q.line,
                row=q.row,
                cause=q.cause,
                plugin=q.plugin,
                steps=list(q.steps),
                trajectory_id=q.trajectory_id,
            )
            for q in quarantined_rows(store, job_id)
        ],
        export_command=f"plugtune data quarantine {job_id} --export clean.jsonl",
    )


@router.get("/jobs/{job_id}/plugins", response_model=list[PluginOut])
def list_plugins(request: Request, job_id: JobId) -> list[PluginOut]:
    """The job's plugins (rollout first, then graders) with status and failure reason."""
    store = _store(request)
    service.require_job(store, job_id)
    return [plugin_out(p) for p in store.list_plugins(job_id)]


@router.get("/jobs/{job_id}/plugins/{name}", response_model=PluginOut)
def get_plugin(request: Request, job_id: JobId, name: PluginName) -> PluginOut:
    return plugin_out(service.require_plugin(_store(request), job_id, name))


@router.get("/jobs/{job_id}/plugins/{name}/code", response_model=CodeOut)
def plugin_code(request: Request, job_id: JobId, name: PluginName) -> CodeOut:
    """The exact files that ran (by content hash), as text."""
    plugin, files = service.plugin_code(_store(request), job_id, name)
    return CodeOut(
        code_hash=plugin.code_hash,
        files=[CodeFileOut(path=p, text=d.decode("utf-8", "replace")) for p, d in files.items()],
    )


@router.get("/jobs/{job_id}/plugins/{name}/code.zip", response_class=Response)
def download_code(request: Request, job_id: JobId, name: PluginName) -> Response:
    """The files that ran, zipped under a folder named after the plugin and its code hash."""
    plugin, files = service.plugin_code(_store(request), job_id, name)
    if not files:
        raise service.Missing(f"no code is stored for plugin {name!r} of job {job_id}")
    folder = f"{_filename(plugin.name)}-{plugin.code_hash[:12] or 'code'}"
    return Response(
        zip_code(files, folder),
        media_type="application/zip",
        headers={"Content-Disposition": f'attachment; filename="{folder}.zip"'},
    )


@router.get("/jobs/{job_id}/plugins/{name}/code/{path:path}", response_class=Response)
def download_file(request: Request, job_id: JobId, name: PluginName, path: FilePath) -> Response:
    """One file of the code that ran, as plain text."""
    _, files = service.plugin_code(_store(request), job_id, name)
    if path not in files:
        raise service.Missing(f"plugin {name!r} of job {job_id} has no file {path!r}")
    return Response(
        files[path],
        media_type="text/plain; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{_filename(path.rsplit("/", 1)[-1])}"'},
    )


@router.get("/jobs/{job_id}/plugins/{name}/metrics", response_model=PluginMetricsOut)
def plugin_metrics(
    request: Request,
    job_id: JobId,
    name: PluginName,
    range: Annotated[  # noqa: A002 - the query parameter's name
        str,
        Query(
            description="life (the plugin's lifetime), 1h, 3h, 6h, 12h, 3d, 7d or custom (start and end)",
            json_schema_extra={"enum": list(charts.RANGE_NAMES)},
        ),
    ] = charts.LIFETIME,
    start: Annotated[str | None, Query(description="custom range start, epoch seconds")] = None,
    end: Annotated[str | None, Query(description="custom range end, epoch seconds")] = None,
) -> PluginMetricsOut:
    """Resource monitoring of one plugin over a time range; says so when the data was reclaimed."""
    store = _store(request)
    plugin = service.require_plugin(store, job_id, name)
    try:
        lo, hi = charts.window(range, number("start", start), number("end", end), plugin)
    except ValueError as e:
        raise BadParameter(str(e)) from e
    return charts.plugin_metrics(store, job_id, plugin, range, lo, hi)


@router.get("/jobs/{job_id}/logs", response_model=LogPage)
def list_logs(
    request: Request,
    job_id: JobId,
    plugin: str | None = None,
    level: LevelParam = None,
    trajectory: str | None = None,
    q: Annotated[str | None, Query(description="text the message contains (any case)")] = None,
    before: Before = None,
    after: Annotated[
        int | None, Query(ge=0, le=MAX_ID, description="live tail: only lines newer than this id")
    ] = None,
    order: Annotated[
        str | None,
        Query(
            description="newest (default), or oldest: oldest first from `after` (0: the first line); a "
            "reader that must see every line pages so, passing the answer's `after` back",
            json_schema_extra={"enum": ["", *service.LOG_ORDERS]},
        ),
    ] = None,
    limit: Limit = 100,
) -> LogPage:
    """Custom plugin logs, newest first (or oldest first); filter by plugin, level, trajectory and
    text. A live tail (``after``) that more than ``limit`` new lines reached says how many it skipped."""
    store = _store(request)
    job = service.require_job(store, job_id)
    flt = LogForm.parse(plugin, level, trajectory, q).to_filter()
    if choice("order", order, service.LOG_ORDERS) == "oldest":
        items, cursor = service.log_forward(store, job_id, flt, after=after or 0, limit=limit)
        return LogPage(items=items, after=cursor, job_status=job.status)
    if after is not None:
        items, skipped = service.log_tail(store, job_id, flt, after=after, limit=limit)
        return LogPage(items=items, skipped=skipped, job_status=job.status)
    page = service.log_page(store, job_id, flt, before=before, limit=limit)
    return LogPage(items=page.items, before=page.before, job_status=job.status)


@router.get("/jobs/{job_id}/trajectories", response_model=TrajectoryPage)
def list_trajectories(
    request: Request,
    job_id: JobId,
    status: TrajectoryStatus = None,
    phase: Phase = None,
    plugin: str | None = None,
    step: str | None = None,
    min_reward: str | None = None,
    max_reward: str | None = None,
    q: Annotated[str | None, Query(description="text the messages contain (any case)")] = None,
    before: Before = None,
    limit: Limit = 50,
) -> TrajectoryPage:
    """Trajectory summaries, newest first; filter by phase (train / eval), status, plugin, step, reward
    and text."""
    store = _store(request)
    service.require_job(store, job_id)
    flt = TrajectoryForm.parse(status, plugin, step, min_reward, max_reward, q, phase=phase).to_filter()
    page = service.trajectory_page(store, job_id, flt, before=before, limit=limit)
    return TrajectoryPage(items=page.items, before=page.before)


@router.get("/jobs/{job_id}/trajectories/{trajectory_id}", response_model=TrajectoryOut)
def get_trajectory(request: Request, job_id: JobId, trajectory_id: RecordId) -> TrajectoryOut:
    """One trajectory: messages (tool calls readable), reward per grader, errors, its log lines,
    metrics and tokens (prompt_ids, response_ids, response_mask, response_logprobs)."""
    return service.trajectory_detail(_store(request), job_id, trajectory_id)


@router.get("/jobs/{job_id}/trajectories/{trajectory_id}/neighbors", response_model=NeighborsOut)
def trajectory_neighbors(
    request: Request,
    job_id: JobId,
    trajectory_id: RecordId,
    status: TrajectoryStatus = None,
    phase: Phase = None,
    plugin: str | None = None,
    step: str | None = None,
    min_reward: str | None = None,
    max_reward: str | None = None,
    q: str | None = None,
) -> NeighborsOut:
    """The trajectories just above and below one in the list with the same filters (for up/down keys)."""
    flt = TrajectoryForm.parse(status, plugin, step, min_reward, max_reward, q, phase=phase).to_filter()
    return service.neighbors(_store(request), job_id, trajectory_id, flt)


@router.get("/jobs/{job_id}/groups/{group_id}", response_model=GroupOut)
def get_group(request: Request, job_id: JobId, group_id: RecordId) -> GroupOut:
    """All trajectories of one prompt, with rewards and advantages."""
    store = _store(request)
    service.require_job(store, job_id)
    members = service.group(store, job_id, group_id)
    if not members:
        raise service.Missing(f"job {job_id} has no trajectory group {group_id!r}")
    return GroupOut(group_id=group_id, trajectories=members)


def _filename(name: PluginName) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name) or "code"
