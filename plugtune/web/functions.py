"""The functions in use and what killed attempts left: ``/functions`` (page), ``/api/functions``.

Read from the store and this machine by :mod:`plugtune.jobs.functions` (each attempt runs its own
runtime in its own process; see there). The quota and retention are this server's settings
(``plugtune serve --max-functions/--max-instances/--total-memory-mb/--retention-days``), which the
attempts it starts inherit.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from plugtune.jobs.functions import end_stale, functions_view
from plugtune.settings import Settings
from plugtune.store import Store
from plugtune.web.templating import templates

router = APIRouter()


def _store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


@router.get("/api/functions", tags=["functions"])
def api_functions(request: Request) -> dict[str, Any]:
    """The functions in use (each one's job, attempt, status, effective limits, newest instance
    count and memory, and, where plugins run as their own uid, each of its processes with its resident
    memory), the quota each job's runtime gets and how much of it each attempt uses, the
    monitoring retention, and ``leftovers``: uid leases and cgroups of killed attempts' runtimes, with
    the processes of theirs that still run (``POST /api/functions/end-stale`` ends them)."""
    return functions_view(_store(request), Settings.from_env()).to_dict()


@router.post("/api/functions/end-stale", tags=["functions"])
def api_end_stale(request: Request) -> dict[str, Any]:
    """End what killed attempts left on this machine: their functions' processes, uid leases and
    cgroups (runtimes that still run are never touched). ``found``: what there was, with its jobs;
    ``ended``: uids given back, processes ended, cgroups removed, and ``problems`` (what is left)."""
    found, ended = end_stale(_store(request))
    return {"found": [asdict(x) for x in found], "ended": asdict(ended)}


@router.get("/functions", response_class=HTMLResponse, include_in_schema=False)
def functions_page(request: Request, ended: str | None = None) -> HTMLResponse:
    view = functions_view(_store(request), Settings.from_env())
    return templates.TemplateResponse(
        request, "functions.html", {"view": view, "message": _ended_message(ended)}
    )


@router.post("/functions/end-stale", include_in_schema=False)
def functions_end_stale(request: Request) -> RedirectResponse:
    _, ended = end_stale(_store(request))
    text = f"{len(ended.processes)}p-{len(ended.uids)}u-{len(ended.cgroups)}c-{len(ended.problems)}x"
    return RedirectResponse(f"/functions?ended={text}", status_code=303)


def _ended_message(code: str | None) -> str:
    """The redirect's summary (``3p-1u-1c-0x``) in words; "" when absent or not of that shape."""
    if not code:
        return ""
    try:
        p, u, c, x = (int(part[:-1]) for part in code.split("-"))
    except ValueError:
        return ""
    text = f"Ended {p} process(es), gave back {u} uid(s), removed {c} cgroup(s)."
    return text + (f" {x} could not be ended: they are listed below." if x else "")
