"""The optional bearer token (PLUGTUNE_API_TOKEN): required on every page and API request when set.

Programs send ``Authorization: Bearer <token>``. A browser opens any page once with
``?token=<token>``; the console answers with a cookie (HttpOnly, SameSite=Strict) and the same
URL without the token, so the token does not stay in the address bar or the history.
"""

from __future__ import annotations

import hmac
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from plugtune.web.templating import templates

COOKIE = "plugtune_token"
PUBLIC_PREFIXES = ("/static/",)  # the console's own CSS/JS: nothing in them is secret


def wants_json(request: Request) -> bool:
    path = request.url.path
    if path.startswith("/api/") or path in ("/metrics", "/openapi.json"):
        return True
    return "application/json" in request.headers.get("accept", "")


class TokenAuth:
    """ASGI middleware: 401 unless the request carries the token (header, cookie, or ?token=)."""

    def __init__(self, app: ASGIApp, *, token: str) -> None:
        if not token:
            raise ValueError("PLUGTUNE_API_TOKEN is set but empty; unset it or give it a value")
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(PUBLIC_PREFIXES):
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        if self._matches(_bearer(request)) or self._matches(request.cookies.get(COOKIE)):
            await self.app(scope, receive, send)
            return
        offered = request.query_params.get("token")
        if offered is not None and self._matches(offered) and request.method == "GET":
            await _sign_in(request, offered)(scope, receive, send)
            return
        await _refuse(request, wrong=bool(offered or _bearer(request)))(scope, receive, send)

    def _matches(self, offered: str | None) -> bool:
        return offered is not None and hmac.compare_digest(offered.encode(), self.token)


def _bearer(request: Request) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _sign_in(request: Request, token: str) -> Response:
    rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
    target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/")
    return response


def _refuse(request: Request, *, wrong: bool) -> Response:
    detail = "the API token is wrong" if wrong else "this console requires the API token (PLUGTUNE_API_TOKEN)"
    headers = {"WWW-Authenticate": "Bearer"}
    if wants_json(request):
        return JSONResponse({"detail": detail}, status_code=401, headers=headers)
    context = {"status_code": 401, "title": "Sign in", "detail": detail, "ask_token": True}
    return templates.TemplateResponse(request, "error.html", context, status_code=401, headers=headers)
