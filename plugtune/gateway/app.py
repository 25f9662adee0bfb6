"""The gateway's HTTP surface: ``POST /v1/chat/completions`` and ``GET /v1/models``."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
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

#: Finds the trajectory an API key belongs to, or says why the key does not work (None: unknown).
KeyResolver = Callable[[str], TraceBuilder | str | None]
UNKNOWN_KEY = (
    "Incorrect API key provided: each rollout must use the key of its own trajectory "
    "(policy.api_key); this one is unknown."
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]

CHAT_PATH = "/v1/chat/completions"
#: A request body above this is a 413 (a whole trajectory's messages fit many times over).
MAX_BODY_BYTES = 16 << 20


def build_app(service: CompletionService, resolve: KeyResolver, version: Callable[[], int]) -> AsgiApp:
    """The gateway's ASGI app: chat completions on a direct path, everything else through FastAPI.

    Every rollout call goes through ``POST /v1/chat/completions``; FastAPI's middleware, routing and
    dependency solving cost more per call than the rest of the request handling together, so that
    one route is served by a plain ASGI handler with the same answers (and the same errors).
    """
    slow = _fastapi_app(service, resolve, version)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == CHAT_PATH:
            await _chat(scope, receive, send, service, resolve, version)
        else:
            await slow(scope, receive, send)

    return app


async def _chat(
    scope: Scope,
    receive: Receive,
    send: Send,
    service: CompletionService,
    resolve: KeyResolver,
    version: Callable[[], int],
) -> None:
    status, body = 200, b""
    try:
        builder = _authorize(_header(scope, b"authorization"), resolve)
        _check_content_type(_header(scope, b"content-type"))
        request = _validate(await _read_body(receive, _header(scope, b"content-length")))
        async with builder.call_lock:
            answer = await service.complete(builder, request, version())
        body = json.dumps(answer, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    except ApiError as exc:
        status, body = exc.status, json.dumps(exc.body()).encode()
    except Exception as exc:  # the caller gets an OpenAI-shaped 500, the server goes on
        logger.error("policy gateway failed on %s", CHAT_PATH, exc_info=exc)
        error = ApiError(500, f"the policy gateway failed: {type(exc).__name__}: {exc}", "server_error")
        status, body = 500, json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return ""


async def _read_body(receive: Receive, declared: str = "") -> bytes:
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _too_large(f"{int(declared)} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ApiError(400, "the client disconnected before sending the whole request body")
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > MAX_BODY_BYTES:
            raise _too_large(f"more than {MAX_BODY_BYTES} bytes")
        if not message.get("more_body", False):
            return b"".join(chunks)


def _too_large(size: str) -> ApiError:
    return ApiError(
        413,
        f"the request body is {size}; the policy gateway accepts at most {MAX_BODY_BYTES} bytes "
        "(16 MiB) per request: send shorter messages",
        code="request_too_large",
    )


def _check_content_type(value: str) -> None:
    kind = value.partition(";")[0].strip().lower()
    if kind not in ("", "application/json"):
        raise ApiError(
            415,
            f"Content-Type {value!r} is not accepted: send the request as JSON (application/json)",
            param="content-type",
            code="unsupported_media_type",
        )


def _authorize(header: str, resolve: KeyResolver) -> TraceBuilder:
    key = header[len("Bearer ") :].strip() if header.lower().startswith("bearer ") else ""
    if not key:
        raise ApiError(
            401,
            "No API key provided: send the trajectory's key (policy.api_key) as 'Authorization: Bearer "
            "KEY'; policy.chat(), achat() and the clients from policy.openai() do.",
            code="invalid_api_key",
        )
    found = resolve(key)
    if found is None or isinstance(found, str):
        raise ApiError(401, found or UNKNOWN_KEY, code="invalid_api_key")
    return found


def _validate(body: bytes) -> ChatCompletionRequest:
    try:
        raw = json.loads(body)
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the request body is not UTF-8 JSON: {exc}") from exc
    except ValueError as exc:
        raise ApiError(400, f"the request body is not valid JSON: {str(exc)[:200]}") from exc
    except RecursionError as exc:
        raise ApiError(400, "the request body is not valid JSON: it is nested too deeply") from exc
    if not isinstance(raw, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        return ChatCompletionRequest.model_validate(raw)
    except ValidationError as exc:
        raise _invalid(list(exc.errors())) from exc


def _fastapi_app(service: CompletionService, resolve: KeyResolver, version: Callable[[], int]) -> FastAPI:
    app = FastAPI(title="plugtune policy gateway", docs_url=None, redoc_url=None, openapi_url=None)
    created = int(time.time())

    def authorize(request: Request) -> TraceBuilder:
        return _authorize(request.headers.get("authorization", ""), resolve)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        """The one model this gateway serves: the policy being trained."""
        authorize(request)
        return model_list(service.model_name, created)

    @app.post(CHAT_PATH)
    async def chat_completions(request: Request) -> JSONResponse:
        """An OpenAI chat completion (``build_app`` serves POSTs directly; this route names the path)."""
        builder = authorize(request)
        _check_content_type(request.headers.get("content-type", ""))
        body = _validate(await _read_body(request.receive, request.headers.get("content-length", "")))
        async with builder.call_lock:
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


def _invalid(errors: list[Any]) -> ApiError:
    """One 400 naming the first bad field and describing up to five problems."""
    param = ".".join(str(p) for p in errors[0].get("loc", ())) if errors else ""
    described = [
        f"{'.'.join(str(p) for p in e.get('loc', ())) or 'body'}: {e.get('msg')}" for e in errors[:5]
    ]
    return ApiError(400, "; ".join(described) or "invalid request", param=param or None)
