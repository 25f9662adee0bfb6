"""Serving a sync plugin with ``max_concurrency: 1``: every call runs on the instance's main thread.

Python installs signal handlers only on the main thread, so libraries that time themselves out
with ``signal.signal`` + ``signal.alarm`` / ``signal.setitimer`` (math-verify's default timeouts,
for one) work here, in every call.

The main thread also reads the instance's socket while no call runs, so a lone call starts with
no thread woken. While a call runs, a *deputy* thread looks every ``TICK_S``; once the call has
run that long it takes the reading role: it answers STATS, cancels queued calls and queues new
ones, which the main thread runs one after another. When the main thread has nothing left to
run it asks for the role back (through a pipe that wakes the deputy's ``poll``). An instance with
no call for ``IDLE_S`` does not tick.
"""

from __future__ import annotations

import os
import select
import threading
import time
from typing import Any

from plugtune.runtime.protocol import CALL, CANCEL, CANCELLED, ERR, STATS, STOP, Call, Cancel, FrameReader
from plugtune.runtime.worker.calls import CallRunner
from plugtune.runtime.worker.channel import Channel
from plugtune.runtime.worker.threads import IDLE_S, RECV_SIZE, TICK_S
from plugtune.runtime.worker.watch import outbound_bytes


class MainThreadServer:
    def __init__(self, runner: CallRunner, channel: Channel) -> None:
        self.runner = runner
        self.channel = channel
        self.reader = FrameReader()
        self.lock = threading.Lock()
        self.handed = threading.Condition(self.lock)  # the main thread waits here for calls or the role
        self.tick = threading.Condition(self.lock)  # the deputy waits here for a long call
        self.queued: dict[str, Call] = {}  # calls not started yet, in arrival order
        self.deputy_reading = False
        self.handback_asked = False
        self.running_since = 0.0  # when the main thread's call started (0: none runs)
        self.last_call = 0.0
        self.deputy_idle = False
        self.wake_r, self.wake_w = os.pipe()

    def serve(self) -> None:
        """Serve on the calling (main) thread; never returns."""
        self.channel.sock.setblocking(True)
        threading.Thread(target=self._deputy, name="plugtune-reader", daemon=True).start()
        while True:
            call = self._next_call()
            if call is None:
                self._read()
            else:
                self._run(call)

    # ---- the main thread --------------------------------------------------------------------

    def _next_call(self) -> Call | None:
        """The next queued call; None when there is none and the main thread holds the reading role."""
        with self.lock:
            while True:
                if self.queued:
                    return self.queued.pop(next(iter(self.queued)))
                if not self.deputy_reading:
                    return None
                if not self.handback_asked:
                    self.handback_asked = True
                    os.write(self.wake_w, b"x")
                self.handed.wait()

    def _read(self) -> None:
        try:
            data = self.channel.sock.recv(RECV_SIZE)
        except OSError:
            data = b""
        if not data:
            os._exit(0)  # the supervisor is gone
        self._dispatch(self.reader.feed(data))

    def _run(self, call: Call) -> None:
        with self.lock:
            self.running_since = self.last_call = time.monotonic()
            if self.deputy_idle:
                self.tick.notify()
        try:
            self.runner.run_sync(*call)
        finally:
            with self.lock:
                self.running_since = 0.0

    # ---- whoever holds the reading role -----------------------------------------------------

    def _dispatch(self, messages: list[Any]) -> None:
        for message in messages:
            op = message[0]
            if op == CALL:
                call = Call(*message[1:])
                with self.lock:
                    self.queued[call.call_id] = call
                    self.handed.notify()
            elif op == CANCEL:
                call_id = Cancel(*message[1:]).call_id
                with self.lock:
                    cancelled = self.queued.pop(call_id, None)
                if cancelled is not None:
                    self.channel.send([ERR, call_id, CANCELLED, "cancelled before it started", "", {}])
            elif op == STATS:
                self.channel.send([STATS, outbound_bytes()])
            elif op == STOP:
                os._exit(0)

    # ---- the deputy -------------------------------------------------------------------------

    def _deputy(self) -> None:
        poller = select.poll()
        poller.register(self.channel.sock.fileno(), select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        while True:
            self._wait_for_a_long_call()
            self._read_until_handed_back(poller)

    def _wait_for_a_long_call(self) -> None:
        """Tick until the main thread's call has run for ``TICK_S``; then the reading role is ours."""
        with self.lock:
            while True:
                now = time.monotonic()
                since = self.running_since
                if since and now - since >= TICK_S:
                    self.deputy_reading = True
                    return
                self.deputy_idle = not since and now - self.last_call > IDLE_S
                if self.deputy_idle:
                    self.tick.wait()
                    self.deputy_idle = False
                else:
                    self.tick.wait(max(TICK_S - (now - since) if since else TICK_S, 1e-4))

    def _read_until_handed_back(self, poller: select.poll) -> None:
        while True:
            for fd, _ in poller.poll():
                if fd == self.wake_r:
                    os.read(self.wake_r, 64)
                    with self.lock:
                        self.deputy_reading = self.handback_asked = False
                        self.handed.notify()
                    return
                self._read()
