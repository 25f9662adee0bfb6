"""The optional API token (PLUGTUNE_API_TOKEN): required on every page and API request when set.

Programs send ``Authorization: Bearer <token>`` (or ``?token=<token>``, on any method). A browser
signs in on the login form (``POST /login``), which sets a session cookie (HttpOnly,
SameSite=Strict) derived from the token, so the token itself is in no URL and no cookie; ``POST
/logout`` removes it. Opening a page once with ``?token=`` signs in too and answers with the same
URL without the token. Every comparison is constant-time (``hmac.compare_digest``).
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from plugtune.web.guard import problem

COOKIE = "plugtune_session"
PUBLIC_PREFIXES = ("/static/",)  # the console's own CSS/JS: nothing in them is secret
PUBLIC_PATHS = ("/login", "/logout")


def session_value(token: str) -> str:
    """The session cookie's value for ``token``: changing the token signs every browser out."""
    return hmac.new(token.encode(), b"plugtune console session", hashlib.sha256).hexdigest()


def same_token(offered: str | None, token: str) -> bool:
    return offered is not None and hmac.compare_digest(offered.encode(), token.encode())


def set_session(response: Response, token: str) -> None:
    response.set_cookie(COOKIE, session_value(token), httponly=True, samesite="strict", path="/")


def safe_next(target: str | None) -> str:
    """A path on this console to go to after signing in (never another site)."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/jobs"
    return target


class TokenAuth:
    """ASGI middleware: 401 unless the request carries the token (header, session cookie, ?token=)."""

    def __init__(self, app: ASGIApp, *, token: str) -> None:
        if not token:
            raise ValueError("PLUGTUNE_API_TOKEN is set but empty; unset it or give it a value")
        self.app = app
        self.token = token
        self.session = session_value(token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path.startswith(PUBLIC_PREFIXES) or path in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        if same_token(_bearer(request), self.token) or same_token(request.cookies.get(COOKIE), self.session):
            await self.app(scope, receive, send)
            return
        offered = request.query_params.get("token")
        if same_token(offered, self.token):
            if request.method == "GET":
                await _sign_in(request, self.token)(scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        await _refuse(scope, wrong=bool(offered or _bearer(request)))(scope, receive, send)


def _bearer(request: Request) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _sign_in(request: Request, token: str) -> Response:
    rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
    target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
    response = RedirectResponse(target, status_code=303)
    set_session(response, token)
    return response


def _refuse(scope: Scope, *, wrong: bool) -> Response:
    detail = "the API token is wrong" if wrong else "this console requires the API token (PLUGTUNE_API_TOKEN)"
    return problem(scope, 401, detail, headers={"WWW-Authenticate": "Bearer"}, sign_in=True)
