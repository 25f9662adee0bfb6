"""The API's OpenAPI schema as the API answers: every error a route can give, with its real body.

FastAPI documents a 422 whose body is a list of validation errors; the console answers
``{"detail": "..."}`` for every error (a submission's problems add a list), and its edge, CSRF
check, token and store give errors no route declares. ``install`` makes ``app.openapi()`` say so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from plugtune.web.models import DetailOut

DETAIL_REF = {"$ref": "#/components/schemas/DetailOut"}
FASTAPI_422 = "#/components/schemas/HTTPValidationError"

WHY = {
    400: "the request cannot be served as sent: a Host header this console does not answer to, a bad "
    "path or query string, or a parameter it cannot use (the detail names it and what is expected)",
    401: "the API token is missing or wrong (send it as 'Authorization: Bearer TOKEN')",
    403: "a write from another origin, or from a browser without the console's CSRF token",
    404: "the job (or its plugin, file, trajectory or group) does not exist",
    409: "the job's state does not allow this now",
    413: "the request body is larger than this route accepts",
    414: "the query string is longer than 8192 bytes",
    415: "the body's Content-Type is not one this route accepts",
    422: "a parameter is not of its declared type or outside its declared range",
    503: "the store is unavailable",
}
EVERY_ROUTE = (400, 414, 503)
WRITES = ("post", "put", "patch", "delete")
BODY_ERRORS = (403, 413, 415)
#: Errors a route can give that its path does not show.
ROUTE_ERRORS: dict[tuple[str, str], tuple[int, ...]] = {
    ("post", "/api/jobs/{job_id}/retry"): (409,),
    ("post", "/api/jobs/{job_id}/cancel"): (409,),
    ("delete", "/api/jobs/{job_id}"): (409,),
    ("get", "/api/compare"): (404,),  # the jobs it compares are named in the query
}


def install(app: FastAPI, *, token_required: bool) -> None:
    """Make ``app.openapi()`` document the errors each route answers (401 when a token is required)."""
    build: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document_errors(build(), token_required=token_required)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def error_codes(method: str, path: str, operation: dict[str, Any], *, token_required: bool) -> set[int]:
    """The error statuses a route can answer."""
    codes = set(EVERY_ROUTE)
    if token_required:
        codes.add(401)
    if method in WRITES:
        codes.update(BODY_ERRORS)
    if "{" in path:
        codes.add(404)
    if operation.get("parameters") or operation.get("requestBody"):
        codes.add(422)
    codes.update(ROUTE_ERRORS.get((method, path), ()))
    return codes


def document_errors(schema: dict[str, Any], *, token_required: bool) -> dict[str, Any]:
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["DetailOut"] = DetailOut.model_json_schema()
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            for code in sorted(error_codes(method, path, operation, token_required=token_required)):
                responses[str(code)] = _response(code, responses.get(str(code)))
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    return schema


def _response(code: int, declared: dict[str, Any] | None) -> dict[str, Any]:
    """The error's documented answer: ``DetailOut``, or the route's own model besides it."""
    body = (declared or {}).get("content", {}).get("application/json", {}).get("schema")
    if body is None or body.get("$ref") == FASTAPI_422:
        schema: dict[str, Any] = DETAIL_REF
        description = WHY[code]
    else:
        schema = {"anyOf": [body, DETAIL_REF]}
        description = f"{(declared or {}).get('description', '')}; else {WHY[code]}".lstrip("; ")
    return {"description": description, "content": {"application/json": {"schema": schema}}}
