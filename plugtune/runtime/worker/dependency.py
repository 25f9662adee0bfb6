"""Did a failed call fail on a service the plugin called? Read from the exception chain, in the worker
(where the exception object is), for httpx, openai, requests, aiohttp and urllib, without importing
any of them (classes are matched by module and name along the MRO).

``find(exc, ...)`` returns a :class:`Finding` (cause, host, port, status, the plugin line that made
the request) or None when the failure is the plugin's own. Causes are ``DependencyCause`` values:
``rate limited`` (429), ``server error`` (5xx), ``unreachable`` (connect, DNS, TLS, reset),
``timeout`` (the client's own timeout, or the runtime's 504 with :data:`TIMEOUT_HEADER` when the
dependency outlived its declared ``timeout_s``), ``bad reply`` (a reply that does not parse). Other 4xx
answers (400, 401, 404) stay the plugin's: they say the request was wrong. A connection that
``network: policy-only`` refused (``PolicyRefused``) is reported apart (``policy_refused``): the
job's configuration, not the service, is at fault.
"""

from __future__ import annotations

import datetime
import email.utils
import time
import traceback
import urllib.parse
from dataclasses import dataclass
from typing import Any

RATE_LIMITED, SERVER_ERROR, UNREACHABLE, TIMEOUT, BAD_REPLY = (
    "rate limited",
    "server error",
    "unreachable",
    "timeout",
    "bad reply",
)
CLIENTS = ("httpx", "httpcore", "openai", "requests", "urllib3", "aiohttp", "urllib", "http")
MAX_CHAIN = 16
#: The header of the 504 the runtime's bridge answers when a dependency outlives its declared
#: ``timeout_s`` (``plugtune.runtime.bridge``): such a 504 is the dependency's ``timeout``.
TIMEOUT_HEADER = "X-Plugtune-Dependency-Timeout"


@dataclass
class Finding:
    cause: str
    host: str = ""
    port: int | None = None
    status: int | None = None
    url: str = ""
    retry_after: str = ""
    where: str = ""  # file:line of the plugin's code that made the request (or raised on its reply)
    error: str = ""  # the client's exception, "Type: message"
    policy_refused: str = ""  # host:port that network policy-only refused
    declared_timeout: str = ""  # the declared timeout_s the runtime held the dependency to (its 504)
    dependency: str = ""  # the declared name, when the host:port is declared

    def retry_after_s(self) -> float | None:
        """The reply's ``Retry-After`` in seconds (delta-seconds or an HTTP date), None without one."""
        return retry_after_seconds(self.retry_after)

    def message(self) -> str:
        if self.policy_refused:
            return (
                f"network policy-only refused the connection to {self.policy_refused}"
                + (f" made at {self.where}" if self.where else "")
                + ": it is not a declared dependency of this function (declare it in job.yaml "
                "`dependencies:`, or set `network: any`)"
            )
        who = f"the dependency {self.dependency}" if self.dependency else "a service the plugin calls"
        address = f"{self.host}:{self.port}" if self.host and self.port else self.host or "an unknown host"
        what = {
            RATE_LIMITED: f"answered HTTP {self.status or 429} (rate limited)",
            SERVER_ERROR: f"answered HTTP {self.status} (server error)",
            UNREACHABLE: "could not be reached (unreachable)",
            TIMEOUT: (
                f"did not answer within its declared timeout_s ({self.declared_timeout} s) (timeout)"
                if self.declared_timeout
                else "did not answer in time (timeout: the client's own)"
            ),
            BAD_REPLY: "sent a reply that does not parse (bad reply)",
        }[self.cause]
        after = f", Retry-After: {self.retry_after}" if self.retry_after else ""
        made = f" on the request the plugin made at {self.where}" if self.where else ""
        return f"{who} ({address}) {what}{after}{made}: {self.error}"


def chain(exc: BaseException) -> list[BaseException]:
    """``exc``, its ``__cause__``/``__context__`` and theirs, outermost first (bounded, no cycles)."""
    out: list[BaseException] = []
    todo: list[BaseException] = [exc]
    while todo and len(out) < MAX_CHAIN:
        item = todo.pop(0)
        if any(item is seen for seen in out):
            continue
        out.append(item)
        for nxt in (item.__cause__, item.__context__):
            if nxt is not None:
                todo.append(nxt)
    return out


def _names(exc: BaseException) -> list[tuple[str, str]]:
    return [(c.__module__.split(".")[0], c.__name__) for c in type(exc).__mro__]


def _is(exc: BaseException, module: str, *names: str) -> bool:
    return any(m == module and n in names for m, n in _names(exc))


def _from_client(exc: BaseException) -> bool:
    return any(m in CLIENTS for m, _ in _names(exc))


def _raised_in_client(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside an HTTP client's code (a frame of one of ``CLIENTS``)."""
    tb = exc.__traceback__
    while tb is not None:
        if str(tb.tb_frame.f_globals.get("__name__", "")).split(".")[0] in CLIENTS:
            return True
        tb = tb.tb_next
    return False


def _attr(obj: Any, *path: str) -> Any:
    for name in path:
        try:
            obj = getattr(obj, name)
        except Exception:  # noqa: BLE001 - httpx raises RuntimeError for an unset .request
            return None
        if obj is None:
            return None
    return obj


def _status_of(exc: BaseException) -> int | None:
    for path in (("status_code",), ("response", "status_code"), ("status",), ("code",)):
        value = _attr(exc, *path)
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
            return value
    return None


def _url_of(exc: BaseException) -> str:
    for path in (
        ("request", "url"),
        ("response", "url"),
        ("response", "request", "url"),
        ("request_info", "real_url"),
        ("request_info", "url"),
        ("url",),
        ("filename",),  # urllib.error.HTTPError
    ):
        value = _attr(exc, *path)
        if value is not None and "://" in str(value):
            return str(value)
    host, port = _attr(exc, "host"), _attr(exc, "port")  # aiohttp's ClientConnectorError
    if isinstance(host, str) and host and isinstance(port, int):
        return f"http://{host}:{port}"
    return ""


#: A ``Retry-After`` longer than this is read as this (a misconfigured service must not park a call
#: for a day; the caller's own bounds apply on top).
MAX_RETRY_AFTER_S = 3600.0


def retry_after_seconds(text: str) -> float | None:
    """``Retry-After`` as seconds from now: ``"2"``/``"1.5"`` or an HTTP date; None when absent or
    unreadable; clamped to ``0..MAX_RETRY_AFTER_S``."""
    text = text.strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.timezone.utc)
        seconds = when.timestamp() - time.time()
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def _header(exc: BaseException, name: str) -> str:
    """A header of the reply an HTTP error carries ("" without one), bounded."""
    for path in (("response", "headers"), ("headers",), ("hdrs",)):
        headers = _attr(exc, *path)
        if headers is None:
            continue
        try:
            value = headers.get(name) or headers.get(name.lower())
        except Exception:  # noqa: BLE001 - not a mapping after all
            continue
        if value:
            return str(value)[:64]
    return ""


def _retry_after(exc: BaseException) -> str:
    return _header(exc, "Retry-After")


def _from_frames(exc: BaseException) -> str:
    """The URL a client was working on where ``exc`` was raised (a reply that failed to parse in
    ``Response.json()``, a connection http.client lost): read from the client's frames."""
    tb = exc.__traceback__
    found = ""
    while tb is not None:
        frame = tb.tb_frame
        module = str(frame.f_globals.get("__name__", "")).split(".")[0]
        if module in CLIENTS:
            owner = frame.f_locals.get("self")
            url = (
                _attr(owner, "url")
                or _attr(owner, "request", "url")
                or _attr(frame.f_locals.get("req"), "full_url")
            )
            host, port = _attr(owner, "host"), _attr(owner, "port")
            if url is not None and "://" in str(url):
                found = str(url)
            elif not found and isinstance(host, str) and host and isinstance(port, int):
                found = f"http://{host}:{port}"
        tb = tb.tb_next
    return found


def _cause(exc: BaseException) -> tuple[str, int | None] | None:
    """The cause one exception of the chain shows, with the HTTP status when it has one."""
    if getattr(exc, "policy_refused", None):
        return "policy", None
    if isinstance(exc, ConnectionError) and _raised_in_client(exc):
        # the socket's own error out of a client's frames (urllib lets a reset while it reads the
        # reply out bare; sending, it wraps it in URLError): the connection was lost, as any client
        # error that says so
        return UNREACHABLE, None
    if not _from_client(exc):
        return None
    status = _status_of(exc)
    if status is not None and (
        _is(exc, "httpx", "HTTPStatusError")
        or _is(exc, "openai", "APIStatusError")
        or _is(exc, "requests", "HTTPError")
        or _is(exc, "aiohttp", "ClientResponseError")
        or _is(exc, "urllib", "HTTPError")
    ):
        if _is(exc, "aiohttp", "ContentTypeError"):
            return BAD_REPLY, status
        if status == 429:
            return RATE_LIMITED, status
        if status == 504 and _header(exc, TIMEOUT_HEADER):
            return TIMEOUT, status  # the runtime held the dependency to its declared timeout_s
        if status >= 500:
            return SERVER_ERROR, status
        if status == 408:
            return TIMEOUT, status
        return "", status  # a 4xx the request itself caused: the plugin's
    if _is(exc, "openai", "APIResponseValidationError") or _is(exc, "httpx", "DecodingError"):
        return BAD_REPLY, status
    if _is(exc, "requests", "JSONDecodeError") or _is(exc, "aiohttp", "ContentTypeError"):
        return BAD_REPLY, status
    if (
        _is(exc, "httpx", "TimeoutException")
        or _is(exc, "httpcore", "TimeoutException")
        or _is(exc, "openai", "APITimeoutError")
        or _is(exc, "requests", "Timeout")
        or _is(exc, "urllib3", "TimeoutError")
        or _is(exc, "aiohttp", "ServerTimeoutError", "ConnectionTimeoutError", "SocketTimeoutError")
    ):
        return TIMEOUT, None
    if (
        _is(exc, "httpx", "TransportError")
        or _is(exc, "httpcore", "NetworkError", "ProtocolError")
        or _is(exc, "openai", "APIConnectionError")
        or _is(exc, "requests", "ConnectionError")
        or _is(exc, "urllib3", "HTTPError")
        or _is(exc, "aiohttp", "ClientConnectionError", "ClientPayloadError")
        or _is(exc, "urllib", "URLError")
        or _is(exc, "http", "RemoteDisconnected", "IncompleteRead", "BadStatusLine")
    ):
        reason = _attr(exc, "reason")
        if isinstance(reason, TimeoutError):  # urllib's URLError(timeout)
            return TIMEOUT, None
        return UNREACHABLE, None
    return None


def find(
    exc: BaseException,
    code_root: str,
    declared: dict[tuple[str, int], str],
    policy: set[tuple[str, int]] | None = None,
) -> Finding | None:
    """What the failed call's exception chain says about a dependency (None: the plugin's own).

    The policy is no dependency: a failure raised in the SDK's policy client, or on a request to
    one of the ``policy`` addresses (``host, port`` the call's policy was reached at), is not one."""
    links = chain(exc)
    if any(_in_policy_client(item) for item in links):
        return None
    found: Finding | None = None
    for item in links:  # outermost first: openai's RateLimitError before httpx's HTTPStatusError
        got = _cause(item)
        if got is None:
            continue
        cause, status = got
        if cause == "policy":
            refused = str(item.policy_refused)  # type: ignore[attr-defined]
            return Finding(
                UNREACHABLE, policy_refused=refused, where=_where(exc, code_root), error=_text(item)
            )
        if cause == "":
            return None
        if found is None:
            found = Finding(cause, status=status, error=_text(item))
            if cause == TIMEOUT and status == 504:
                found.declared_timeout = _header(item, TIMEOUT_HEADER)
        if not found.url:
            found.url = _url_of(item)
        if not found.retry_after:
            found.retry_after = _retry_after(item)
        if found.status is None:
            found.status = status
    if found is None:
        found = _bad_json(links)
        if found is None:
            return None
    for item in links:  # a client wrapping a policy refusal (openai's APIConnectionError)
        if getattr(item, "policy_refused", None):
            refused = str(item.policy_refused)  # type: ignore[attr-defined]
            return Finding(
                UNREACHABLE, policy_refused=refused, where=_where(exc, code_root), error=found.error
            )
    for item in links:
        if found.url:
            break
        found.url = _url_of(item) or _from_frames(item)
    _address(found, declared)
    if policy and found.port is not None and (found.host, found.port) in policy:
        return None
    found.where = _where(exc, code_root)
    return found


def _in_policy_client(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if str(tb.tb_frame.f_globals.get("__name__", "")).startswith("plugtune.sdk"):
            return True
        tb = tb.tb_next
    return False


def _bad_json(links: list[BaseException]) -> Finding | None:
    for item in links:
        if isinstance(item, ValueError) and type(item).__name__ == "JSONDecodeError":
            url = _from_frames(item)
            if url:
                return Finding(BAD_REPLY, url=url, error=_text(item))
    return None


def _address(found: Finding, declared: dict[tuple[str, int], str]) -> None:
    if not found.url:
        return
    parts = urllib.parse.urlsplit(found.url)
    found.host = (parts.hostname or "").lower()
    try:
        found.port = parts.port or (443 if parts.scheme in ("https", "wss") else 80)
    except ValueError:
        found.port = None
    if found.port is not None:
        found.dependency = declared.get((found.host, found.port), "")


def _where(exc: BaseException, code_root: str) -> str:
    mine = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(code_root)]
    if not mine:
        return ""
    last = mine[-1]
    rel = last.filename[len(code_root) :].lstrip("/") if code_root else last.filename
    return f"{rel}:{last.lineno}"


def _text(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__
