"""HTTP/1.1 POSTs for ``Policy``: kept-alive connections per thread (sync) and per event loop (async).

A rollout asks the policy gateway many short questions, so each call reuses an open connection
when there is one (no TCP handshake, no new connection for the gateway to accept) and reads the
plain-HTTP reply itself: ``http.client`` parses every reply's headers with the email package,
which costs several times more per call. HTTPS (a remote policy server) goes through
``http.client`` when sync and through asyncio's TLS streams when async.

``post`` blocks its thread; its connections are per thread. ``apost`` runs on the caller's event
loop with no thread at all: its connections are per event loop and shared by the loop's tasks
(one task at a time per connection), so an ``async def`` rollout with many calls in flight needs
neither threads nor one connection per thread.

A reused connection that the server has meanwhile closed (an idle timeout) fails before any reply
arrives; the request is then sent once more on a fresh connection. Any other failure closes the
connection, so no half-sent request or half-read reply is left for the next call.
"""

from __future__ import annotations

import asyncio
import http.client
import socket
import ssl
import threading
import urllib.parse
from typing import Protocol

#: The most bytes of status line and headers a reply may have.
MAX_HEAD = 64 * 1024

# A reused keep-alive connection that the server has meanwhile closed fails in one of these ways
# before any reply arrives.
_STALE_CONNECTION = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)

Key = tuple[str, str]  # (scheme, host:port)


def post(
    url: urllib.parse.SplitResult, body: bytes, headers: dict[str, str], timeout_s: float
) -> tuple[int, bytes]:
    """Status and body of one POST, on this thread's open connection to the server when there is one."""
    pool = _thread_pool()
    key = (url.scheme, url.netloc)
    conn = pool.get(key)
    reused = conn is not None and conn.is_open
    if conn is None:
        conn = pool[key] = _connect(url)
    try:
        try:
            return conn.exchange(_path(url), body, headers, timeout_s)
        except _STALE_CONNECTION:
            if not reused:
                raise
            conn.close()
            return conn.exchange(_path(url), body, headers, timeout_s)
    except BaseException:
        conn.close()
        raise


async def apost(url: urllib.parse.SplitResult, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    """Status and body of one POST, on an idle connection of the running loop when there is one.

    The caller bounds the time (``asyncio.wait_for``); a cancelled call closes its connection.
    """
    idle = _loop_pool(asyncio.get_running_loop()).setdefault((url.scheme, url.netloc), [])
    conn = None
    while idle and conn is None:
        conn = idle.pop()
        if conn.reader.at_eof():  # the server closed it while it was idle
            conn.close()
            conn = None
    reused = conn is not None
    if conn is None:
        conn = await _AsyncConnection.open(url)
    try:
        try:
            status, payload, keep = await conn.exchange(_path(url), body, headers)
        except _STALE_CONNECTION:
            if not reused:
                raise
            conn.close()
            conn = await _AsyncConnection.open(url)
            status, payload, keep = await conn.exchange(_path(url), body, headers)
    except BaseException:
        conn.close()
        raise
    if keep:
        idle.append(conn)
    else:
        conn.close()
    return status, payload


def _parse_head(head: str) -> tuple[int, dict[str, str]]:
    """The status code and the (lower-cased) header fields of a reply's head."""
    status_line, *header_lines = head.split("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise http.client.BadStatusLine(status_line)
    fields = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    return int(parts[1]), fields


def _request_head(path: str, netloc: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {netloc}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _path(url: urllib.parse.SplitResult) -> str:
    return url.path + (f"?{url.query}" if url.query else "")


def _keeps_open(fields: dict[str, str]) -> bool:
    return fields.get("connection", "").lower() != "close"


# ---- sync: one connection per thread and server ---------------------------------------------


class _Connection(Protocol):
    @property
    def is_open(self) -> bool: ...

    def exchange(
        self, path: str, body: bytes, headers: dict[str, str], timeout_s: float
    ) -> tuple[int, bytes]: ...

    def close(self) -> None: ...


_threads = threading.local()


def _thread_pool() -> dict[Key, _Connection]:
    pool: dict[Key, _Connection] | None = getattr(_threads, "pool", None)
    if pool is None:
        pool = _threads.pool = {}
    return pool


def _connect(url: urllib.parse.SplitResult) -> _Connection:
    if url.scheme == "https":
        return _TLSConnection(url.netloc)
    return _PlainConnection(url.netloc)


class _PlainConnection:
    """HTTP/1.1 over one kept-alive TCP socket: a POST out, the reply in.

    A reply is a status line, headers and a body sized by ``Content-Length`` or sent in chunks (or,
    with neither, running to the end of the connection).
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
        self.sock.sendall(_request_head(path, self.netloc, body, headers) + body)
        status, fields = self._head()
        if fields.get("transfer-encoding", "").lower() == "chunked":
            payload = self._chunked()
        elif "content-length" in fields:
            payload = self._exactly(int(fields["content-length"]))
        else:
            payload = self._to_end()
        if not _keeps_open(fields):
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
        return _parse_head(head)

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


# ---- async: idle connections per event loop and server -----------------------------------------

_loops_lock = threading.Lock()
_loops: dict[asyncio.AbstractEventLoop, dict[Key, list[_AsyncConnection]]] = {}


def _loop_pool(loop: asyncio.AbstractEventLoop) -> dict[Key, list[_AsyncConnection]]:
    """The idle connections of ``loop``; those of loops closed meanwhile are let go."""
    with _loops_lock:
        pool = _loops.get(loop)
        if pool is None:
            for closed in [other for other in _loops if other.is_closed()]:
                del _loops[closed]  # their sockets close as their transports are collected
            pool = _loops[loop] = {}
        return pool


class _AsyncConnection:
    """HTTP/1.1 over one kept-alive asyncio stream (TCP, or TLS for https)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, netloc: str) -> None:
        self.reader, self.writer, self.netloc = reader, writer, netloc

    @classmethod
    async def open(cls, url: urllib.parse.SplitResult) -> _AsyncConnection:
        host = url.hostname or "127.0.0.1"
        port = url.port or (443 if url.scheme == "https" else 80)
        tls = ssl.create_default_context() if url.scheme == "https" else None
        # asyncio sets TCP_NODELAY on its TCP streams; ``limit`` bounds what readuntil buffers.
        reader, writer = await asyncio.open_connection(host, port, ssl=tls, limit=MAX_HEAD)
        return cls(reader, writer, url.netloc)

    def close(self) -> None:
        self.writer.close()

    async def exchange(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes, bool]:
        """Status, body, and whether the connection stays open for the next call."""
        self.writer.write(_request_head(path, self.netloc, body, headers) + body)
        await self.writer.drain()
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError as exc:
            raise http.client.HTTPException(f"the reply's headers are longer than {MAX_HEAD} bytes") from exc
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:  # closed before any reply: a kept-alive connection the server let go
                raise http.client.RemoteDisconnected(
                    "the server closed the connection without a reply"
                ) from None
            raise http.client.IncompleteRead(exc.partial) from exc
        status, fields = _parse_head(head[:-4].decode("latin-1"))
        try:
            if fields.get("transfer-encoding", "").lower() == "chunked":
                payload = await self._chunked()
            elif "content-length" in fields:
                payload = await self.reader.readexactly(int(fields["content-length"]))
            else:
                return status, await self.reader.read(), False
        except asyncio.IncompleteReadError as exc:
            raise http.client.IncompleteRead(exc.partial) from exc
        return status, payload, _keeps_open(fields)

    async def _chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            line = await self.reader.readuntil(b"\r\n")
            size = int(line[:-2].split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while await self.reader.readuntil(b"\r\n") != b"\r\n":  # trailers, up to the empty line
                    pass
                return b"".join(parts)
            parts.append(await self.reader.readexactly(size))
            await self.reader.readuntil(b"\r\n")
