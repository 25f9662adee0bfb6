"""Which code ran which steps of a job, the diff between two attempts' code, and a retry with new code.

``GET /api/jobs/{id}/code`` (attempt -> code hash -> step range), ``GET /api/jobs/{id}/code/diff?a=&b=``
(the unified diff of two attempts' plugin code) and its page ``/jobs/{id}/code/diff``, and the upload
half of ``POST /api/jobs/{id}/retry`` (multipart: the project as ``POST /api/jobs`` takes it), which
checks and queues the retry as ``plugtune jobs retry ID --code DIR`` does (:mod:`plugtune.web.code_retry`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException

from plugtune.errors import DataError
from plugtune.jobs import revision
from plugtune.jobs.revision import CodeSpan, RevisionError
from plugtune.jobs.submission import MAX_FILES, SubmissionError, Upload, new_folder, unpack, write_files
from plugtune.settings import Settings
from plugtune.store import Store
from plugtune.web import service
from plugtune.web.code_retry import CodeRefusedError, retry_with_code
from plugtune.web.models import ProblemOut, ProblemsOut
from plugtune.web.params import BadParameter, JobId
from plugtune.web.templating import templates
from plugtune.web.views import job_out

router = APIRouter()

UPLOADED = "upload"  # the source an uploaded project's code is recorded with


class CodeSpanOut(BaseModel):
    attempt: int
    status: str
    code_hash: str = Field(description="the hash of the attempt's whole plugin code")
    source: str = Field(description="'submitted', the --code folder, or 'upload'")
    first_step: int
    last_step: int = Field(description="below first_step: the attempt trained no step that stands")
    plugins: dict[str, str] = Field(description="plugin file (as job.yaml names it) -> its code hash")
    diff_url: str = Field(default="", description="the diff from the previous attempt's code, if it differs")


class AttemptsCodeOut(BaseModel):
    attempts: list[CodeSpanOut]


class CodeDiffOut(BaseModel):
    a: int
    b: int
    code_hash_a: str
    code_hash_b: str
    diff: str = Field(description="unified diff, a/<folder>/<file> -> b/<folder>/<file>; empty when equal")


class CodeRetryOut(BaseModel):
    job_id: int
    status: str
    message: str
    code_hash: str
    previous_code_hash: str
    tested: list[str]
    notes: list[str]


def _store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


def code_spans(store: Store, job_id: int) -> list[CodeSpanOut]:
    """The job's attempts with their code, oldest first; each links the diff from the one before."""
    out: list[CodeSpanOut] = []
    previous: CodeSpan | None = None
    for span in revision.timeline(store, job_id):
        url = ""
        if previous is not None and previous.code_hash != span.code_hash:
            url = f"/jobs/{job_id}/code/diff?a={previous.attempt}&b={span.attempt}"
        out.append(CodeSpanOut(**span.to_dict(), diff_url=url))
        previous = span
    return out


@router.get("/api/jobs/{job_id}/code", response_model=AttemptsCodeOut, tags=["api"])
def code_api(request: Request, job_id: JobId) -> AttemptsCodeOut:
    """Which plugin code each attempt ran and the steps that stand from it (a job retried with
    `plugtune jobs retry ID --code DIR` changes code between attempts)."""
    store = _store(request)
    service.require_job(store, job_id)
    return AttemptsCodeOut(attempts=code_spans(store, job_id))


def _diff(store: Store, job_id: int, a: int, b: int) -> CodeDiffOut:
    service.require_job(store, job_id)
    spans = {s.attempt: s for s in revision.timeline(store, job_id)}
    for number in (a, b):
        if number not in spans:
            known = sorted(spans) or "none"
            raise service.Missing(f"job {job_id} has no attempt {number}; its attempts: {known}")
    left, right = spans[a], spans[b]
    text = revision.diff(store, left.plugins, right.plugins)
    return CodeDiffOut(a=a, b=b, code_hash_a=left.code_hash, code_hash_b=right.code_hash, diff=text)


@router.get("/api/jobs/{job_id}/code/diff", response_model=CodeDiffOut, tags=["api"])
def code_diff_api(
    request: Request,
    job_id: JobId,
    a: int = Query(..., ge=1, le=1_000_000, description="the attempt whose code is the diff's left side"),
    b: int = Query(..., ge=1, le=1_000_000, description="the attempt whose code is the diff's right side"),
) -> CodeDiffOut:
    """The unified diff between the plugin code of attempts `a` and `b`."""
    return _diff(_store(request), job_id, a, b)


@router.get("/jobs/{job_id}/code/diff", response_class=HTMLResponse, include_in_schema=False)
def code_diff_page(
    request: Request,
    job_id: JobId,
    a: int = Query(..., ge=1, le=1_000_000),
    b: int = Query(..., ge=1, le=1_000_000),
) -> HTMLResponse:
    store = _store(request)
    found = _diff(store, job_id, a, b)
    job = service.require_job(store, job_id)
    lines = [(_line_class(line), line) for line in found.diff.splitlines()]
    context = {"job": job_out(job), "diff": found, "lines": lines}
    return templates.TemplateResponse(request, "code_diff.html", context)


def _line_class(line: str) -> str:
    if line.startswith(("+++", "---")):
        return "diff-file"
    if line.startswith("@@"):
        return "diff-hunk"
    return {"+": "diff-add", "-": "diff-del"}.get(line[:1], "")


async def retry_upload(request: Request, job_id: int) -> Response:
    """``POST /api/jobs/{id}/retry`` with multipart ``project`` (a .zip / .tar.gz of the project
    folder) or ``project_files`` parts (each named by its path in it): the new plugin code."""
    archive, files = await _read_project(request)
    if archive is None and not files:
        raise BadParameter(
            "a retry with new code takes the project as multipart 'project' (a .zip or .tar.gz of its "
            "folder) or 'project_files' parts; send no body to retry with the job's own code"
        )
    home: Path | None = request.app.state.home
    home = home if home is not None else Settings.from_env().home
    store, wake = _store(request), request.app.state.on_retry
    return await run_in_threadpool(_retry, store, home, job_id, archive, files, wake)


def _retry(
    store: Store,
    home: Path,
    job_id: int,
    archive: tuple[str, bytes] | None,
    files: list[Upload],
    wake: Any,
) -> Response:
    service.require_job(store, job_id)
    folder = new_folder(home)
    try:
        if archive is not None:
            unpack(archive[1], folder, name=archive[0])
        if files:
            write_files(files, folder)
        done = retry_with_code(store, job_id, folder, on_retry=wake, source=UPLOADED)
    except RevisionError as exc:
        raise service.Conflict(str(exc)) from None
    except SubmissionError as exc:
        return _refused(job_id, "the project upload was refused", [_problem(p, folder) for p in exc.problems])
    except DataError as exc:
        detail = "the new code does not fit the job's job.yaml or data"
        return _refused(job_id, detail, [_problem(p, folder) for p in exc.problems])
    except CodeRefusedError as exc:
        problems = [ProblemOut(file="", message=_inside(p, folder)) for p in exc.problems]
        return _refused(job_id, f"the new code failed {exc.check}; nothing was changed", problems)
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # the code is in the store now, or refused
    job = service.require_job(store, job_id)
    out = CodeRetryOut(
        job_id=job_id,
        status=job.status,
        message=f"job {job_id} is {job.status} again, with code {done.code_hash[:12]}",
        code_hash=done.code_hash,
        previous_code_hash=done.previous_hash,
        tested=done.tested,
        notes=done.notes,
    )
    return JSONResponse(out.model_dump())


def _refused(job_id: int, detail: str, problems: list[ProblemOut]) -> JSONResponse:
    out = ProblemsOut(detail=f"job {job_id}: {detail}", problems=problems, job_id=job_id)
    return JSONResponse(out.model_dump(), status_code=422)


def _problem(p: Any, folder: Path) -> ProblemOut:
    """A problem with its file named inside the uploaded project, not the server's folder."""
    file, message = str(p.file), _inside(str(p.message), folder)
    try:
        file = str(Path(file).relative_to(folder))
    except ValueError:
        pass
    return ProblemOut(file=file, line=p.line, field=p.field, message=message)


def _inside(text: str, folder: Path) -> str:
    """``text`` with the server's upload folder left out of its paths (they are the project's)."""
    return text.replace(str(folder) + "/", "").replace(str(folder), "the project")


async def _read_project(request: Request) -> tuple[tuple[str, bytes] | None, list[Upload]]:
    try:
        form = await request.form(max_files=MAX_FILES + 2, max_fields=16)
    except (MultiPartException, HTTPException) as exc:
        reason = exc.message if isinstance(exc, MultiPartException) else exc.detail
        raise BadParameter(f"the multipart body cannot be read ({reason})") from None
    project = form.get("project")
    archive = None
    if isinstance(project, UploadFile):
        data = await project.read()
        archive = (project.filename or "project", data) if data else None
    files = []
    for part in form.getlist("project_files"):
        if not isinstance(part, UploadFile):
            raise BadParameter("each 'project_files' part must be a file named by its path in the project")
        files.append(Upload(part.filename or "", await part.read()))
    return archive, files
