"""The console's edge: the Host names it answers to, how large a request may be, that a body is
what its Content-Type says, and the security headers on every answer (before anything else runs).

A wrong Host is how DNS rebinding reads a console bound to 127.0.0.1 from another site: it is a 400
naming the header and how to allow the name (``plugtune serve --allowed-host``).
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable
from urllib.parse import unquote_to_bytes, urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from plugtune.jobs.submission import MAX_UPLOAD_BYTES
from plugtune.web.templating import templates

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
#: A Host header as RFC 9110 allows it: a name (or IPv4 address) or a bracketed IPv6 address, then
#: an optional port; nothing before, between or after (no userinfo, spaces or trailing text).
HOST_HEADER = re.compile(
    r"(?:\[(?P<v6>[0-9a-f:.]+)\]|(?P<name>[a-z0-9_](?:[a-z0-9_.-]*[a-z0-9_])?\.?))(?::(?P<port>[0-9]{1,5}))?"
)
MAX_BODY_BYTES = 1 << 20  # the console's forms and the API's writes are tiny
MAX_QUERY_BYTES = 8192
MAX_QUERY_PARAMS = 64
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
FORM = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"
YAML_TYPES = ("application/x-yaml", "application/yaml", "text/yaml", "text/x-yaml")
#: Routes that take uploads: their own body limit and the extra Content-Types they accept.
UPLOADS = {("POST", "/api/jobs"): (MAX_UPLOAD_BYTES, (MULTIPART, *YAML_TYPES))}
#: A retry with new plugin code takes the project as POST /api/jobs does (multipart), by job id.
RETRY_UPLOAD = re.compile(r"/api/jobs/[0-9]{1,18}/retry")
# The pages load only the console's own files; injected markup could not run a script anyway.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)
HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
)


class Refused(Exception):
    """Raised when a request cannot be served as sent; ``status`` and a message that says what to fix."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


def wants_json(request: Request) -> bool:
    path = request.url.path
    if path.startswith("/api/") or path in ("/metrics", "/openapi.json"):
        return True
    return "application/json" in request.headers.get("accept", "")


TITLES = {400: "Bad request", 401: "Sign in", 403: "Forbidden", 413: "Too large", 414: "Too long"}


def problem(
    scope: Scope, status: int, detail: str, headers: dict[str, str] | None = None, *, sign_in: bool = False
) -> Response:
    """The error answer for ``scope``: ``{"detail": ...}`` for the API, the error page for a browser
    (with the login form, back to this page, when ``sign_in``)."""
    request = Request(scope)
    if wants_json(request):
        return JSONResponse({"detail": detail}, status_code=status, headers=headers)
    rest = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "token"])
    here = request.url.path + (f"?{rest}" if rest else "")
    context = {
        "status_code": status,
        "title": TITLES.get(status, "Error"),
        "detail": detail,
        "ask_token": sign_in,
        "next_url": here if request.method == "GET" else "/jobs",
    }
    return templates.TemplateResponse(request, "error.html", context, status_code=status, headers=headers)


class EdgeGuard:
    """ASGI middleware: Host allow-list, path/query/body limits, security headers."""

    def __init__(self, app: ASGIApp, *, allowed_hosts: Iterable[str] = ()) -> None:
        self.app = app
        self.allowed = tuple(dict.fromkeys([*LOOPBACK_HOSTS, *(_hostname(h) for h in allowed_hosts)]))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = [
                    *message.get("headers", []),
                    *(h for h in HEADERS if h[0] not in present),
                ]
            await send(message)

        try:
            self._check_host(scope)
            check_path(scope.get("raw_path") or scope["path"].encode())
            check_query(scope.get("query_string", b""))
            body = await self._read_body(scope, receive) if scope["method"] in UNSAFE_METHODS else None
        except Refused as exc:
            await problem(scope, exc.status, exc.detail)(scope, receive, send_with_headers)
            return
        await self.app(scope, receive if body is None else replay(body, receive), send_with_headers)

    def _check_host(self, scope: Scope) -> None:
        values = [v for k, v in scope["headers"] if k.lower() == b"host"]
        if len(values) > 1:
            raise Refused(400, f"the request has {len(values)} Host headers; send exactly one")
        host = values[0].decode("latin-1") if values else ""
        name = host_name(host)
        if name is not None and name in self.allowed:
            return
        if name is None:
            raise Refused(
                400,
                f"the Host header {host!r} is not a host name or [IPv6] address with an optional :port "
                "(nothing else: no spaces, user or text after it)",
            )
        raise Refused(
            400,
            f"the Host header {host!r} is not a name this console answers to ({', '.join(self.allowed)}); "
            f"if you reach it by that name, start it with `plugtune serve --allowed-host {name}` "
            "(or PLUGTUNE_ALLOWED_HOSTS)",
        )

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        request = Request(scope)
        kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        limit, extra_types = upload_limits(scope["method"], scope["path"].rstrip("/"), kind)
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise _too_large(int(declared), limit, scope)
        body = await read_body(receive, limit, scope)
        if body.strip():
            check_body(body, request.headers.get("content-type", ""), extra_types)
        return body


def check_path(raw: bytes) -> None:
    """A path must be UTF-8 after percent-decoding, without NUL or ``..``/``.`` segments."""
    decoded = _utf8("the path", unquote_to_bytes(raw))
    if "\x00" in decoded:
        raise Refused(400, "the path contains a NUL byte (%00); no job, plugin, file or trajectory has one")
    if any(part in ("..", ".") for part in decoded.split("/")):
        raise Refused(400, f"the path {decoded!r} has a '..' or '.' segment; name the resource directly")


def check_query(raw: bytes) -> None:
    """At most MAX_QUERY_BYTES in MAX_QUERY_PARAMS parameters, each name and value UTF-8 without NUL."""
    if len(raw) > MAX_QUERY_BYTES:
        raise Refused(414, f"the query string is {len(raw)} bytes; at most {MAX_QUERY_BYTES} are accepted")
    pairs = [p for p in raw.split(b"&") if p]
    if len(pairs) > MAX_QUERY_PARAMS:
        raise Refused(400, f"the query has {len(pairs)} parameters; at most {MAX_QUERY_PARAMS} are accepted")
    check_pairs(pairs, "query parameter")


def check_pairs(pairs: list[bytes], what: str) -> None:
    """Each ``name=value`` of a query or a form is UTF-8 after decoding and holds no NUL."""
    for pair in pairs:
        name_raw, _, value_raw = pair.partition(b"=")
        name = _utf8(f"a {what}'s name", unquote_to_bytes(name_raw.replace(b"+", b" ")))
        value = _utf8(f"{what} {name!r}", unquote_to_bytes(value_raw.replace(b"+", b" ")))
        if "\x00" in name or "\x00" in value:
            raise Refused(400, f"{what} {name.replace(chr(0), '')!r} contains a NUL byte (%00)")


def upload_limits(method: str, path: str, kind: str = "") -> tuple[int, tuple[str, ...]]:
    """The body limit and extra Content-Types of a route (an upload route's, else the default); a
    retry's upload limit is only for its multipart body (the project), its other bodies stay small."""
    if method == "POST" and RETRY_UPLOAD.fullmatch(path):
        return (MAX_UPLOAD_BYTES if kind == MULTIPART else MAX_BODY_BYTES), (MULTIPART,)
    return UPLOADS.get((method, path), (MAX_BODY_BYTES, ()))


def check_body(body: bytes, content_type: str, extra_types: tuple[str, ...] = ()) -> None:
    """A write's body must be a form (the console) or JSON (the API), and well formed; an upload
    route also takes its ``extra_types`` (multipart, or job.yaml's text in UTF-8)."""
    kind = content_type.partition(";")[0].strip().lower()
    if kind in extra_types:
        if kind in YAML_TYPES:
            _utf8("the job.yaml body", body)
        return
    if kind == "application/json":
        text = _utf8("the request body", body)
        try:
            json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise Refused(400, f"the request body is not valid JSON: {str(exc)[:200]}") from None
    elif kind == FORM:
        check_pairs([p for p in body.split(b"&") if p], "form field")
    else:
        also = f" (this route also takes {', '.join(extra_types)})" if extra_types else ""
        raise Refused(
            415,
            f"Content-Type {content_type or '(none)'!r} is not accepted for a request body: send "
            f"application/json to the API, {FORM} from a form, or no body{also}",
        )


async def read_body(receive: Receive, limit: int, scope: Scope | None = None) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Refused(400, "the client disconnected before sending the whole request body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit, scope, more=True)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replay(body: bytes, then: Receive) -> Receive:
    """A ``receive`` that hands the app the already read body, then the client's next messages."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return await then()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def _too_large(size: int, limit: int, scope: Scope | None, *, more: bool = False) -> Refused:
    got = f"more than {limit}" if more else str(size)
    what = f"{scope['method']} {scope['path']}" if scope is not None else "the console"
    if limit == MAX_BODY_BYTES:
        return Refused(413, f"the request body is {got} bytes; {what} accepts at most {limit} (1 MiB)")
    return Refused(
        413,
        f"the request body is {got} bytes; {what} accepts at most {limit}"
        f"{f' ({limit >> 20} MiB)' if limit >= 1 << 20 else ''}: keep large data files on the server "
        "and name them by absolute path in job.yaml",
    )


def _utf8(what: str, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refused(
            400, f"{what} is not valid UTF-8 (byte {exc.start}: {raw[exc.start : exc.start + 1]!r})"
        ) from None


def host_name(header: str) -> str | None:
    """The name a Host header value carries (lower case, without its port or a trailing dot; an
    IPv6 address in its short form), or None when the value is not exactly ``name[:port]`` or
    ``[v6][:port]``."""
    found = HOST_HEADER.fullmatch(header.lower())
    if found is None or int(found["port"] or 0) > 65535:
        return None
    if found["v6"] is not None:
        try:
            return ipaddress.IPv6Address(found["v6"]).compressed
        except ValueError:
            return None
    return str(found["name"]).rstrip(".")


def _hostname(host: str) -> str:
    """An allowed name as the operator gave it (``name``, ``name:port``, ``v6`` or ``[v6]:port``),
    in the form ``host_name`` compares."""
    host = host.strip().lower()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    try:
        return ipaddress.IPv6Address(host).compressed
    except ValueError:
        return host.rstrip(".")
