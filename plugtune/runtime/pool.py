"""One function's instances on any backend: routing, waiters, scaling, the warm spare, deadlines and
housekeeping.

Calls go to the usable instance with the fewest calls in flight, below ``max_concurrency``; when all
are busy a call waits and the pool grows (the warm spare first) up to ``max_instances``. Idle
instances above ``min_instances`` are retired. The backend's part (:class:`Maker`) is what differs
between local processes and Ray actors: create one instance, start it, limit it, end it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
from collections.abc import Callable, Coroutine
from typing import Any, Generic, Protocol, TypeVar

from plugtune.runtime.backend import DeployFailed, Failed, Happened
from plugtune.runtime.fate import Fate
from plugtune.sdk import Runtime
from plugtune.types import LogLine

log = logging.getLogger(__name__)

DEADLINE_SLOT_S = 0.005  # calls' deadlines are kept in slots this long (one timer per slot)
MAX_LOG_LINES = 20_000


class Member(Protocol):
    """One instance as the pool routes to it."""

    id: str
    fate: Fate
    last_used: float

    @property
    def in_flight(self) -> int: ...

    @property
    def started(self) -> bool:
        """Its start-up is over (it is ready, or it failed)."""

    def is_usable(self) -> bool:
        """It is ready and nothing makes it suspect (beyond its fate and its calls in flight)."""


M = TypeVar("M", bound=Member)


class Maker(Protocol[M]):
    """A backend's part of a pool: create, start, limit and end instances."""

    def make(self) -> M:
        """A new instance, its quota reserved (not started); raises DeployFailed."""

    async def launch(self, instance: M) -> None:
        """Start ``instance`` and wait until it is ready; raises DeployFailed (cleaned up)."""

    def end(self, instance: M, reason: str) -> None:
        """End ``instance`` now."""

    def retire(self, instance: M, reason: str) -> None:
        """Route nothing more to ``instance``; end it once its calls are answered."""

    def discard(self, instance: M, reason: str) -> None:
        """End ``instance`` (a spare) and give its quota back now."""

    async def watch(self, instances: list[M]) -> bool:
        """A housekeeping round's checks (limits, health); False ends housekeeping."""

    def tidy(self) -> None:
        """After each idle check: what is left to clean up."""


class InstancePool(Generic[M]):
    def __init__(
        self,
        maker: Maker[M],
        plugin: str,
        runtime: Runtime,
        *,
        idle_timeout_s: float,
        period_s: float,
        idle_check_s: float,
        spares: bool,
    ) -> None:
        self.maker = maker
        self.plugin = plugin
        self.runtime = runtime
        self.idle_timeout_s = idle_timeout_s
        self.period_s = period_s
        self.idle_check_s = idle_check_s
        self.spares = spares
        self.instances: list[M] = []
        self.creating: set[M] = set()
        self.starting = 0
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.log_lines: collections.deque[LogLine] = collections.deque(maxlen=MAX_LOG_LINES)
        self.closed = False
        self.last_create_error: DeployFailed | None = None
        self.spare: M | None = None  # ready, idle, not routed to: handed out on the next scale-up
        self._refilling = False
        self.background: set[asyncio.Task[Any]] = set()
        self._housekeeper: asyncio.Task[None] | None = None
        self.last_scale_up = time.monotonic()

    # ---- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        first = max(1, self.runtime.min_instances)
        results = await asyncio.gather(*(self.add_instance() for _ in range(first)), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        self._housekeeper = asyncio.get_running_loop().create_task(self._housekeeping())
        self.refill_spare()

    def close(self) -> list[M]:
        """Stop routing, scaling and housekeeping; returns every instance left to end (the spare and
        those still starting among them)."""
        self.closed = True
        if self._housekeeper is not None:
            self._housekeeper.cancel()
        spare = self.spare
        self.drop_spare("the function was closed")
        if spare is not None:
            self.instances.append(spare)  # so its end is awaited by the backend
        self.instances.extend(i for i in self.creating if i not in self.instances)
        self.wake_all()
        return list(self.instances)

    def runtime_log(self, level: str, text: str, instance_id: str = "") -> None:
        self.log_lines.append(
            LogLine(time.time(), level, self.plugin, text, "runtime", instance_id=instance_id)
        )
        # The function's own log keeps the level; the process log stays quiet unless it is an error.
        log.log(logging.ERROR if level == "ERROR" else logging.DEBUG, "%s: %s", self.plugin, text)

    # ---- instances --------------------------------------------------------------------------

    async def add_instance(self, counted: bool = False) -> M:
        """Create one instance and wait until it is ready; raises DeployFailed."""
        if not counted:
            self.starting += 1
        try:
            return await self._create()
        finally:
            self.starting -= 1
            self.wake_all()  # every waiting call looks again: pick the new instance or grow further

    async def _create(self, serving: bool = True) -> M:
        instance = self.maker.make()
        if serving:
            self.instances.append(instance)
        self.creating.add(instance)
        try:
            await self.maker.launch(instance)
        finally:
            self.creating.discard(instance)
        return instance

    def forget(self, instance: M) -> None:
        """``instance`` has ended: it is no longer routed to nor counted."""
        if instance in self.instances:
            self.instances.remove(instance)
        if instance is self.spare:
            self.spare = None

    def ended(self, instance: M) -> None:
        """``instance`` has ended by itself or was killed: forget it, let a waiter look again, and keep
        a spare while the function grew lately."""
        self.forget(instance)
        self.wake()
        if time.monotonic() - self.last_scale_up < self.idle_timeout_s:
            self.refill_spare()

    # ---- the spare instance -----------------------------------------------------------------

    def refill_spare(self) -> None:
        """Keep one instance ready to hand out while the function can still grow: a new instance is
        then serving at once instead of after its start-up."""
        if not self.spares or self.closed or self.spare is not None or self._refilling:
            return
        if len(self.instances) >= self.runtime.max_instances:
            return
        self._refilling = True

        async def refill() -> None:
            try:
                spare = await self._create(serving=False)
            except DeployFailed as exc:
                log.debug("%s: no spare instance: %s", self.plugin, exc.message)
                return
            finally:
                self._refilling = False
            if self.closed or self.spare is not None:
                self.maker.end(spare, "not needed")
            else:
                self.spare = spare

        self.spawn(refill())

    def _take_spare(self) -> bool:
        spare, self.spare = self.spare, None
        if spare is None or spare.fate.draining:
            return False
        spare.last_used = time.monotonic()
        self.instances.append(spare)
        self.runtime_log("INFO", f"instance {spare.id} added (the spare, already warm)", spare.id)
        self.wake_all()
        self.refill_spare()
        return True

    def drop_spare(self, reason: str) -> None:
        """Give up the spare, the warm one or one still starting, and its quota slot, now."""
        spare, self.spare = self.spare, None
        starting = [i for i in self.creating if i not in self.instances]  # a spare being made
        for instance in ([spare] if spare is not None else []) + starting:
            self.maker.discard(instance, reason)

    # ---- routing ----------------------------------------------------------------------------

    def pick(self, prefer: str = "") -> M | None:
        """The usable instance with the fewest calls in flight; ``prefer`` (an instance id) wins when
        it is usable (a call retried after its dependency failed stays where it ran)."""
        best: M | None = None
        limit = self.runtime.max_concurrency
        for instance in self.instances:
            if instance.fate.draining or not instance.is_usable():
                continue
            n = instance.in_flight
            if n < limit and prefer and instance.id == prefer:
                return instance
            if n < limit and (best is None or n < best.in_flight):
                best = instance
        return best

    async def acquire(self, deadline: float) -> M | Failed:
        """An instance with a free slot, growing the pool if it may; a Failed fact when none comes
        by ``deadline`` (or none can be created, or the function is closed)."""
        loop = asyncio.get_running_loop()
        while not self.closed:
            instance = self.pick()
            if instance is not None:
                return instance
            live = len([i for i in self.instances if not i.fate.ended and i.started]) + self.starting
            waiting = len(self.waiters) + 1
            if live < self.runtime.max_instances and self.starting * self.runtime.max_concurrency < waiting:
                self._scale_up()
                instance = self.pick()  # the spare may have been handed out at once
                if instance is not None:
                    return instance
            waiter = loop.create_future()
            self.waiters.append(waiter)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                await asyncio.wait_for(waiter, remaining)
            except asyncio.TimeoutError:
                break
            if not self.instances and self.starting == 0 and self.last_create_error is not None:
                error = self.last_create_error
                return Failed(Happened.NOT_CREATED, error.message, error.logs, error.traceback)
        if self.closed:
            return Failed(Happened.DIED, "the function was closed")
        return Failed(Happened.DEADLINE, f"no instance was free within timeout_s={self.runtime.timeout_s:g}")

    def wake(self) -> None:
        """Let the first waiting call look for an instance again."""
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def wake_all(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    # ---- scaling ----------------------------------------------------------------------------

    def _scale_up(self) -> None:
        self.last_scale_up = time.monotonic()
        if self._take_spare():
            return
        self.starting += 1  # counted now, so other waiters in this loop turn see it
        self.last_create_error = None

        async def grow() -> None:
            try:
                await self.add_instance(counted=True)
                self.refill_spare()
            except DeployFailed as exc:
                if not exc.intentional:
                    self.last_create_error = exc
                    self.runtime_log("ERROR", f"could not add an instance: {exc.message}")
                self.wake_all()

        self.spawn(grow())

    async def scale(self, instances: int) -> None:
        """Set the number of live instances (between min and max instances)."""
        target = max(self.runtime.min_instances, min(instances, self.runtime.max_instances))
        live = [i for i in self.instances if not i.fate.draining]
        if len(live) < target:
            await asyncio.gather(*(self.add_instance() for _ in range(target - len(live))))
        for instance in sorted(live, key=lambda i: i.in_flight)[: max(0, len(live) - target)]:
            self.maker.retire(instance, "scaled down")

    async def _housekeeping(self) -> None:
        last_idle_check = time.monotonic()
        while not self.closed:
            await asyncio.sleep(self.period_s)
            if not await self.maker.watch(self.instances):
                return
            now = time.monotonic()
            if now - last_idle_check >= self.idle_check_s:
                last_idle_check = now
                self._scale_down_idle(now)
                self._keep_minimum()
                self.maker.tidy()

    def _scale_down_idle(self, now: float) -> None:
        if self.spare is not None and now - self.last_scale_up > self.idle_timeout_s:
            self.drop_spare(f"no scale-up for {self.idle_timeout_s:g} s")
        live = [i for i in self.instances if not i.fate.draining and i.started]
        extra = len(live) - self.runtime.min_instances
        for instance in live:
            if extra <= 0:
                break
            if instance.in_flight == 0 and now - instance.last_used > self.idle_timeout_s:
                self.maker.retire(instance, f"idle for more than {self.idle_timeout_s:g} s")
                extra -= 1

    def _keep_minimum(self) -> None:
        live = len([i for i in self.instances if not i.fate.draining]) + self.starting
        if live < self.runtime.min_instances and self.last_create_error is None:
            self._scale_up()


Entry = TypeVar("Entry")


class Deadlines(Generic[Entry]):
    """Calls' deadlines, kept in slots of DEADLINE_SLOT_S (one timer per slot): watching a call costs
    two dict operations. ``on_expiry`` gets each entry whose deadline passed."""

    def __init__(self, on_expiry: Callable[[Entry], None]) -> None:
        self.on_expiry = on_expiry
        self._slots: dict[int, dict[str, Entry]] = {}

    def watch(self, remaining_s: float, call_id: str, entry: Entry) -> dict[str, Entry]:
        """Expire ``entry`` when ``remaining_s`` has passed (up to DEADLINE_SLOT_S late); returns its
        slot, from which the caller pops ``call_id`` once the call is answered."""
        loop = asyncio.get_running_loop()
        slot = math.ceil((loop.time() + max(0.0, remaining_s)) / DEADLINE_SLOT_S)
        calls = self._slots.get(slot)
        if calls is None:
            calls = self._slots[slot] = {}
            loop.call_at(slot * DEADLINE_SLOT_S, self._expire_slot, slot)
        calls[call_id] = entry
        return calls

    def _expire_slot(self, slot: int) -> None:
        for entry in self._slots.pop(slot, {}).values():
            self.on_expiry(entry)
