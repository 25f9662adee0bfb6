"""``run_forked``: a piece of work in a forked child of this process, which a timeout can always end.

In-process runs (``plugtune test``, ``plugtune replay --in-process``) use it for sync plugin calls.
A call stuck in C code that holds the GIL (a huge ``pow``, catastrophic ``re`` backtracking, a CAS
simplifying ``9^(9^9)``) stops every thread of its process, the event loop that would time it out
included; in a child it stops only the child, and cancelling the await (``asyncio.wait_for``)
kills it. The child is a fork: it holds the plugin as ``setup()`` left it and the caller's
stdin/stdout/stderr (``breakpoint()`` works), runs on its own main thread, and whatever it changes
(module state, ``os.environ``) ends with it.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import struct
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any, NoReturn

_exit = os._exit  # the real one: a test may swap ``os._exit`` for a plugin's sake while this runs
HEADER = struct.Struct(">I")
READ_SIZE = 1 << 16
MESSAGE, DONE, ERROR = "message", "done", "error"


class ChildDied(Exception):  # what happened to the child
    """The child ended before it sent its result; ``how`` says how (its exit status or signal)."""

    def __init__(self, how: str) -> None:
        super().__init__(f"the call's process {how}")
        self.how = how


class ChildError(Exception):
    """``work`` raised in the child, or its result could not be sent back; the message says what."""


Send = Callable[[Any], None]


async def run_forked(work: Callable[[Send], Any], on_message: Callable[[Any], None] | None = None) -> Any:
    """``work(send)`` in a forked child; returns what it returned (pickled back).

    ``send(item)`` hands ``item`` to ``on_message`` here while the child runs (log lines, so that a
    call that is killed keeps what it logged). Cancelling the await kills the child at once.
    Raises :class:`ChildDied` when the child ends without a result (``os._exit``, a signal),
    :class:`ChildError` when ``work`` raised."""
    loop = asyncio.get_running_loop()
    read_fd, write_fd = os.pipe()
    _flush_std()  # or the child would write this process's buffered output a second time
    try:
        with warnings.catch_warnings():  # 3.12+: "multi-threaded, use of fork() may lead to deadlocks"
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except BaseException:
        os.close(read_fd)
        os.close(write_fd)
        raise
    if pid == 0:
        _child(read_fd, write_fd, work)
    os.close(write_fd)
    frames = _Frames(on_message)
    reaped = False
    os.set_blocking(read_fd, False)
    loop.add_reader(read_fd, frames.read, read_fd)
    try:
        status = await _exit_status(loop, pid)
        reaped = True
        frames.read(read_fd, drain=True)
    finally:
        loop.remove_reader(read_fd)
        os.close(read_fd)
        if not reaped:
            _kill(pid)
    return frames.outcome(status)


class _Frames:
    """Length-prefixed pickles from the child: messages, then its result."""

    def __init__(self, on_message: Callable[[Any], None] | None) -> None:
        self.buffer = bytearray()
        self.on_message = on_message
        self.result: tuple[str, Any] | None = None

    def read(self, fd: int, drain: bool = False) -> None:
        for _ in range(1_000_000 if drain else 1):  # drain: what is left once the child is gone
            try:
                data = os.read(fd, READ_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            if not data:
                return
            self.buffer += data
            self._parse()

    def _parse(self) -> None:
        while len(self.buffer) >= HEADER.size:
            (size,) = HEADER.unpack_from(self.buffer)
            if len(self.buffer) < HEADER.size + size:
                return
            kind, payload = pickle.loads(bytes(self.buffer[HEADER.size : HEADER.size + size]))
            del self.buffer[: HEADER.size + size]
            if kind == MESSAGE:
                if self.on_message is not None:
                    self.on_message(payload)
            else:
                self.result = (kind, payload)

    def outcome(self, status: int) -> Any:
        if self.result is None:
            raise ChildDied(describe_exit(status))
        kind, payload = self.result
        if kind == ERROR:
            raise ChildError(payload)
        return payload


def describe_exit(status: int) -> str:
    """``exited with status 3`` / ``was killed by SIGKILL`` from a ``waitpid`` status."""
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return f"exited with status {code} before it returned"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"was killed by {name} before it returned"


async def _exit_status(loop: asyncio.AbstractEventLoop, pid: int) -> int:
    """Wait (without blocking the loop) until ``pid`` ends; reap it and return its wait status."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:  # no pidfd (not Linux): look every 20 ms
        for _ in range(10**9):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status
            await asyncio.sleep(0.02)
        raise RuntimeError(f"process {pid} did not end")
    fd = pidfd_open(pid)
    ended: asyncio.Future[None] = loop.create_future()

    def on_end() -> None:
        if not ended.done():
            ended.set_result(None)

    loop.add_reader(fd, on_end)
    try:
        await ended
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    return os.waitpid(pid, 0)[1]


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)  # SIGKILL cannot be caught: the child is gone at once


def _child(read_fd: int, write_fd: int, work: Callable[[Send], Any]) -> NoReturn:
    """The child's whole life: it never returns into the caller's stack (its event loop)."""
    code = 70
    try:
        os.close(read_fd)
        _detach_from_caller()
        sender = _Sender(write_fd)
        try:
            value = work(sender.message)
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            sender.frame(ERROR, f"{type(exc).__name__}: {exc}")
        else:
            try:
                sender.frame(DONE, value)
            except Exception as exc:  # noqa: BLE001 - e.g. a result that cannot be pickled
                sender.frame(ERROR, f"the result could not be sent back: {type(exc).__name__}: {exc}")
        code = 0
    finally:
        _flush_std()
        _exit(code)


def _detach_from_caller() -> None:
    """The caller's event loop, signal wake-up fd and Ctrl-C handler are not the child's."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    asyncio.set_event_loop_policy(None)  # a fresh loop if the work asks for one, never the caller's


class _Sender:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.lock = threading.Lock()  # a plugin's own threads may log at once

    def message(self, item: Any) -> None:
        self.frame(MESSAGE, item)

    def frame(self, kind: str, payload: Any) -> None:
        data = pickle.dumps((kind, payload), protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(HEADER.pack(len(data)) + data)
        with self.lock:
            while view:
                view = view[os.write(self.fd, view) :]


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S110 - a closed or odd stream: nothing to flush
            pass
