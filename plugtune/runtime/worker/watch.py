"""What an instance measures about itself: outbound network bytes and a blocked event loop."""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from plugtune.runtime.worker.channel import CURRENT_CALL, Channel

INET = (socket.AF_INET, socket.AF_INET6)
_outbound = [0]


def outbound_bytes() -> int:
    return _outbound[0]


def install_net_counter() -> None:
    """Count bytes sent on IPv4/IPv6 sockets at the Python socket layer (C clients are missed)."""
    cls: Any = socket.socket
    if getattr(cls, "_plugtune_counted", False):
        return

    def counted(name: str, result_is_count: bool) -> Callable[..., Any]:
        original = getattr(cls, name)

        def wrapper(self: socket.socket, data: Any, *args: Any) -> Any:
            result = original(self, data, *args)
            if self.family in INET:
                _outbound[0] += result if result_is_count else _size(data)
            return result

        wrapper.__name__ = name
        return wrapper

    for name, is_count in (("send", True), ("sendall", False), ("sendto", True)):
        setattr(cls, name, counted(name, is_count))

    original_sendmsg = cls.sendmsg

    def sendmsg(self: socket.socket, buffers: Any, *args: Any) -> int:
        result: int = original_sendmsg(self, buffers, *args)
        if self.family in INET:
            _outbound[0] += result
        return result

    cls.sendmsg = sendmsg
    cls._plugtune_counted = True


def count_outbound(data: Any) -> None:
    """Count bytes sent by a writer the socket methods do not see (see :mod:`.loops`)."""
    _outbound[0] += _size(data)


def _size(data: Any) -> int:
    try:
        return memoryview(data).nbytes
    except TypeError:
        return len(data)


class LoopWatchdog:
    """Warns when an ``async def`` plugin blocks the instance's event loop for too long.

    The loop bumps a heartbeat every ``tick`` seconds; a thread checks it and, when it is older than
    ``threshold``, sends a WARNING naming the function and the stack where the loop is stuck.
    """

    def __init__(
        self,
        channel: Channel,
        function: str,
        code_root: str,
        current_call: Callable[[asyncio.Task[Any] | None], tuple[str, str]],
        threshold: float = 0.1,
        tick: float = 0.02,
    ) -> None:
        self.channel = channel
        self.function = function
        self.code_root = code_root
        self.current_call = current_call
        self.threshold = threshold
        self.tick = tick
        self._beat = time.monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread_id = 0

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread_id = threading.get_ident()
        loop.call_soon(self._heartbeat)
        threading.Thread(target=self._watch, name="plugtune-loop-watchdog", daemon=True).start()

    def _heartbeat(self) -> None:
        self._beat = time.monotonic()
        assert self._loop is not None
        self._loop.call_later(self.tick, self._heartbeat)

    def _watch(self) -> None:
        reported_at = 0.0
        while True:
            time.sleep(self.tick)
            beat = self._beat
            lag = time.monotonic() - beat
            if lag > self.threshold and reported_at != beat:
                reported_at = beat
                self._report(lag)
            elif reported_at and reported_at != beat and lag < self.threshold:
                reported_at = 0.0

    def _report(self, lag: float) -> None:
        frame = sys._current_frames().get(self._thread_id)
        stack = format_user_stack(traceback.extract_stack(frame), self.code_root) if frame else ""
        task = asyncio.current_task(self._loop) if self._loop else None
        call = self.current_call(task)
        token = CURRENT_CALL.set(call)
        try:
            self.channel.log(
                "WARNING",
                f"async plugin {self.function} blocked its event loop for more than "
                f"{int(self.threshold * 1000)} ms (a blocking call inside `async def`; use await or "
                f"asyncio.to_thread). Blocked at:\n{stack}",
                "runtime",
            )
        finally:
            CURRENT_CALL.reset(token)


def format_user_stack(stack: traceback.StackSummary, code_root: str) -> str:
    """The frames of the user's code (innermost first), paths relative to the code root."""
    frames = [f for f in stack if f.filename.startswith(code_root)] or list(stack[-3:])
    lines = []
    for f in reversed(frames):
        name = f.filename[len(code_root) :].lstrip("/") if f.filename.startswith(code_root) else f.filename
        lines.append(f'  File "{name}", line {f.lineno}, in {f.name}\n    {f.line or ""}'.rstrip())
    return "\n".join(lines)
