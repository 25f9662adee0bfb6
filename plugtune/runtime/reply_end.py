"""Where a plain HTTP/1.1 reply ends, read as its bytes pass through the policy-only relay.

The relay closes a dependency connection that holds a budget slot while others wait only once it is
idle *between* replies (a client's kept-alive pool). Bytes alone cannot say that: a reply that
streams and pauses for a second is idle on the wire but not finished, and a connection that has sent
no request yet holds its slot without having been answered. :class:`ReplyEnd` follows the
request/reply turns: a request (its first bytes after the last reply ended) opens a reply, and the
reply is over once its body is in (``Content-Length``, chunked to its last chunk and trailer, or none:
``HEAD``, 1xx-then-final, 204, 304). A reply whose end the framing does not give (read to the
connection's close, an upgrade, a head past :data:`HEAD_MAX`, a malformed chunk size) is
:attr:`unknown`: the relay then falls back to bytes alone.
"""

from __future__ import annotations

HEAD_MAX = 64 * 1024  # a reply's status line and headers; past this its end is unknown
TRAILER_MAX = 64 * 1024
CHUNK_LINE_MAX = 4096


class ReplyEnd:
    """One connection's request/reply turns (HTTP/1.1, not pipelined)."""

    def __init__(self) -> None:
        self.state = "done"  # done | head | length | size | data | crlf | trailer | unknown
        self.buffer = b""
        self.left = 0
        self.bodiless = False  # the open request is a HEAD: its reply has no body

    @property
    def done(self) -> bool:
        """No reply is awaited or under way: the connection sits between requests."""
        return self.state == "done"

    @property
    def unknown(self) -> bool:
        return self.state == "unknown"

    def request(self, data: bytes) -> None:
        """The plugin sent ``data``: a new request when no reply was awaited."""
        if data and self.state == "done":
            self.state, self.buffer, self.bodiless = "head", b"", data.startswith(b"HEAD ")

    def reply(self, data: bytes) -> None:
        """The dependency sent ``data``."""
        for _ in range(len(data) + 2):  # each turn consumes bytes or changes state
            if not data or self.state in ("done", "unknown"):
                return
            data = getattr(self, f"_{self.state}")(data)

    def _head(self, data: bytes) -> bytes:
        self.buffer += data
        head, sep, rest = self.buffer.partition(b"\r\n\r\n")
        if not sep:
            if len(self.buffer) > HEAD_MAX:
                self.state = "unknown"
            return b""
        self.buffer = b""
        lines = head.split(b"\r\n")
        status = lines[0].split(b" ", 2)
        if len(status) < 2 or not status[0].startswith(b"HTTP/1.") or not status[1].isdigit():
            self.state = "unknown"
            return b""
        code = int(status[1])
        headers: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        if 100 <= code < 200 and code != 101:
            return rest  # informational: the final reply's head follows
        if code == 101:
            self.state = "unknown"  # upgraded: no longer HTTP
        elif self.bodiless or code in (204, 304):
            self.state = "done"
        elif b"chunked" in headers.get(b"transfer-encoding", b""):
            self.state = "size"
        elif headers.get(b"content-length", b"").isdigit():
            self.left = int(headers[b"content-length"])
            self.state = "length" if self.left else "done"
        else:
            self.state = "unknown"  # read to the connection's close
        return rest

    def _length(self, data: bytes) -> bytes:
        take = min(self.left, len(data))
        self.left -= take
        if not self.left:
            self.state = "done"
        return data[take:]

    def _size(self, data: bytes) -> bytes:
        self.buffer += data
        line, sep, rest = self.buffer.partition(b"\r\n")
        if not sep:
            if len(self.buffer) > CHUNK_LINE_MAX:
                self.state = "unknown"
            return b""
        self.buffer = b""
        size = line.split(b";", 1)[0].strip()
        try:
            self.left = int(size, 16)
        except ValueError:
            self.state = "unknown"
            return b""
        self.state = "data" if self.left else "trailer"
        return rest

    def _data(self, data: bytes) -> bytes:
        take = min(self.left, len(data))
        self.left -= take
        if not self.left:
            self.state, self.left = "crlf", 2
        return data[take:]

    def _crlf(self, data: bytes) -> bytes:
        take = min(self.left, len(data))
        self.left -= take
        if not self.left:
            self.state = "size"
        return data[take:]

    def _trailer(self, data: bytes) -> bytes:
        self.buffer += data
        if self.buffer.startswith(b"\r\n"):
            end = 2
        else:
            found = self.buffer.find(b"\r\n\r\n")
            if found < 0:
                if len(self.buffer) > TRAILER_MAX:
                    self.state = "unknown"
                return b""
            end = found + 4
        rest, self.buffer, self.state = self.buffer[end:], b"", "done"
        return rest
