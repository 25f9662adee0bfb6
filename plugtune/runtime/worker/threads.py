"""Serving a sync plugin with ``max_concurrency > 1``: a reader thread, a pool of call threads,
and a call run inline when alone. Every call runs on one of these threads, never on the
instance's main thread (which only waits), so Python cannot install signal handlers in a call:
``signal.signal`` raises ``ValueError: signal only works in main thread`` (the 500 it becomes says
to use ``max_concurrency: 1``, :mod:`.mainthread`).

One thread at a time holds the *reading role* and reads the instance's socket:

* calls that arrive while nothing runs or is queued (one, or a batch read at once: a trainer's
  step grading its completions) are run by the reader itself, one after another: no thread is
  woken, which is most of the cost of a short call. Meanwhile a *ticker* thread looks every
  ``TICK_S``; once the reader has run calls for that long, it takes the reading role over and
  hands the batch's calls not started yet to the pool (the reader becomes the ticker when its
  call ends), so a call waits at most about ``TICK_S`` before it starts or is handed on. An
  instance with no call for ``IDLE_S`` does not tick;
* other calls go to a queue served by up to ``max_concurrency`` threads, started on demand.

At most ``max_concurrency`` calls run at once, the inline one included.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections import deque
from typing import Any

from plugtune.runtime.protocol import CALL, CANCEL, STATS, STOP, Call, Cancel, FrameReader
from plugtune.runtime.worker.calls import CallRunner
from plugtune.runtime.worker.channel import Channel
from plugtune.runtime.worker.watch import outbound_bytes

RECV_SIZE = 1 << 18
TICK_S = 0.002  # how long an inline call runs before the ticker takes the reading role over
IDLE_S = 1.0  # no call for this long: the ticker waits without a timeout until the next one


class SyncServer:
    def __init__(self, runner: CallRunner, channel: Channel, concurrency: int) -> None:
        self.runner = runner
        self.channel = channel
        self.reader = FrameReader()
        self.calls: queue.SimpleQueue[Call] = queue.SimpleQueue()
        self.queued: set[str] = set()  # calls not started yet: the only ones a cancel can stop
        self.concurrency = concurrency
        self.lock = threading.Lock()
        self.running = 0  # calls running, the inline one included
        self.threads = 0  # call threads started
        self.idle = 0  # call threads waiting for a call, not yet promised one
        self.slot = threading.Condition(self.lock)  # a call thread waits here while an inline call
        self.slot_waiting = 0  # ... takes the last slot
        self.inline = 0  # ident of the reader while it runs calls itself (0: none)
        self.inline_since = 0.0  # when it started the first of them
        self.inline_rest: deque[Call] = deque()  # the batch's calls it has not started yet (queued)
        self.last_call = 0.0
        self.tick = threading.Condition(self.lock)
        self.ticker_started = False
        self.ticker_idle = False

    def serve(self) -> None:
        """Serve on the calling thread (and the threads it starts); never returns."""
        self.channel.sock.setblocking(True)
        self._roles(reading=True)

    def _roles(self, reading: bool) -> None:
        """The reader and the ticker swap roles when the ticker takes the reading role over."""
        while True:
            if reading:
                self._read_until_taken_over()
            else:
                self._wait_to_take_over()
            reading = not reading

    # ---- the reading role -------------------------------------------------------------------

    def _read_until_taken_over(self) -> None:
        me = threading.get_ident()
        while True:
            try:
                data = self.channel.sock.recv(RECV_SIZE)
            except OSError:
                data = b""
            if not data:
                os._exit(0)  # the supervisor is gone
            alone = self._dispatch(self.reader.feed(data), me)
            if alone is not None and not self._run_inline(alone, me):
                return

    def _dispatch(self, messages: list[Any], me: int) -> Call | None:
        """Handle what was read; returns the call to run inline, if one arrived alone."""
        calls: list[Call] = []
        for message in messages:
            op = message[0]
            if op == CALL:
                calls.append(Call(*message[1:]))
            elif op == CANCEL:
                self._cancel(Cancel(*message[1:]).call_id)
            elif op == STATS:
                self.channel.send([STATS, outbound_bytes()])
            elif op == STOP:
                os._exit(0)
        if not calls:
            return None
        with self.lock:
            now = time.monotonic()
            self.last_call = now
            if self.running == 0 and not self.queued:
                self.running = 1  # one slot: the reader runs the batch one call at a time
                self.inline, self.inline_since = me, now
                self.inline_rest.extend(calls[1:])
                self.queued.update(call[0] for call in calls[1:])  # cancellable until started
                if self.ticker_idle:
                    self.tick.notify()
                start_ticker, self.ticker_started = not self.ticker_started, True
                inline: Call | None = calls[0]
                starts = 0
            else:
                for call in calls:
                    self.queued.add(call[0])
                    self.calls.put(call)
                starts = self._promise_threads(len(calls))
                inline, start_ticker = None, False
        self._start_threads(starts)
        if start_ticker:
            threading.Thread(target=self._roles, args=(False,), name="plugtune-reader", daemon=True).start()
        return inline

    def _run_inline(self, call: Call | None, me: int) -> bool:
        """Run calls on the reading thread, the batch's next one after each; False when the ticker
        took the role over meanwhile (it handed the rest of the batch to the pool)."""
        kept = True
        while call is not None:
            ran, starts = False, 0
            try:
                self.runner.run_sync(*call)  # it reports every failure itself
                ran = True
            finally:
                with self.lock:
                    kept = self.inline == me
                    call = self._next_inline() if kept and ran else None
                    if call is None:
                        self._release_slot()
                        self.inline = 0
                        if kept and not ran:  # never leave the batch's other calls unanswered
                            starts = self._hand_rest_to_pool()
                self._start_threads(starts)
        return kept

    def _next_inline(self) -> Call | None:
        """(Under the lock.) The batch's next call not cancelled meanwhile."""
        while self.inline_rest:
            call = self.inline_rest.popleft()
            if call[0] in self.queued:
                self.queued.remove(call[0])
                return call
        return None

    def _wait_to_take_over(self) -> None:
        """Tick until the reader has run inline calls for ``TICK_S``; then the role is ours, and
        the calls of its batch not started yet go to the pool."""
        with self.lock:
            while True:
                now = time.monotonic()
                if self.inline and now - self.inline_since >= TICK_S:
                    self.inline = 0  # the inline call's thread becomes the ticker when it ends
                    starts = self._hand_rest_to_pool()
                    break
                self.ticker_idle = not self.inline and now - self.last_call > IDLE_S
                if self.ticker_idle:
                    self.tick.wait()
                    self.ticker_idle = False
                else:
                    left = TICK_S - (now - self.inline_since) if self.inline else TICK_S
                    self.tick.wait(max(left, 1e-4))
        self._start_threads(starts)

    def _hand_rest_to_pool(self) -> int:
        """(Under the lock.) Queue the inline batch's calls not started yet for the call threads;
        returns how many threads to start."""
        rest, self.inline_rest = list(self.inline_rest), deque()
        for call in rest:
            self.calls.put(call)  # still in queued: a thread takes it (or skips it if cancelled)
        return self._promise_threads(len(rest))

    # ---- call threads -----------------------------------------------------------------------

    def _start_threads(self, n: int) -> None:
        for _ in range(n):
            threading.Thread(target=self._work, name="plugtune-call", daemon=True).start()

    def _promise_threads(self, n: int) -> int:
        """(Under the lock.) Idle threads promised to ``n`` queued calls; returns how many to start."""
        promised = min(n, self.idle)
        self.idle -= promised
        start = max(0, min(n - promised, self.concurrency - self.threads))
        self.threads += start
        return start

    def _work(self) -> None:
        while True:
            call = self.calls.get()
            with self.lock:
                try:
                    self.queued.remove(call[0])
                except KeyError:
                    self.idle += 1
                    continue  # cancelled while queued
                while self.running >= self.concurrency:  # an inline call holds the last slot
                    self.slot_waiting += 1
                    self.slot.wait()
                    self.slot_waiting -= 1
                self.running += 1
            try:
                self.runner.run_sync(*call)
            finally:
                with self.lock:
                    self._release_slot()
                    self.idle += 1

    def _release_slot(self) -> None:
        self.running -= 1
        if self.slot_waiting:
            self.slot.notify()

    def _cancel(self, call_id: str) -> None:
        with self.lock:
            try:
                self.queued.remove(call_id)
            except KeyError:
                return  # already running: a thread cannot be stopped (the supervisor recycles)
        self.channel.send(["err", call_id, "cancelled", "cancelled before it started", "", {}])
