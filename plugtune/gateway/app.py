"""The gateway's HTTP surface: ``POST /v1/chat/completions`` and ``GET /v1/models``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from plugtune.gateway.completions import CompletionService
from plugtune.gateway.protocol import ApiError, ChatCompletionRequest, model_list
from plugtune.gateway.trace import TraceBuilder

logger = logging.getLogger(__name__)

#: Finds the trajectory an API key belongs to (None for unknown keys).
KeyResolver = Callable[[str], TraceBuilder | None]


def build_app(service: CompletionService, resolve: KeyResolver, version: Callable[[], int]) -> FastAPI:
    app = FastAPI(title="plugtune policy gateway", docs_url=None, redoc_url=None, openapi_url=None)
    created = int(time.time())

    def authorize(request: Request) -> TraceBuilder:
        header = request.headers.get("authorization", "")
        key = header[len("Bearer ") :].strip() if header.lower().startswith("bearer ") else ""
        builder = resolve(key) if key else None
        if builder is None:
            raise ApiError(
                401,
                "Incorrect API key provided: each rollout must use the key of its own trajectory "
                "(policy.api_key); this one is unknown or its trajectory has finished.",
                code="invalid_api_key",
            )
        return builder

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        """The one model this gateway serves: the policy being trained."""
        authorize(request)
        return model_list(service.model_name, created)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> JSONResponse:
        """An OpenAI chat completion from the current policy; tokens go to the key's trajectory."""
        builder = authorize(request)
        body = await _parse(request)
        async with builder.call_lock:
            # Already plain JSON types: a JSONResponse skips FastAPI's generic encoder (every request).
            return JSONResponse(await service.complete(builder, body, version()))

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        error = _invalid([{**e, "loc": tuple(e.get("loc", ()))[1:]} for e in exc.errors()])
        return JSONResponse(error.body(), status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(ApiError(exc.status_code, str(exc.detail)).body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        logger.error("policy gateway failed on %s", request.url.path, exc_info=exc)
        error = ApiError(500, f"the policy gateway failed: {type(exc).__name__}: {exc}", "server_error")
        return JSONResponse(error.body(), status_code=500)

    return app


async def _parse(request: Request) -> ChatCompletionRequest:
    try:
        raw = await request.json()
    except ValueError as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        return ChatCompletionRequest.model_validate(raw)
    except ValidationError as exc:
        raise _invalid(list(exc.errors())) from exc


def _invalid(errors: list[Any]) -> ApiError:
    """One 400 naming the first bad field and describing up to five problems."""
    param = ".".join(str(p) for p in errors[0].get("loc", ())) if errors else ""
    described = [
        f"{'.'.join(str(p) for p in e.get('loc', ())) or 'body'}: {e.get('msg')}" for e in errors[:5]
    ]
    return ApiError(400, "; ".join(described) or "invalid request", param=param or None)
