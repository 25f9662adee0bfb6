"""``Policy``: how a rollout reaches the model being trained (the policy gateway)."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol


class PolicyError(RuntimeError):
    """Raised by ``Policy.chat`` when the gateway answers with an error or cannot be reached."""


# A reused keep-alive connection that the server has meanwhile closed fails in one of these ways
# before any reply arrives; the request is then sent once more on a fresh connection.
_STALE_CONNECTION = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


@dataclass(frozen=True)
class Policy:
    """An OpenAI-compatible endpoint with a per-trajectory key; tokens are recorded server-side.

    Use ``openai()`` / ``async_openai()`` for the official client, or ``chat()`` / ``achat()``,
    which need no extra package. ``chat`` keeps one HTTP connection open per thread and server,
    so a rollout's calls (and the next rollouts run on the same thread) skip the TCP handshake,
    and reads plain-HTTP replies itself (``http.client`` costs several times more per call).
    """

    base_url: str
    api_key: str
    model: str = "policy"
    timeout_s: float = 600.0

    # Per thread: (scheme, host:port) -> an open keep-alive connection.
    _connections: ClassVar[threading.local] = threading.local()

    def openai(self) -> Any:
        """A sync ``openai.OpenAI`` client bound to this trajectory."""
        import openai

        return openai.OpenAI(
            base_url=self.base_url, api_key=self.api_key, timeout=self.timeout_s, max_retries=0
        )

    def async_openai(self) -> Any:
        """An ``openai.AsyncOpenAI`` client bound to this trajectory."""
        import openai

        return openai.AsyncOpenAI(
            base_url=self.base_url, api_key=self.api_key, timeout=self.timeout_s, max_retries=0
        )

    def chat(self, messages: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
        """POST /chat/completions and return the JSON reply (stdlib only, blocking).

        Raises ``PolicyError`` with the gateway's message on an error reply, and when the
        gateway cannot be reached or does not answer within ``timeout_s``.
        """
        body = json.dumps({"model": self.model, "messages": messages, **params}).encode()
        url = urllib.parse.urlsplit(self.base_url.rstrip("/") + "/chat/completions")
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"}
        try:
            status, payload = self._post(url, body, headers)
        except TimeoutError as exc:
            raise PolicyError(
                f"the policy gateway at {self.base_url} did not answer within {self.timeout_s:g} s"
            ) from exc
        except (OSError, http.client.HTTPException) as exc:
            raise PolicyError(f"cannot reach the policy gateway at {self.base_url}: {exc}") from exc
        if status >= 400:
            raise PolicyError(f"policy gateway answered {status}: {payload.decode(errors='replace')}")
        try:
            return dict(json.loads(payload))
        except ValueError as exc:
            raise PolicyError(f"the policy gateway's reply is not JSON: {payload[:200]!r}") from exc

    async def achat(self, messages: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
        """``chat`` for ``async def`` rollouts: runs the request off the event loop."""
        return await asyncio.to_thread(self.chat, messages, **params)

    @staticmethod
    def content(reply: dict[str, Any]) -> str:
        """The assistant text of a ``chat`` reply."""
        return str(reply["choices"][0]["message"].get("content") or "")

    def _post(self, url: urllib.parse.SplitResult, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        """Status and body of one POST, on this thread's open connection when there is one."""
        pool = _thread_pool(self._connections)
        key = (url.scheme, url.netloc)
        conn = pool.get(key)
        reused = conn is not None and conn.is_open
        if conn is None:
            conn = pool[key] = _connect(url)
        path = url.path + (f"?{url.query}" if url.query else "")
        try:
            try:
                return conn.exchange(path, body, headers, self.timeout_s)
            except _STALE_CONNECTION:
                if not reused:
                    raise
                conn.close()
                return conn.exchange(path, body, headers, self.timeout_s)
        except BaseException:
            conn.close()  # never leave a half-sent request or half-read reply for the next call
            raise


class _Connection(Protocol):
    @property
    def is_open(self) -> bool: ...

    def exchange(
        self, path: str, body: bytes, headers: dict[str, str], timeout_s: float
    ) -> tuple[int, bytes]: ...

    def close(self) -> None: ...


def _thread_pool(local: threading.local) -> dict[tuple[str, str], _Connection]:
    pool: dict[tuple[str, str], _Connection] | None = getattr(local, "pool", None)
    if pool is None:
        pool = local.pool = {}
    return pool


def _connect(url: urllib.parse.SplitResult) -> _Connection:
    if url.scheme == "https":
        return _TLSConnection(url.netloc)
    if url.scheme == "http":
        return _PlainConnection(url.netloc)
    raise PolicyError(f"the policy base_url must start with http:// or https://, not {url.scheme!r}")


#: The most bytes of status line and headers a reply may have.
MAX_HEAD = 64 * 1024


class _PlainConnection:
    """HTTP/1.1 over one kept-alive TCP socket: a POST out, the reply in.

    A reply is a status line, headers and a body sized by ``Content-Length`` or sent in chunks (or,
    with neither, running to the end of the connection). Reading it by hand costs a fraction of
    ``http.client``, which parses every reply's headers with the email package.
    """

    def __init__(self, netloc: str) -> None:
        parsed = urllib.parse.urlsplit(f"//{netloc}")
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.netloc = netloc
        self.sock: socket.socket | None = None
        self.buffer = b""

    @property
    def is_open(self) -> bool:
        return self.sock is not None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock, self.buffer = None, b""

    def exchange(
        self, path: str, body: bytes, headers: dict[str, str], timeout_s: float
    ) -> tuple[int, bytes]:
        if self.sock is None:
            self.sock = socket.create_connection((self.host, self.port), timeout=timeout_s)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(timeout_s)
        lines = [f"POST {path} HTTP/1.1", f"Host: {self.netloc}", f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        status, fields = self._head()
        if fields.get("transfer-encoding", "").lower() == "chunked":
            payload = self._chunked()
        elif "content-length" in fields:
            payload = self._exactly(int(fields["content-length"]))
        else:
            payload = self._to_end()
        if fields.get("connection", "").lower() == "close":
            self.close()
        return status, payload

    def _head(self) -> tuple[int, dict[str, str]]:
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(self.buffer) > MAX_HEAD:
                raise http.client.HTTPException(f"the reply's headers are longer than {MAX_HEAD} bytes")
            self._receive(first=not self.buffer)
        head, self.buffer = self.buffer[:end].decode("latin-1"), self.buffer[end + 4 :]
        status_line, *header_lines = head.split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise http.client.BadStatusLine(status_line)
        fields = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        return int(parts[1]), fields

    def _receive(self, first: bool = False) -> None:
        assert self.sock is not None
        chunk = self.sock.recv(65536)
        if not chunk:
            if first:  # closed before any reply: a kept-alive connection the server let go
                raise http.client.RemoteDisconnected("the server closed the connection without a reply")
            raise http.client.IncompleteRead(self.buffer)
        self.buffer += chunk

    def _exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            self._receive()
        payload, self.buffer = self.buffer[:size], self.buffer[size:]
        return payload

    def _line(self) -> bytes:
        while (end := self.buffer.find(b"\r\n")) < 0:
            self._receive()
        line, self.buffer = self.buffer[:end], self.buffer[end + 2 :]
        return line

    def _chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int(self._line().split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while self._line():  # trailers, up to the empty line
                    pass
                return b"".join(parts)
            parts.append(self._exactly(size))
            self._line()

    def _to_end(self) -> bytes:
        assert self.sock is not None
        while chunk := self.sock.recv(65536):
            self.buffer += chunk
        payload = self.buffer
        self.close()
        return payload


class _TLSConnection:
    """HTTPS through ``http.client`` (a remote policy server; the gateway itself is plain HTTP)."""

    def __init__(self, netloc: str) -> None:
        self.conn = http.client.HTTPSConnection(netloc)

    @property
    def is_open(self) -> bool:
        return self.conn.sock is not None

    def close(self) -> None:
        self.conn.close()

    def exchange(
        self, path: str, body: bytes, headers: dict[str, str], timeout_s: float
    ) -> tuple[int, bytes]:
        self.conn.timeout = timeout_s
        if self.conn.sock is not None:
            self.conn.sock.settimeout(timeout_s)
        self.conn.request("POST", path, body=body, headers=headers)
        response = self.conn.getresponse()
        return response.status, response.read()
