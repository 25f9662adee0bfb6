"""Budgets of declared dependencies (job.yaml ``dependencies.<name>.rpm`` and ``.concurrency``).

One :class:`DependencyBudget` per dependency (``host:port``) per backend, so every instance and every
plugin deployed on it (a job's) share it. It is enforced in the supervisor's ``PolicyBridge``, the
one place every connection a ``network: policy-only`` instance makes to a declared dependency goes
through: a connection waits there (its plugin sees a slow connect/reply, bounded by its client's own
timeout) until the budget lets it open upstream.

What is counted is **connections**, not requests:

- ``concurrency`` bounds the connections open to the dependency at once. HTTP/1.1 carries one
  request at a time on a connection, so it bounds the requests in flight too; but a kept-alive
  idle connection (a client's pool) keeps its slot until the client closes it (httpx and openai
  after 5 s idle), and HTTP/2 can carry several requests on one connection.
- ``rpm`` bounds the connections opened in any 60 s window (a burst of up to ``rpm`` at once,
  then one as each ages out, ``MARGIN_S`` after its 60 s: the service starts its clock when the
  request arrives, a little after the bridge let the connection open, and a slot freed on the
  bridge's clock alone was answered 429 by a judge holding the same limit). The later requests
  a kept-alive connection carries are not counted.

Clients that open a connection per request (``httpx.post``, ``requests.post``, ``urllib``, a fresh
``httpx.Client`` or ``openai.OpenAI`` per call) are bounded exactly. Under ``network: any`` nothing
goes through the bridge and the budgets do not apply.

With a declared ``concurrency``, a call that failed as ``rate limited`` (429) on the dependency
halves the concurrency in use (at least 1; multiplicative decrease); each call that succeeds
afterwards adds ``1/limit`` back (additive increase: one more connection per round of successful
calls) up to the declared value. Without one nothing is lowered: an idle kept-alive connection of
a client the plugin never closed would hold the only slot left and starve the next calls.

An idle kept-alive connection would hold its slot until its client closes it (a plugin that makes
a new ``openai.OpenAI(...)`` per call and never closes it would wait for its own idle connections):
while connections wait, one whose reply ended ``IDLE_S`` ago with no request since is closed by the
bridge (clients open a new connection for their next request). A reply that pauses that long after
its first bytes (a slow stream) may be cut while others wait. Connections waiting for the budget
wait in the bridge, bounded by the client's own timeout.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from typing import Protocol

from plugtune.runtime.dependencies import Dependency

WINDOW_S = 60.0
MARGIN_S = 1.0  # a connection counts against rpm for WINDOW_S + MARGIN_S (see the module's doc)
IDLE_S = 1.0  # while connections wait: a held connection idle this long after its reply is closed
REAP_S = 0.25  # how often idle held connections are looked for while connections wait


class Holder(Protocol):
    """A connection holding a slot: how long it has been idle after a reply, and how to close it."""

    def idle_for(self, now: float) -> float: ...

    def close(self) -> None: ...


class DependencyBudget:
    """The shared budget of one dependency: ``acquire()`` before opening a connection to it,
    ``release()`` when that connection ends."""

    def __init__(
        self, name: str, concurrency: int | None, rpm: int | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.name = name
        self.ceiling = concurrency
        self.limit: float | None = None if concurrency is None else float(concurrency)  # in use (AIMD)
        self.rpm = rpm
        self.clock = clock
        self.open = 0
        self.peak = 0  # most connections open at once
        self.opened = 0
        self.decreases = 0  # 429s that lowered the limit
        self.starts: collections.deque[float] = collections.deque()
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.timer: asyncio.TimerHandle | None = None
        self.holders: set[Holder] = set()
        self.reaper: asyncio.TimerHandle | None = None
        self.reaped = 0  # idle connections closed for waiting ones

    @property
    def waiting(self) -> int:
        return sum(1 for w in self.waiters if not w.done())

    def tighten(self, concurrency: int | None, rpm: int | None) -> None:
        """Another plugin declared the same service: the smaller of each bound holds."""
        if concurrency is not None and (self.ceiling is None or concurrency < self.ceiling):
            self.ceiling = concurrency
            self.limit = float(concurrency) if self.limit is None else min(self.limit, concurrency)
        if rpm is not None and (self.rpm is None or rpm < self.rpm):
            self.rpm = rpm

    async def acquire(self) -> None:
        """Wait (first come, first served) for a connection slot within ``concurrency`` and ``rpm``."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        self._pump()
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # granted as the caller was cancelled: give the slot back
            else:
                waiter.cancel()
            raise

    def hold(self, holder: Holder) -> None:
        """``holder`` has the slot its ``acquire()`` granted (``release(holder)`` gives it back)."""
        self.holders.add(holder)
        if self.waiters and self.reaper is None:  # granted after _pump looked for holders to reap
            self.reaper = asyncio.get_running_loop().call_later(REAP_S, self._reap)

    def release(self, holder: Holder | None = None) -> None:
        self.holders.discard(holder)
        self.open = max(0, self.open - 1)
        self._pump()

    def rate_limited(self) -> None:
        """The dependency answered 429: halve the concurrency in use (multiplicative decrease; only
        under a declared concurrency)."""
        if self.limit is None:
            return
        self.limit = max(1.0, self.limit / 2)
        self.decreases += 1

    def succeeded(self) -> None:
        """A call succeeded: one more connection per round of successes (additive increase)."""
        if self.limit is None or self.ceiling is None or self.limit >= self.ceiling:
            return
        self.limit = min(float(self.ceiling), self.limit + 1.0 / max(self.limit, 1.0))
        self._pump()

    def _rate_delay(self, now: float) -> float:
        if self.rpm is None:
            return 0.0
        span = WINDOW_S + MARGIN_S
        while self.starts and self.starts[0] <= now - span:
            self.starts.popleft()
        if len(self.starts) < self.rpm:
            return 0.0
        return self.starts[0] + span - now

    def _pump(self) -> None:
        """Grant waiting connections while the budget allows (bounded by the waiters queued)."""
        for _ in range(len(self.waiters)):
            while self.waiters and self.waiters[0].done():  # cancelled while waiting
                self.waiters.popleft()
            if not self.waiters:
                return
            if self.limit is not None and self.open >= max(1, int(self.limit)):
                if self.reaper is None and self.holders:
                    self.reaper = asyncio.get_running_loop().call_later(REAP_S, self._reap)
                return
            now = self.clock()
            delay = self._rate_delay(now)
            if delay > 0:
                if self.timer is None:
                    self.timer = asyncio.get_running_loop().call_later(delay, self._tick)
                return
            self.waiters.popleft().set_result(None)
            self.open += 1
            self.opened += 1
            self.peak = max(self.peak, self.open)
            if self.rpm is not None:
                self.starts.append(now)

    def _tick(self) -> None:
        self.timer = None
        self._pump()

    def _reap(self) -> None:
        """Close held connections idle ``IDLE_S`` after their reply, for the connections waiting."""
        self.reaper = None
        now = time.monotonic()
        for holder in list(self.holders):
            if holder.idle_for(now) >= IDLE_S:
                self.holders.discard(holder)
                self.reaped += 1
                holder.close()  # its connection_lost releases the slot
        self._pump()


class Budgets:
    """Every dependency budget of one backend, by ``(host, port)``."""

    def __init__(self) -> None:
        self.by_target: dict[tuple[str, int], DependencyBudget] = {}

    def declare(self, dep: Dependency) -> DependencyBudget:
        """The budget of ``dep``, made on first use (one without bounds lets every connection through)."""
        key = (dep.host, dep.port)
        budget = self.by_target.get(key)
        if budget is None:
            budget = self.by_target[key] = DependencyBudget(dep.name, dep.concurrency, dep.rpm)
        else:
            budget.tighten(dep.concurrency, dep.rpm)
        return budget

    def get(self, target: tuple[str, int]) -> DependencyBudget | None:
        return self.by_target.get(target)

    def usage(self) -> dict[str, dict[str, float | int | None]]:
        """What each budget allowed and saw so far, by dependency name: its bounds (``rpm``,
        ``concurrency``), the connections it ``opened``, the most open at once (``peak``) and the
        429s that lowered it (``decreases``)."""
        return {
            b.name: {
                "rpm": b.rpm,
                "concurrency": b.ceiling,
                "opened": b.opened,
                "peak": b.peak,
                "decreases": b.decreases,
            }
            for b in self.by_target.values()
        }
