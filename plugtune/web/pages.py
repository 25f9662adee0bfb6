"""The console's server-rendered pages (Jinja2, autoescaped: plugin and data text stays text)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from plugtune.jobs.report import job_warnings, quarantined_rows
from plugtune.settings import Settings
from plugtune.store import Store
from plugtune.store.records import JobStatus
from plugtune.web import charts, compare, queries, service
from plugtune.web.code_api import code_spans
from plugtune.web.codeview import render_files
from plugtune.web.models import AttemptOut
from plugtune.web.params import (
    LEVELS,
    MAX_PAGE,
    JobForm,
    JobId,
    LogForm,
    RecordId,
    TrajectoryForm,
    choice,
    integer,
)
from plugtune.web.templating import templates
from plugtune.web.views import attempts_out, job_out, plugin_out

router = APIRouter(include_in_schema=False)

JOBS_PER_PAGE = 50
LOGS_PER_PAGE = 100
TRAJECTORIES_PER_PAGE = 50
ATTEMPTS_ON_JOB_PAGE = 20  # the newest; /jobs/{id}/attempts pages through all of them
ATTEMPTS_PER_PAGE = 50


@dataclass(frozen=True)
class Pager:
    label: str
    first_url: str | None = None
    prev_url: str | None = None
    next_url: str | None = None
    is_first: bool = True


def _store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


def _render(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    return templates.TemplateResponse(request, name, context, status_code=status_code)


@router.get("/")
def home() -> RedirectResponse:
    return RedirectResponse("/jobs", status_code=303)


@router.get("/jobs", response_class=HTMLResponse)
def jobs_page(
    request: Request,
    q: str | None = None,
    status: str | None = None,
    cause: str | None = None,
    page: str | None = None,
) -> HTMLResponse:
    store = _store(request)
    statuses = tuple(s.value for s in JobStatus)
    form = JobForm.parse(q, status, cause, statuses)
    number = integer("page", page, minimum=1, maximum=MAX_PAGE) or 1
    jobs, total = queries.job_page(
        store, form.to_filter(), limit=JOBS_PER_PAGE, offset=(number - 1) * JOBS_PER_PAGE
    )
    pages = max(1, math.ceil(total / JOBS_PER_PAGE))
    noun = "job" if total == 1 else "jobs"
    pager = Pager(
        label=f"page {number} of {pages} · {total} {noun}{' found' if form.any else ''}",
        first_url=f"?{form.query()}" if number > 2 else None,
        prev_url=f"?{form.query(page=number - 1)}" if number > 1 else None,
        next_url=f"?{form.query(page=number + 1)}" if number < pages else None,
        is_first=number == 1,
    )
    causes = queries.job_causes(store)
    if form.cause and form.cause not in (value for value, _ in causes):
        causes.append((form.cause, form.cause))
    return _render(
        request,
        "jobs.html",
        jobs=service.job_list(store, jobs),
        statuses=statuses,
        causes=causes,
        filters=form,
        total=total,
        pager=pager,
        page=number,
        page_size=JOBS_PER_PAGE,
        max_compare=compare.MAX_JOBS,
    )


@router.get("/compare", response_class=HTMLResponse)
def compare_page(request: Request, ids: str | None = None) -> HTMLResponse:
    """2-5 jobs side by side (``?ids=3,7``): curves overlaid, failed calls by cause, step time, the
    config keys that differ. The page carries its curves; while a job runs they are drawn again
    from ``GET /api/compare``."""
    wanted = compare.parse_ids(ids)
    view = compare.compare(_store(request), wanted)
    return _render(
        request,
        "compare.html",
        view=view,
        ids=wanted,
        cause_colors=compare.cause_colors(view),
        initial=view.model_dump(include={"charts", "jobs"}),  # the first drawing needs no request
    )


@router.get("/jobs/new", response_class=HTMLResponse)
def new_job_page(request: Request) -> HTMLResponse:
    """Create a job: paste or upload job.yaml, pick its project folder or an archive; the page
    validates as you edit (``POST /api/jobs?dry_run=true``) and submits to ``POST /api/jobs``."""
    return _render(request, "newjob.html")


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: JobId, retried: str | None = None) -> HTMLResponse:
    return _job_page(request, job_id, message="Retry requested: the job is queued again." if retried else "")


def _job_page(request: Request, job_id: int, *, message: str = "", status_code: int = 200) -> HTMLResponse:
    store = _store(request)
    job = service.require_job(store, job_id)
    attempts = _attempts(store, job_id)
    job_view = service.job_view(store, job)
    warnings = job_warnings(store, job_id)
    return _render(
        request,
        "job.html",
        status_code,
        job=job_view,
        attempts=attempts[:ATTEMPTS_ON_JOB_PAGE],
        attempts_total=len(attempts),
        attempts_limit=ATTEMPTS_ON_JOB_PAGE,
        message=message,
        warnings=warnings,
        quarantined=quarantined_rows(store, job_id),
        retry_note=service.retry_note(store, job),
        config=config_rows(job.spec),
        spec_yaml=job.spec_yaml,
        code_spans=code_spans(store, job_id),
    )


@router.get("/jobs/{job_id}/attempts", response_class=HTMLResponse)
def attempts_page(request: Request, job_id: JobId, page: str | None = None) -> HTMLResponse:
    """Every attempt of a job (its retry history), newest first, 50 a page."""
    store = _store(request)
    job = service.require_job(store, job_id)
    attempts = _attempts(store, job_id)
    number = integer("page", page, minimum=1, maximum=MAX_PAGE) or 1
    pages = max(1, math.ceil(len(attempts) / ATTEMPTS_PER_PAGE))
    noun = "attempt" if len(attempts) == 1 else "attempts"
    pager = Pager(
        label=f"page {number} of {pages} · {len(attempts)} {noun}, newest first",
        prev_url=f"?page={number - 1}" if number > 1 else None,
        next_url=f"?page={number + 1}" if number < pages else None,
        is_first=number == 1,
    )
    shown = attempts[(number - 1) * ATTEMPTS_PER_PAGE : number * ATTEMPTS_PER_PAGE]
    return _render(request, "attempts.html", job=job_out(job), attempts=shown, pager=pager, attempts_limit=0)


def _attempts(store: Store, job_id: int) -> list[AttemptOut]:
    return attempts_out(
        store.list_attempts(job_id), store.list_job_errors(job_id), store.list_transitions(job_id)
    )


@router.post("/jobs/{job_id}/retry")
def retry_page(request: Request, job_id: JobId) -> Response:
    try:
        service.retry(_store(request), job_id, request.app.state.on_retry)
    except service.Conflict as e:
        return _job_page(request, job_id, message=f"Cannot retry: {e}", status_code=409)
    return RedirectResponse(f"/jobs/{job_id}?retried=1", status_code=303)


@router.get("/jobs/{job_id}/plugins", response_class=HTMLResponse)
def plugins_page(
    request: Request,
    job_id: JobId,
    plugin: str | None = None,
    range: str | None = None,  # noqa: A002
) -> HTMLResponse:
    store = _store(request)
    job = service.require_job(store, job_id)
    plugins = [plugin_out(p) for p in store.list_plugins(job_id)]
    chosen = next((p for p in plugins if p.name == plugin), plugins[0] if plugins else None)
    if plugin and (chosen is None or chosen.name != plugin):
        raise service.Missing(f"job {job_id} has no plugin {plugin!r}")
    files, traceback = [], ""
    if chosen is not None:
        record, code = service.plugin_code(store, job_id, chosen.name)
        traceback = service.failure_traceback(store, job, record) if chosen.status == "failed" else ""
        failure = f"{chosen.failure_reason}\n{traceback}" if chosen.status == "failed" else ""
        files = render_files(code, failure, record.entry)
    wanted = range if range in charts.RANGE_NAMES else charts.LIFETIME
    return _render(
        request,
        "plugins.html",
        limits=plugin_limits(chosen.runtime, _overrides(job.spec, chosen.name)) if chosen else [],
        retention_days=_retention_days(chosen),
        job=job_out(job),
        plugins=plugins,
        plugin=chosen,
        code_files=files,
        failure_traceback=traceback if traceback not in (chosen.failure_reason if chosen else "") else "",
        ranges=[charts.LIFETIME, *charts.RANGES],
        range=wanted,
    )


@router.get("/jobs/{job_id}/logs", response_class=HTMLResponse)
def logs_page(
    request: Request,
    job_id: JobId,
    plugin: str | None = None,
    level: str | None = None,
    trajectory: str | None = None,
    q: str | None = None,
    before: str | None = None,
    order: str | None = None,
    after: str | None = None,
) -> HTMLResponse:
    store = _store(request)
    job = service.require_job(store, job_id)
    form = LogForm.parse(plugin, level, trajectory, q)
    flt = form.to_filter()
    if choice("order", order, service.LOG_ORDERS) == "oldest":  # from the first line on
        start = integer("after", after, minimum=0) or 0
        lines, cursor = service.log_forward(store, job_id, flt, after=start, limit=LOGS_PER_PAGE)
        pager = _oldest_pager(lines, cursor, start, form.query)
    else:
        cursor = integer("before", before, minimum=1)
        page = service.log_page(store, job_id, flt, before=cursor, limit=LOGS_PER_PAGE)
        lines, pager = page.items, _keyset_pager(page, form.query, "lines")
    plugins = store.list_plugins(job_id)
    reclaimed = [p.name for p in plugins if p.monitoring_expired and (form.plugin in (None, p.name))]
    total = store.count_logs(job_id, **flt.store_kwargs(), cap=service.LOG_COUNT_CAP)
    return _render(
        request,
        "logs.html",
        job=job_out(job),
        lines=lines,
        filters=form,
        levels=LEVELS,
        plugin_names=[p.name for p in plugins],
        reclaimed=reclaimed,
        pager=pager,
        latest_id=max((line.id for line in lines), default=0),
        total=f"{total:,}{'+' if total >= service.LOG_COUNT_CAP else ''}",
        oldest_first=order == "oldest",
        newest_url=f"?{form.query()}",
        oldest_url=f"?{form.query(order='oldest')}",
    )


def _oldest_pager(lines: list[Any], cursor: int | None, start: int, query: Any) -> Pager:
    """Oldest-first pages go forward by the last id shown; « First goes back to the first line."""
    first = f"?{query(order='oldest')}" if start else None
    nxt = f"?{query(order='oldest', after=cursor)}" if cursor is not None else None
    shown = f"{len(lines)} lines, oldest first" if lines else "no lines"
    return Pager(label=shown, first_url=first, next_url=nxt, is_first=False)


@router.get("/jobs/{job_id}/trajectories", response_class=HTMLResponse)
def trajectories_page(
    request: Request,
    job_id: JobId,
    status: str | None = None,
    phase: str | None = None,
    plugin: str | None = None,
    step: str | None = None,
    min_reward: str | None = None,
    max_reward: str | None = None,
    q: str | None = None,
    before: str | None = None,
    t: str | None = None,
) -> HTMLResponse:
    store = _store(request)
    job = service.require_job(store, job_id)
    form = TrajectoryForm.parse(status, plugin, step, min_reward, max_reward, q, phase=phase)
    cursor = integer("before", before, minimum=1)
    page = service.trajectory_page(
        store, job_id, form.to_filter(), before=cursor, limit=TRAJECTORIES_PER_PAGE
    )
    selected = t or (page.items[0].id if page.items else None)
    return _render(
        request,
        "trajectories.html",
        job=job_out(job),
        trajectories=page.items,
        filters=form,
        plugin_names=[p.name for p in store.list_plugins(job_id)],
        pager=_keyset_pager(page, form.query, "trajectories"),
        selected=selected,
    )


@router.get("/jobs/{job_id}/groups/{group_id}", response_class=HTMLResponse)
def group_page(request: Request, job_id: JobId, group_id: RecordId) -> HTMLResponse:
    store = _store(request)
    job = service.require_job(store, job_id)
    members = service.group(store, job_id, group_id)
    if not members:
        raise service.Missing(f"job {job_id} has no trajectory group {group_id!r}")
    return _render(request, "group.html", job=job_out(job), group_id=group_id, trajectories=members)


def config_rows(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """The job's configuration as (field, value) rows: model, data, every hyperparameter, plugins."""
    rows: list[tuple[str, str]] = []
    for key in ("model", "algorithm", "trainer"):
        if spec.get(key) not in (None, ""):
            rows.append((key, str(spec[key])))
    for key, value in (spec.get("data") or {}).items():
        if value not in (None, ""):
            rows.append((f"data.{key}", str(value)))
    for key, value in (spec.get("hyperparameters") or {}).items():
        rows.append((f"hyperparameters.{key}", str(value)))
    for key, ref in _plugin_refs(spec):
        weight = f" (weight {ref['weight']})" if ref.get("weight") is not None else ""
        rows.append((key, f"{ref['entry']}{weight}"))
        if isinstance(ref.get("runtime"), dict) and ref["runtime"]:  # job.yaml's overrides, as written
            given = ", ".join(f"{k}={v}" for k, v in ref["runtime"].items() if v is not None)
            rows.append((f"{key}.runtime", given))
    backend = (spec.get("plugins") or {}).get("runtime_backend")
    if backend:
        rows.append(("plugins.runtime_backend", str(backend)))
    return rows


def _plugin_refs(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """job.yaml's plugin entries as (``plugins.rollout`` / ``plugins.graders[0]``..., entry)."""
    plugins = spec.get("plugins") or {}
    out = []
    rollout = plugins.get("rollout") or {}
    if isinstance(rollout, dict) and rollout.get("entry"):
        out.append(("plugins.rollout", rollout))
    for kind in ("graders", "group_graders"):
        for i, ref in enumerate(plugins.get(kind) or []):
            if isinstance(ref, dict) and ref.get("entry"):
                out.append((f"plugins.{kind}[{i}]", ref))
    return out


def _overrides(spec: dict[str, Any], plugin: str) -> dict[str, Any]:
    """The runtime settings job.yaml gives the plugin named ``plugin`` (its ``name``, or its entry's
    function name), {} when none."""
    for _, ref in _plugin_refs(spec):
        name = ref.get("name") or str(ref["entry"]).rpartition(":")[2]
        if name == plugin and isinstance(ref.get("runtime"), dict):
            return {k: v for k, v in ref["runtime"].items() if v is not None}
    return {}


def _retention_days(plugin: Any) -> float:
    """How long the plugin's monitoring data is kept after it ended: as stamped when it ended, else
    this server's setting."""
    if plugin is not None and plugin.retention_expires_at and plugin.ended_at:
        return round((plugin.retention_expires_at - plugin.ended_at) / 86_400, 3)
    return Settings.from_env().retention_days


def plugin_limits(effective: dict[str, Any], overrides: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """The plugin's runtime limits as (setting, value, set in job.yaml): the effective ones the
    runtime deployed it with (decorator, then job.yaml), else job.yaml's until it is deployed."""
    shown = effective or overrides
    return [(k, str(v), k in overrides) for k, v in sorted(shown.items())]


def _keyset_pager(page: service.Page[Any], query: Any, noun: str) -> Pager:
    first = f"?{query()}" if page.has_newer else None
    prev = None
    if page.has_newer:
        prev = f"?{query(before=page.newer_before)}" if page.newer_before is not None else first
    nxt = f"?{query(before=page.before)}" if page.before is not None else None
    shown = f"{len(page.items)} {noun}, newest first" if page.items else f"no {noun}"
    return Pager(label=shown, first_url=first, prev_url=prev, next_url=nxt, is_first=not page.has_newer)
