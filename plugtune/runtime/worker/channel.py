"""Writing frames from any thread, and turning logging / print output into LOG frames.

Writes are synchronous (the bytes are in the kernel before the writer goes on), so a line a
plugin logged is never lost when the process dies right after. A line longer than the supervisor
keeps is cut here already (a courtesy: the supervisor cuts and counts again, it trusts no worker).
"""

from __future__ import annotations

import _socket
import contextvars
import io
import logging
import select
import socket
import threading
import time
from typing import Any

from plugtune.runtime.loglimit import clip_line
from plugtune.runtime.protocol import LOG, pack

# The C method: the outbound counter patches ``socket.socket``'s for the plugin's own sockets; this
# one is the instance's channel to the supervisor (and not network traffic).
_send = _socket.socket.send

#: (call_id, trajectory_id) of the call running in this task or thread.
CURRENT_CALL: contextvars.ContextVar[tuple[str, str]] = contextvars.ContextVar(
    "plugtune_call", default=("", "")
)


class Channel:
    """A thread-safe framed writer on the instance's socket (blocking or not)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._lock = threading.Lock()
        self.closed = False
        self._outbox: list[bytes] = []

    def send(self, message: list[Any]) -> None:
        self.send_bytes(pack(message))

    def queue(self, message: list[Any], loop: Any, alone: bool = False) -> None:
        """From the event loop thread: send at the end of this loop turn, with the others queued
        (``alone``: nothing else is in flight, send now)."""
        if alone and not self._outbox:
            self.send_bytes(pack(message))
            return
        self._outbox.append(pack(message))
        if len(self._outbox) == 1:
            loop.call_soon(self.flush)

    def flush(self) -> None:
        data, self._outbox = b"".join(self._outbox), []
        if data:
            self.send_bytes(data)

    def send_bytes(self, payload: bytes) -> None:
        data: bytes | memoryview = payload
        with self._lock:
            if self.closed:
                return
            try:
                while data:
                    try:
                        sent = _send(self.sock, data)
                    except BlockingIOError:
                        select.select([], [self.sock], [], 1.0)
                        continue
                    if sent == len(data):
                        return
                    data = memoryview(data)[sent:]
            except OSError:
                self.closed = True

    def log(self, level: str, message: str, source: str) -> None:
        call_id, trajectory_id = CURRENT_CALL.get()
        self.send([LOG, time.time(), level, clip_line(message), source, call_id, trajectory_id])


class ChannelHandler(logging.Handler):
    """Sends every record (``ctx.logger`` and the user's own loggers) as a LOG frame."""

    def __init__(self, channel: Channel) -> None:
        super().__init__(logging.DEBUG)
        self.channel = channel
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = clip_line(self.format(record))
            call_id, trajectory_id = CURRENT_CALL.get()
            self.channel.send([LOG, record.created, record.levelname, text, "logger", call_id, trajectory_id])
        except Exception:  # noqa: BLE001 - a log line must never break the call
            self.handleError(record)


class LineWriter(io.TextIOBase):
    """Replaces ``sys.stdout`` / ``sys.stderr``: each complete line becomes a LOG frame."""

    def __init__(self, channel: Channel, source: str, level: str) -> None:
        self.channel = channel
        self.source = source
        self.level = level
        self._partial = ""
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._lock:
            data = self._partial + text
            lines = data.split("\n")
            self._partial = lines.pop()
        for line in lines:
            self.channel.log(self.level, line, self.source)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            rest, self._partial = self._partial, ""
        if rest:
            self.channel.log(self.level, rest, self.source)
