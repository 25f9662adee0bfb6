"""The control plane under /api: submit a job (job.yaml, or a multipart upload of it with its project),
cancel it, delete an ended one, and watch it live (server-sent events)."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException

from plugtune.errors import HINTS, DataError, ErrorType, Problem
from plugtune.jobs.control import check_job, create_job, delete_job
from plugtune.jobs.scheduler import request_cancel
from plugtune.jobs.submission import (
    MAX_FILES,
    SubmissionError,
    Upload,
    new_folder,
    unpack,
    write_files,
    write_spec,
)
from plugtune.settings import Settings
from plugtune.spec import job_yaml
from plugtune.spec.reach import Confinement, SubmissionPolicy
from plugtune.store import Store
from plugtune.web import service
from plugtune.web.guard import MULTIPART, YAML_TYPES
from plugtune.web.job_events import JobWatch
from plugtune.web.models import (
    CancelOut,
    DryRunOut,
    JobEventOut,
    ProblemOut,
    ProblemsOut,
    SubmittedOut,
)
from plugtune.web.params import BadParameter, JobId

router = APIRouter(prefix="/api", tags=["control"])

EVENTS_POLL_S = 0.5
KEEPALIVE_S = 15.0
MAX_STREAM_S = 3600.0  # the browser's EventSource reconnects after this
RECONNECT_MS = 2000
PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    422: {"model": ProblemsOut, "description": "job.yaml, its data or the upload has problems"}
}


def _store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


def _home(request: Request) -> Path:
    home: Path | None = request.app.state.home
    return home if home is not None else Settings.from_env().home


@router.post(
    "/jobs",
    status_code=201,
    response_model=SubmittedOut,
    responses={200: {"model": DryRunOut, "description": "dry run: no problems"}, **PROBLEM_RESPONSES},
)
async def submit_job(
    request: Request,
    dry_run: Annotated[bool, Query(description="validate only; create nothing")] = False,
) -> Response:
    """Submit a job: the body is job.yaml (`application/x-yaml`; its relative paths start at the
    server's working directory), or `multipart/form-data` with `spec` (job.yaml's text) and the
    project as a `project` archive (.zip / .tar.gz of job.yaml's folder) or `project_files` parts
    (each named by its path in the folder). Validated as `plugtune run` does: 422 lists every problem
    with file, line and field; a job that fails validation is recorded failed (its id is in the
    answer) unless `dry_run`. Its data and plugin files must be among the files it sent, or in a
    folder the server shares (`plugtune serve --shared-dir`); its `secrets` must be ones the server
    allows (`plugtune serve --secret NAME`). Up to 32 MiB; archives unpack to at most 256 MiB in
    2,000 files."""
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    text: str | None
    archive: tuple[str, bytes] | None
    files: list[Upload]
    if kind in YAML_TYPES:
        text, archive, files = (await request.body()).decode("utf-8"), None, []
    elif kind == MULTIPART:
        text, archive, files = await _read_form(request)
    else:
        raise BadParameter(
            f"POST /api/jobs takes job.yaml as application/x-yaml, or multipart/form-data with 'spec' "
            f"and 'project' / 'project_files'; got Content-Type {kind or '(none)'!r}"
        )
    home, policy = _home(request), request.app.state.submission_policy
    outcome = await run_in_threadpool(_submit, _store(request), home, text, archive, files, dry_run, policy)
    if isinstance(outcome, int):
        wake = request.app.state.on_retry
        if wake is not None:
            wake(str(outcome))
        return JSONResponse(
            SubmittedOut(job_id=outcome, status="queued", url=f"/jobs/{outcome}").model_dump(),
            status_code=201,
        )
    return outcome


async def _read_form(request: Request) -> tuple[str | None, tuple[str, bytes] | None, list[Upload]]:
    try:
        form = await request.form(max_files=MAX_FILES + 2, max_fields=16)
    except (MultiPartException, HTTPException) as exc:  # starlette turns the first into the second
        reason = exc.message if isinstance(exc, MultiPartException) else exc.detail
        raise BadParameter(
            f"the multipart body cannot be read ({reason}): send 'spec' (job.yaml's text, at most 1 MiB as a "
            f"field, or as a file part), 'project' and up to {MAX_FILES} 'project_files' parts"
        ) from None
    spec = form.get("spec")
    text: str | None
    if isinstance(spec, UploadFile):
        text = _utf8(await spec.read(), "spec")
    else:
        text = spec if spec and spec.strip() else None
    project = form.get("project")
    archive = None
    if isinstance(project, UploadFile):
        archive = (project.filename or "project", await project.read())
    elif project:
        raise BadParameter("'project' must be a file part (a .zip or .tar.gz of the job's folder)")
    files = []
    for part in form.getlist("project_files"):
        if not isinstance(part, UploadFile):
            raise BadParameter("each 'project_files' part must be a file named by its path in the project")
        files.append(Upload(part.filename or "", await part.read()))
    return text, archive, files


def _utf8(raw: bytes, field: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadParameter(
            f"'{field}' is not UTF-8 text (byte {exc.start}); save job.yaml as UTF-8"
        ) from None


def _submit(
    store: Store,
    home: Path,
    text: str | None,
    archive: tuple[str, bytes] | None,
    files: list[Upload],
    dry_run: bool,
    policy: SubmissionPolicy,
) -> int | JSONResponse:
    """The new job's id, or the 422 (or dry run's 200) answer."""
    folder = new_folder(home)
    confine = Confinement(folder, policy)
    keep = False
    try:
        if archive is not None:
            unpack(archive[1], folder, name=archive[0])
        if files:
            write_files(files, folder)
        job_file = _job_file(folder, text)
        base_dir = None if archive is not None or files else Path.cwd()
        if dry_run:
            invalid = check_job(job_file, base_dir=base_dir, confine=confine)
            if invalid is None:
                return JSONResponse(DryRunOut(ok=True).model_dump(), status_code=200)
            return _problems(invalid, folder, None)
        job_id, invalid = create_job(store, job_file, base_dir=base_dir, confine=confine)
        keep = True  # the job's attempts (and a retry's validation) read these files
        return job_id if invalid is None else _problems(invalid, folder, job_id)
    except SubmissionError as exc:
        detail = "the project upload was refused: " + "; ".join(p.message for p in exc.problems)[:500]
        out = ProblemsOut(detail=detail, problems=[_problem(p, folder, "") for p in exc.problems])
        return JSONResponse(out.model_dump(exclude={"job_id"}), status_code=422)
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)


def _job_file(folder: Path, text: str | None) -> Path:
    found = folder / "job.yaml"
    size = len(text.encode()) if text is not None else found.stat().st_size if found.is_file() else 0
    if size > job_yaml.MAX_BYTES:  # refused before it is parsed or stored with a failed job
        raise SubmissionError(
            [
                Problem(
                    "job.yaml",
                    f"is {size} bytes; at most {job_yaml.MAX_BYTES} are accepted: keep large values "
                    "(data, prompts) in files of the project",
                    field="spec",
                )
            ]
        )
    if text is not None:
        return write_spec(folder, text)
    if found.is_file():
        return found
    raise SubmissionError(
        [
            Problem(
                "job.yaml",
                "is missing: send its text as the 'spec' field, or put job.yaml at the top of the "
                "project archive / folder",
                field="spec",
            )
        ]
    )


def _problems(invalid: DataError, folder: Path, job_id: int | None) -> JSONResponse:
    n = len(invalid.problems)
    recorded = f"; job {job_id} is recorded as failed" if job_id is not None else ""
    detail = f"{invalid.type}: {n} problem{'s' if n != 1 else ''} in the job{recorded}"
    out = ProblemsOut(
        detail=detail, problems=[_problem(p, folder, invalid.hint) for p in invalid.problems], job_id=job_id
    )
    return JSONResponse(out.model_dump(exclude={"job_id"} if job_id is None else set()), status_code=422)


def _problem(problem: Problem, folder: Path, hint: str) -> ProblemOut:
    """The problem with paths inside the submission shown relative to it (the server's folders are
    no business of the submitter); a problem at a line is a value to fix there, and says so."""
    file = problem.file
    try:
        file = Path(file).resolve().relative_to(folder.resolve()).as_posix()
    except ValueError:
        pass  # outside the submission (a path on the server): shown as it is
    inside = f"{folder.resolve()}/"
    message = problem.message.replace(inside, "").replace(f"{folder}/", "")
    if problem.line is not None and hint:
        hint = HINTS[ErrorType.INVALID_VALUE]
    return ProblemOut(file=file, line=problem.line, field=problem.field or None, message=message, hint=hint)


@router.post("/jobs/{job_id}/cancel", status_code=202, response_model=CancelOut)
def cancel(request: Request, job_id: JobId) -> JSONResponse:
    """Cancel a queued, running or retry-pending job. A running job's attempt is stopped (SIGTERM)
    and the job becomes cancelled once it has stopped; 409 when the job has nothing to cancel."""
    store = _store(request)
    job = service.require_job(store, job_id)
    if job.status in service.ENDED and job.next_retry_at is None:
        raise service.Conflict(f"job {job_id} is {job.status}; there is nothing to cancel")
    hook = request.app.state.on_cancel
    try:
        (hook or (lambda i: request_cancel(store, i)))(job_id)
    except (ValueError, LookupError) as exc:  # ended meanwhile (illegal transition, not cancellable)
        raise service.Conflict(str(exc)) from exc
    now = service.require_job(store, job_id)
    message = (
        f"job {job_id} is stopping: its attempt was told to stop; it becomes cancelled once it has"
        if now.status == "running"
        else f"job {job_id} is {now.status}"
    )
    return JSONResponse(
        CancelOut(job_id=job_id, status=now.status, message=message).model_dump(), status_code=202
    )


@router.delete("/jobs/{job_id}", status_code=204, response_class=Response)
def delete(request: Request, job_id: JobId) -> Response:
    """Delete an ended job (succeeded, failed or cancelled, no automatic retry pending): its rows and
    its files under $PLUGTUNE_HOME/jobs/<id> (and the project it was submitted with); 409 while it is
    queued, running or waiting for a retry."""
    store = _store(request)
    service.require_job(store, job_id)
    try:
        delete_job(store, _home(request), job_id)
    except ValueError as exc:
        raise service.Conflict(str(exc)) from exc
    return Response(status_code=204)


@router.get(
    "/jobs/{job_id}/events",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "model": JobEventOut}},
)
async def events(request: Request, job_id: JobId) -> StreamingResponse:
    """Live status as server-sent events: `job` (data: id, status, steps_done, steps_total,
    error_cause, updated_at, queue_position) at once and on every change, `end` when the job is final
    (then the stream closes); a `: keepalive` comment every 15 s; closed after 1 h (EventSource
    reconnects)."""
    await run_in_threadpool(service.require_job, _store(request), job_id)
    return StreamingResponse(
        _stream(request, job_id),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _watch(request: Request) -> JobWatch:
    watch: JobWatch | None = getattr(request.app.state, "job_watch", None)
    if watch is None:
        watch = request.app.state.job_watch = JobWatch(_store(request), max_age_s=EVENTS_POLL_S / 2)
    return watch


async def _stream(request: Request, job_id: int) -> AsyncIterator[str]:
    started = sent_at = time.monotonic()
    last: JobEventOut | None = None
    watch = _watch(request)
    yield f"retry: {RECONNECT_MS}\n\n"
    while time.monotonic() - started < MAX_STREAM_S:
        read = await watch.read(job_id)
        if read is None:
            yield _event("end", {"id": job_id, "status": "deleted"})
            return
        job, state = read
        if state != last:
            yield _event("job", state.model_dump())
            last, sent_at = state, time.monotonic()
        if job.status in service.ENDED and job.next_retry_at is None:
            yield _event("end", state.model_dump())
            return
        if time.monotonic() - sent_at >= KEEPALIVE_S:
            yield ": keepalive\n\n"
            sent_at = time.monotonic()
        if await request.is_disconnected():
            return
        await asyncio.sleep(EVENTS_POLL_S)


def _event(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"
