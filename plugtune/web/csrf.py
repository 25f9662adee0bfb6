"""Cross-site request forgery: a write (POST, PUT, PATCH, DELETE) from a browser must come from the
console's own origin and carry the console's CSRF token.

Every answer sets a random ``plugtune_csrf`` cookie (HttpOnly, SameSite=Strict) when the request had
none; pages put the cookie's signature (HMAC with this server's secret) in each form's hidden
``csrf_token`` field and in ``<meta name="csrf-token">`` for scripts (header ``X-CSRF-Token``).

Origin: a write whose ``Origin`` (else ``Referer``) is not this console's scheme, host and port is a
403, so another port on 127.0.0.1 (same *site* to the browser) is refused too. Browsers send
``Origin`` with every cross-origin POST, so a write with no ``Origin``, ``Referer``,
``Sec-Fetch-Site`` and no session cookie is a program's (curl, a script) and needs no CSRF token;
nor does one carrying ``Authorization``, which a page on another site cannot send.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from urllib.parse import parse_qsl, urlsplit

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from plugtune.web.guard import FORM, UNSAFE_METHODS, problem, read_body, replay

COOKIE = "plugtune_csrf"
FIELD = "csrf_token"
HEADER = "x-csrf-token"
_NONCE = re.compile(r"^[A-Za-z0-9_-]{43}$")


class CsrfGuard:
    """ASGI middleware: issues the CSRF cookie and refuses forged writes (403 naming what is wrong)."""

    def __init__(self, app: ASGIApp, *, session_cookie: str) -> None:
        self.app = app
        self.session_cookie = session_cookie
        self.secret = secrets.token_bytes(32)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        nonce = request.cookies.get(COOKIE, "")
        fresh = not _NONCE.match(nonce)
        if fresh:
            nonce = secrets.token_urlsafe(32)
        expected = self.sign(nonce)
        scope.setdefault("state", {})["csrf_token"] = expected
        if scope["method"] in UNSAFE_METHODS:
            body = await read_body(receive, 1 << 30)  # bounded by EdgeGuard, which read it first
            refusal = self._refusal(request, body, expected if not fresh else None)
            if refusal:
                await problem(scope, 403, refusal)(scope, receive, send)
                return
            receive = replay(body, receive)

        async def send_with_cookie(message: Message) -> None:
            if fresh and message["type"] == "http.response.start":
                morsel = f"{COOKIE}={nonce}; HttpOnly; Path=/; SameSite=Strict"
                message["headers"] = [*message.get("headers", []), (b"set-cookie", morsel.encode())]
            await send(message)

        await self.app(scope, receive, send_with_cookie)

    def sign(self, nonce: str) -> str:
        return hmac.new(self.secret, nonce.encode(), hashlib.sha256).hexdigest()

    def _refusal(self, request: Request, body: bytes, expected: str | None) -> str | None:
        own = f"{request.url.scheme}://{request.headers.get('host', '')}".lower()
        claimed = _claimed_origin(request)
        if claimed is not None and claimed != own:
            return (
                f"cross-origin request refused: this write comes from {claimed!r}, not from the "
                f"console's own origin {own!r}; use the console's own page (or send no Origin from a script)"
            )
        if "authorization" in request.headers or not self._from_browser(request, claimed):
            return None
        offered = request.headers.get(HEADER) or _form_field(request, body, FIELD)
        if expected is None or not offered or not hmac.compare_digest(offered.encode(), expected.encode()):
            return (
                "the CSRF token is missing or stale (the console restarted, or the form is from "
                "another page): reload the page and try again"
            )
        return None

    def _from_browser(self, request: Request, claimed: str | None) -> bool:
        return (
            claimed is not None
            or "sec-fetch-site" in request.headers
            or self.session_cookie in request.cookies
        )


def _claimed_origin(request: Request) -> str | None:
    origin = request.headers.get("origin")
    if origin is not None:
        return origin.strip().lower()
    referer = request.headers.get("referer")
    if referer:
        parts = urlsplit(referer)
        return f"{parts.scheme}://{parts.netloc}".lower()
    return None


def _form_field(request: Request, body: bytes, name: str) -> str | None:
    if request.headers.get("content-type", "").partition(";")[0].strip().lower() != FORM:
        return None
    values = [v for k, v in parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True) if k == name]
    return values[0] if values else None
