"""A job's stored re-grades in the console (``plugtune regrade --failed-only`` stores them, labelled,
beside the trajectories as trained), and a trajectory as grader fixture lines for
``plugtune test --expect`` (what ``plugtune fixture add`` appends).

``GET /jobs/{id}/regrades`` (the page), ``GET /api/jobs/{id}/regrades`` and
``GET /api/jobs/{id}/trajectories/{trajectory_id}/fixture``.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, Response
from pydantic import BaseModel

from plugtune.pretest.regrade import KINDS, RegradeError, fixture_rows, trajectory_link
from plugtune.store import Store
from plugtune.web import service
from plugtune.web.params import JobId, RecordId
from plugtune.web.templating import templates
from plugtune.web.views import job_out

router = APIRouter()


class RegradeOut(BaseModel):
    label: str
    trajectory_id: str
    step: int
    graders: list[str]
    status: str
    reward: float | None
    kind: str
    reward_components: dict[str, float | None]
    errors: list[dict[str, Any]]
    created_at: float
    link: str


class RegradesOut(BaseModel):
    regrades: list[RegradeOut]


def _store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


def _regrades(store: Store, job_id: int, label: str | None) -> list[RegradeOut]:
    service.require_job(store, job_id)
    return [
        RegradeOut(**r.to_dict(), link=trajectory_link(job_id, r.trajectory_id))
        for r in store.regrades(job_id, label)
    ]


@router.get("/api/jobs/{job_id}/regrades", response_model=RegradesOut, tags=["api"])
def regrades_api(
    request: Request,
    job_id: JobId,
    label: str | None = Query(None, max_length=200, description="only this re-grade's rows"),
) -> RegradesOut:
    """The job's stored re-grades (``plugtune regrade --failed-only``), oldest first: each
    trajectory's new grade and its flip, beside the original, which is never rewritten."""
    return RegradesOut(regrades=_regrades(_store(request), job_id, label))


@router.get("/api/jobs/{job_id}/trajectories/{trajectory_id}/fixture", tags=["api"])
def fixture_api(
    request: Request,
    job_id: JobId,
    trajectory_id: RecordId,
    regrade: str | None = Query(None, max_length=200, description="expect what this re-grade gave"),
) -> Response:
    """The trajectory as grader fixture lines (JSON lines, ``plugtune test --expect`` reads them):
    its dataset row, its messages and what each grader gave it (or the re-grade ``regrade``)."""
    store = _store(request)
    service.require_job(store, job_id)
    try:
        rows = fixture_rows(store, job_id, trajectory_id, label=regrade)
    except RegradeError as exc:
        raise service.Missing(str(exc)) from None
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    return PlainTextResponse(text, media_type="application/x-ndjson")


@router.get("/jobs/{job_id}/regrades", response_class=HTMLResponse, include_in_schema=False)
def regrades_page(request: Request, job_id: JobId) -> HTMLResponse:
    store = _store(request)
    job = service.require_job(store, job_id)
    by_label: dict[str, list[RegradeOut]] = {}
    for row in _regrades(store, job_id, None):
        by_label.setdefault(row.label, []).append(row)
    reports = [
        {
            "label": label,
            "counts": [(k, n) for k in KINDS if (n := sum(r.kind == k for r in rows))],
            "flips": [r for r in rows if r.kind != "unchanged"],
            "total": len(rows),
        }
        for label, rows in by_label.items()
    ]
    context = {"job": job_out(job), "reports": reports}
    return templates.TemplateResponse(request, "regrades.html", context)
