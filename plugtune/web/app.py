"""The console's FastAPI application: JSON API, pages, /metrics, /docs, the optional token, and its
edge (Host allow-list, limits, CSRF and origin checks, security headers)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from plugtune import __version__
from plugtune.errors import PlatformError
from plugtune.spec.reach import SubmissionPolicy
from plugtune.store import Store
from plugtune.store.records import DamagedRecordError
from plugtune.web import (
    api,
    app_openapi,
    code_api,
    compare,
    control_api,
    exposition,
    functions,
    login,
    pages,
    regrades,
    service,
    tokens,
)
from plugtune.web.auth import COOKIE, TokenAuth
from plugtune.web.csrf import CsrfGuard
from plugtune.web.docs import operations
from plugtune.web.guard import EdgeGuard, wants_json
from plugtune.web.params import BadParameter
from plugtune.web.templating import templates

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"


def create_app(
    store: Store,
    *,
    api_token: str | None = None,
    on_retry: Callable[[str], None] | None = None,
    on_cancel: Callable[[int], None] | None = None,
    allowed_hosts: Iterable[str] = (),
    home: Path | None = None,
    submission_policy: SubmissionPolicy | None = None,
) -> FastAPI:
    """The console over ``store``.

    ``api_token``: when set, every page and API request must carry it (``Authorization: Bearer``,
    ``?token=``, or the session cookie of the login form). ``on_retry(job_id)`` is called after a
    manual retry or a submission has queued a job (the scheduler's wake-up hook); ``on_cancel(job_id)``
    cancels a job (the scheduler's, which stops the attempt it supervises; default: SIGTERM to the
    attempt's process from here). ``allowed_hosts``: names the Host header may carry besides
    localhost, 127.0.0.1 and ::1 (any other is a 400). ``home``: where submitted projects are
    unpacked and jobs' files lie (default: ``$PLUGTUNE_HOME``). ``submission_policy``: the server
    folders and secrets a job submitted over the API may use besides its own files (default: none).
    """
    app = FastAPI(
        title="plugtune",
        version=__version__,
        description="Jobs, plugins, logs and trajectories of plugtune's RL fine-tuning jobs.",
        docs_url=None,
        redoc_url=None,
    )
    app.state.store = store
    app.state.on_retry = on_retry
    app.state.on_cancel = on_cancel
    app.state.home = home
    app.state.submission_policy = submission_policy or SubmissionPolicy()
    app.state.api_token = api_token
    app.state.token_required = api_token is not None
    app.include_router(api.router)
    app.include_router(control_api.router)
    app.include_router(compare.router)
    app.include_router(functions.router)
    app.include_router(pages.router)
    app.include_router(regrades.router)
    app.include_router(code_api.router)
    app.include_router(tokens.router)
    app.include_router(login.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    _add_meta_routes(app, token_required=api_token is not None)
    _add_error_handlers(app)
    app_openapi.install(app, token_required=api_token is not None)
    # add_middleware puts each in front of the last: requests meet EdgeGuard, CsrfGuard, TokenAuth.
    if api_token is not None:
        app.add_middleware(TokenAuth, token=api_token)
    app.add_middleware(CsrfGuard, session_cookie=COOKIE)
    app.add_middleware(EdgeGuard, allowed_hosts=tuple(allowed_hosts))
    return app


def _add_meta_routes(app: FastAPI, *, token_required: bool) -> None:
    @app.get("/metrics", include_in_schema=False)
    def metrics() -> PlainTextResponse:
        """Jobs by status, plugins of running jobs and their newest metrics (Prometheus format)."""
        body = exposition.render(app.state.store)
        return PlainTextResponse(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/docs", include_in_schema=False, response_class=HTMLResponse)
    def docs(request: Request) -> HTMLResponse:
        context = {
            "title": app.title,
            "version": app.version,
            "operations": operations(app.openapi()),
            "token_required": token_required,
        }
        return templates.TemplateResponse(request, "docs.html", context)


def _add_error_handlers(app: FastAPI) -> None:
    def problem(request: Request, status_code: int, title: str, detail: str) -> Response:
        if wants_json(request):
            return JSONResponse({"detail": detail}, status_code=status_code)
        context = {"status_code": status_code, "title": title, "detail": detail, "ask_token": False}
        return templates.TemplateResponse(request, "error.html", context, status_code=status_code)

    @app.exception_handler(service.Missing)
    async def missing(request: Request, exc: service.Missing) -> Response:
        return problem(request, 404, "Not found", str(exc))

    @app.exception_handler(service.Conflict)
    async def conflict(request: Request, exc: service.Conflict) -> Response:
        return problem(request, 409, "Conflict", str(exc))

    @app.exception_handler(DamagedRecordError)
    async def damaged(request: Request, exc: DamagedRecordError) -> Response:
        log.warning("damaged record while serving %s: %s", request.url.path, exc)
        return problem(request, 409, "Damaged record", str(exc))

    @app.exception_handler(BadParameter)
    async def bad_parameter(request: Request, exc: BadParameter) -> Response:
        return problem(request, 400, "Bad request", str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        details = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'request'}: {e.get('msg', '')}"
            for e in exc.errors()
        )
        return problem(request, 400 if not wants_json(request) else 422, "Bad request", details)

    @app.exception_handler(PlatformError)
    async def platform(request: Request, exc: PlatformError) -> Response:
        log.error("store error while serving %s: %s", request.url.path, exc)
        return problem(request, 503, "Store unavailable", f"{exc.message} — {exc.hint}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return problem(request, exc.status_code, "Error", str(exc.detail))
