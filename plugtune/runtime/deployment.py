"""One function deployed on the local backend: its instances, routing, timeouts, scaling, spare.

Calls go to the ready instance with the fewest calls in flight, below ``max_concurrency``; when
all are busy a call waits and the pool grows (the warm spare first) up to ``max_instances``.
Idle instances above ``min_instances`` are stopped. A call past its deadline gets ``DEADLINE``;
its instance is asked to cancel it (async) or drained and recycled (a stuck sync thread).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import os
import socket
import time
from typing import TYPE_CHECKING, Any

from plugtune.runtime import protocol as p
from plugtune.runtime.backend import CallRequest, DeployFailed, DeployRequest, Failed, Happened, Returned
from plugtune.runtime.bridge import PolicyBridge
from plugtune.runtime.instance import RECYCLED, Instance
from plugtune.runtime.launcher import Launcher
from plugtune.runtime.limits import InstanceLimits, rlimits
from plugtune.runtime.monitor import ResourceMonitor
from plugtune.runtime.quota import QuotaExceeded
from plugtune.runtime.sandbox import User
from plugtune.runtime.zygote_client import Zygote
from plugtune.sdk import PluginSpec, Runtime
from plugtune.types import LogLine

if TYPE_CHECKING:
    from plugtune.runtime.local import LocalBackend

log = logging.getLogger(__name__)

ASYNC_CANCEL_GRACE_S = 1.0
DEADLINE_SLOT_S = 0.005  # calls' deadlines are kept in slots this long (one timer per slot)
ENDS_INSTANCE = ("eof", "oom")  # injected faults that end their instance (FaultInjection)
ALONE_POLL_S = 0.02
MAX_LOG_LINES = 20_000


class LocalDeployment:
    def __init__(
        self,
        backend: LocalBackend,
        request: DeployRequest,
        spec: PluginSpec,
        runtime: Runtime,
        zygote: Zygote | None,
        config: dict[str, Any],
    ) -> None:
        self.backend = backend
        self.request = request
        self.spec = spec
        self.runtime = runtime
        self.launcher = Launcher(zygote, self.runtime_log)
        self.monitor = ResourceMonitor(runtime)
        self.config = config
        self.user = User(*config["user"]) if config.get("user") else None
        self.plugin = request.entry
        self.instances: list[Instance] = []
        self.starting = 0
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.log_lines: collections.deque[LogLine] = collections.deque(maxlen=MAX_LOG_LINES)
        self.closed = False
        self.last_create_error: DeployFailed | None = None
        self.cold_starts_ms: list[float] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.spare: Instance | None = None  # ready, idle, not routed to: handed out on the next scale-up
        self._refilling = False
        self.creating: set[Instance] = set()
        self.background: set[asyncio.Task[None]] = set()
        self.last_scale_up = time.monotonic()
        self._deadlines: dict[int, dict[str, tuple[Instance, CallRequest, float]]] = {}
        self.bridge: PolicyBridge | None = None  # network policy-only: the instances' way to the policy

    # ---- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        self.runtime_log("INFO", f"deployed with limits: {self.backend.limits_mechanism}")
        first = max(1, self.runtime.min_instances)
        results = await asyncio.gather(*(self.add_instance() for _ in range(first)), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._housekeeping()))
        self._refill_spare()

    async def close(self) -> None:
        self.closed = True
        for task in self._tasks:
            task.cancel()
        spare = self.spare
        self.drop_spare("the function was closed")
        if spare is not None:
            self.instances.append(spare)  # so its end is awaited below
        self.instances.extend(i for i in self.creating if i not in self.instances)
        for instance in list(self.instances):
            instance.kill("the function was closed")
        for waiter in self.waiters:
            if not waiter.done():
                waiter.set_result(None)
        ending = list(self.instances)
        await asyncio.sleep(0)
        tasks = [i.end_task for i in ending if i.end_task is not None] + list(self.background)
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
        for instance in ending:
            await self._cleanup(instance)
        await self.launcher.close()
        self.backend.release(self.config)
        if self.bridge is not None:
            await self.bridge.close()

    def runtime_log(self, level: str, text: str, instance_id: str = "") -> None:
        self.log_lines.append(
            LogLine(time.time(), level, self.plugin, text, "runtime", instance_id=instance_id)
        )
        # The function's own log keeps the level; the process log stays quiet unless it is an error.
        log.log(logging.ERROR if level == "ERROR" else logging.DEBUG, "%s: %s", self.plugin, text)

    # ---- instances --------------------------------------------------------------------------

    async def add_instance(self, counted: bool = False) -> Instance:
        """Create one instance (zygote fork, else a fresh spawn); raises DeployFailed."""
        if not counted:
            self.starting += 1
        try:
            return await self._create()
        finally:
            self.starting -= 1
            self._wake_all()  # every waiting call looks again: pick the new instance or grow further

    async def _create(self, serving: bool = True) -> Instance:
        runtime = self.runtime
        instance_id = self.backend.next_instance_id()
        try:
            self.backend.reserve(runtime.memory_mb)
        except QuotaExceeded as exc:
            raise DeployFailed(str(exc)) from None
        started = time.perf_counter()
        uid = self.user.uid if self.user else None
        try:
            limits = self.backend.limits.instance(
                instance_id, runtime.memory_mb, runtime.cpu, runtime.max_concurrency, runtime.max_pids, uid
            )
        except OSError as exc:
            self.backend.ledger.release(runtime.memory_mb)
            raise DeployFailed(f"could not create the instance's cgroup: {exc}") from None
        # on_freed: an abandoned call ended, so its slot is free for a waiter
        instance = Instance(instance_id, self.plugin, limits, self.log_lines.append, self._on_end, self._wake)
        instance.max_pids = runtime.max_pids
        instance.uid = uid
        try:
            instance.tmp_dir = self.backend.sandbox.make_tmp(instance_id, self.user, runtime.tmp_mb)
        except OSError as exc:
            limits.remove()
            self.backend.ledger.release(runtime.memory_mb)
            raise DeployFailed(f"could not create the instance's temp folder: {exc}") from None
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w = os.pipe()
        config = {
            **self.config,
            "instance_id": instance_id,
            "cgroup_procs": limits.cgroup_procs,
            "cgroup_wait": self._cgroup_wait(limits),
            "rlimit_data": limits.rlimit_data,
            "rlimits": self._rlimits(runtime),
            "tmp_dir": str(instance.tmp_dir),
            "memory_mb": runtime.memory_mb,
            "max_concurrency": runtime.max_concurrency,
        }
        if serving:
            self.instances.append(instance)
        self.creating.add(instance)
        try:
            return await self._start(instance, config, parent, child, out_r, out_w, started)
        finally:
            self.creating.discard(instance)

    async def _start(
        self,
        instance: Instance,
        config: dict[str, Any],
        parent: socket.socket,
        child: socket.socket,
        out_r: int,
        out_w: int,
        started: float,
    ) -> Instance:
        instance_id = instance.id
        try:
            await instance.attach(parent, out_r)
            await self.launcher.launch(instance, config, child.fileno(), out_w)
        except BaseException as exc:  # noqa: BLE001 - cleaned up, then raised again
            child.close()
            os.close(out_w)
            instance.kill("start-up failed")
            if instance in self.instances:
                self.instances.remove(instance)
            await self._cleanup(instance)
            raise DeployFailed(f"could not start an instance: {exc}") from None
        child.close()
        os.close(out_w)
        if config["cgroup_wait"]:
            self._move_into_cgroup(instance)
        try:
            setup_ms = await asyncio.wait_for(asyncio.shield(instance.ready), self.backend.start_timeout_s)
        except asyncio.TimeoutError:
            instance.kill("it was not ready in time")
            raise DeployFailed(
                f"the instance was not ready within {self.backend.start_timeout_s:g} s (is setup() stuck?)"
            ) from None
        except DeployFailed as exc:
            exc.intentional = bool(instance.fate.killed)  # the runtime killed it (close, kill, scale)
            instance.kill("it failed to start")
            raise
        ready_ms = (time.perf_counter() - started) * 1000
        self.cold_starts_ms.append(ready_ms)
        self.runtime_log(
            "INFO",
            f"instance {instance_id} ready in {ready_ms:.1f} ms (setup {setup_ms:.0f} ms)",
            instance_id,
        )
        return instance

    def _rlimits(self, runtime: Runtime) -> dict[str, int]:
        return rlimits(runtime, self.user is not None, self.backend.limits.has_pids)

    def _cgroup_wait(self, limits: InstanceLimits) -> str:
        """cgroup v2 lets only the runtime move a process it does not own: the child waits for it."""
        if self.user is None or limits.version != 2 or limits.memory_dir is None:
            return ""
        return f"/{limits.memory_dir.parent.name}/{limits.memory_dir.name}"

    def _move_into_cgroup(self, instance: Instance) -> None:
        if instance.process is None or not instance.process.signal(0):
            return  # it has ended (its pid may be another process's by now): it waits for nothing
        for procs in instance.limits.cgroup_procs:
            with open(procs, "w") as f:
                f.write(str(instance.pid))

    def _on_end(self, instance: Instance) -> None:
        if instance in self.instances:
            self.instances.remove(instance)
        if instance is self.spare:
            self.spare = None
        why = instance.fate.killed or "it ended"
        self.runtime_log(
            "WARNING" if not instance.fate.killed else "INFO",
            f"instance {instance.id} removed: {why}",
            instance.id,
        )
        asyncio.get_running_loop().create_task(self._cleanup(instance))
        self._wake()
        if time.monotonic() - self.last_scale_up < self.backend.idle_timeout_s:
            self._refill_spare()

    async def _cleanup(self, instance: Instance) -> None:
        instance.kill(instance.fate.killed or "cleanup")
        for _ in range(50):
            if instance.limits.remove():
                break
            await asyncio.sleep(0.02)
        else:  # a process in it is slow to die (a busy host): housekeeping tries again
            self.backend.unremoved.append(instance.limits)
        instance.let_go()
        self._release(instance)
        self.launcher.forget(instance.id)
        if instance.tmp_dir is not None:
            tmp, instance.tmp_dir = instance.tmp_dir, None
            self.backend.sandbox.remove_tmp(tmp)

    def _release(self, instance: Instance) -> None:
        if not instance.ledger_released:
            instance.ledger_released = True
            self.backend.ledger.release(self.runtime.memory_mb)

    # ---- the spare instance -----------------------------------------------------------------

    def _refill_spare(self) -> None:
        """Keep one instance ready to hand out while the function can still grow: a new instance is
        then serving at once instead of after a fork and the kernel's cgroup attach."""
        if not self.backend.spares or self.closed or self.spare is not None or self._refilling:
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
                spare.kill("not needed")
            else:
                self.spare = spare

        self._background_task(refill())

    def _take_spare(self) -> bool:
        spare, self.spare = self.spare, None
        if spare is None or spare.fate.draining:
            return False
        spare.last_used = time.monotonic()
        self.instances.append(spare)
        self.runtime_log("INFO", f"instance {spare.id} added (the spare, already warm)", spare.id)
        self._wake_all()
        self._refill_spare()
        return True

    def drop_spare(self, reason: str) -> None:
        """Give up the spare, the warm one or one still starting, and its quota slot, now."""
        spare, self.spare = self.spare, None
        starting = [i for i in self.creating if i not in self.instances]  # a spare being made
        for instance in ([spare] if spare is not None else []) + starting:
            instance.kill(reason)
            self._release(instance)

    # ---- calls ------------------------------------------------------------------------------

    def _pick(self, prefer: str = "") -> Instance | None:
        """The usable instance with the fewest calls in flight; ``prefer`` (an instance id) wins when
        it is usable (a call retried after its dependency failed stays where it ran)."""
        best: Instance | None = None
        limit = self.runtime.max_concurrency
        for instance in self.instances:
            if instance.fate.draining or not instance.ready.done() or instance.ready.exception():
                continue
            if instance.cancel_timers:  # a timed-out call has not stopped yet: the loop may be blocked
                continue
            n = instance.in_flight
            if n < limit and prefer and instance.id == prefer:
                return instance
            if n < limit and (best is None or n < best.in_flight):
                best = instance
        return best

    def _wake(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _acquire(self, deadline: float) -> Instance | Failed:
        loop = asyncio.get_running_loop()
        while not self.closed:
            instance = self._pick()
            if instance is not None:
                return instance
            live = len([i for i in self.instances if not i.fate.ended and i.ready.done()]) + self.starting
            waiting = len(self.waiters) + 1
            if live < self.runtime.max_instances and self.starting * self.runtime.max_concurrency < waiting:
                self._scale_up()
                instance = self._pick()  # the spare may have been handed out at once
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

    def _scale_up(self) -> None:
        self.last_scale_up = time.monotonic()
        if self._take_spare():
            return
        self.starting += 1  # counted now, so other waiters in this loop turn see it

        self.last_create_error = None

        async def grow() -> None:
            try:
                await self.add_instance(counted=True)
                self._refill_spare()
            except DeployFailed as exc:
                if not exc.intentional:
                    self.last_create_error = exc
                    self.runtime_log("ERROR", f"could not add an instance: {exc.message}")
                self._wake_all()

        self._background_task(grow())

    def _background_task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    def _wake_all(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    async def invoke(self, request: CallRequest) -> Returned | Failed:
        ctx = request.context
        if self.bridge is not None:
            self.bridge.allow_args(request.args)
        message = [
            p.CALL,
            request.call_id,
            p.encode_context(ctx, request.call_id, self.plugin, time.time() + request.timeout_s),
            p.encode_args(self.spec.kind, request.args),
            request.fault,
        ]
        trajectory_id = ctx.trajectory_id
        started = time.perf_counter()
        deadline = time.monotonic() + request.timeout_s
        instance = self._pick(request.prefer_instance)
        if instance is None:
            got = await self._acquire(deadline)
            if isinstance(got, Failed):
                return got
            instance = got
        if request.fault in ENDS_INSTANCE:
            alone = await self._alone_on(instance, deadline)
            if isinstance(alone, Failed):
                return alone
            instance = alone
        pending = instance.start_call(request.call_id, trajectory_id, message)
        watched = self._watch_deadline(deadline - time.monotonic(), instance, request, started)
        try:
            result = await pending.future
        except asyncio.CancelledError:
            instance.abandon(request.call_id)  # its slot frees when the instance answers
            raise
        finally:
            watched.pop(request.call_id, None)
            self._wake()
        if self.bridge is not None:
            self.bridge.observe(result)
        if isinstance(result, Failed) and result.happened in RECYCLED:
            # its stray processes, or its full temp space, would fail the next calls too
            what = "pids limit" if result.happened is Happened.PIDS_LIMIT else "temp space is full"
            self._recycle(instance, f"it hit its {what}")
        return result

    async def _alone_on(self, instance: Instance, deadline: float) -> Instance | Failed:
        """An instance for an injected fault that ends it (``ENDS_INSTANCE``): it gets no new call
        and the fault waits until its other calls are done, so they are not failed with it and
        each fault is classified as itself. Bounded: after half the call's time it goes ahead."""
        for _ in range(3):
            instance.fate.drain()
            until = time.monotonic() + (deadline - time.monotonic()) / 2
            while instance.in_flight and not instance.fate.ended and time.monotonic() < until:
                await asyncio.sleep(ALONE_POLL_S)
            if not instance.fate.ended:
                return instance
            got = await self._acquire(deadline)  # it ended meanwhile (another fault): another one
            if isinstance(got, Failed):
                return got
            instance = got
        return instance

    def _watch_deadline(
        self, remaining_s: float, instance: Instance, request: CallRequest, started: float
    ) -> dict[str, tuple[Instance, CallRequest, float]]:
        """Expire the call when ``remaining_s`` has passed (up to DEADLINE_SLOT_S late). Calls whose
        deadlines fall in the same slot share one timer, so a call costs two dict operations."""
        loop = asyncio.get_running_loop()
        slot = math.ceil((loop.time() + max(0.0, remaining_s)) / DEADLINE_SLOT_S)
        calls = self._deadlines.get(slot)
        if calls is None:
            calls = self._deadlines[slot] = {}
            loop.call_at(slot * DEADLINE_SLOT_S, self._expire_slot, slot)
        calls[request.call_id] = (instance, request, started)
        return calls

    def _expire_slot(self, slot: int) -> None:
        for instance, request, started in self._deadlines.pop(slot, {}).values():
            self._expire(instance, request, started)

    def _expire(self, instance: Instance, request: CallRequest, started: float) -> None:
        pending = instance.expire(request.call_id, request.timeout_s)
        if pending is None or pending.future.done():
            return
        latency = (time.perf_counter() - started) * 1000
        message = f"the call ran past timeout_s={request.timeout_s:g} on instance {instance.id}"
        happened = Happened.DEADLINE
        if instance.hit_pids():  # it was stuck behind its own fork bomb
            happened, message = Happened.PIDS_LIMIT, f"{message} ({instance.pids_text()})"
            instance.fate.drain()  # recycled by invoke(); nothing else is routed here meanwhile
        peak = instance.limits.peak_mb() or (instance.peak_rss_mb or None)
        pending.future.set_result(Failed(happened, message, pending.logs, "", instance.id, peak, latency))
        if self.spec.is_async:
            # The task is cancelled; if the loop is blocked and does not answer, recycle the instance.
            handle = asyncio.get_running_loop().call_later(
                ASYNC_CANCEL_GRACE_S, self._recycle, instance, "a timed-out call did not stop when cancelled"
            )
            instance.cancel_timers[request.call_id] = handle
        else:
            # A sync call's thread cannot be stopped: stop routing calls here, recycle once idle.
            instance.fate.drain()
            self.runtime_log(
                "WARNING",
                f"instance {instance.id} draining: a sync call is stuck past its deadline",
                instance.id,
            )
            self._recycle_when_idle(instance)
            self._wake()

    def _recycle(self, instance: Instance, reason: str) -> None:
        if not instance.fate.ended:
            self.runtime_log("WARNING", f"recycling instance {instance.id}: {reason}", instance.id)
            instance.kill(reason)

    def _recycle_when_idle(self, instance: Instance) -> None:
        if instance.fate.ended:
            return
        if instance.in_flight == 0:
            self._recycle(instance, "a sync call was stuck past its deadline")
        else:
            asyncio.get_running_loop().call_later(0.05, self._recycle_when_idle, instance)

    # ---- scaling, idle scale-down, the memory watchdog --------------------------------------

    async def scale(self, instances: int) -> None:
        """Set the number of live instances (between min and max instances)."""
        target = max(self.runtime.min_instances, min(instances, self.runtime.max_instances))
        live = [i for i in self.instances if not i.fate.draining]
        if len(live) < target:
            await asyncio.gather(*(self.add_instance() for _ in range(target - len(live))))
        for instance in sorted(live, key=lambda i: i.in_flight)[: max(0, len(live) - target)]:
            self._retire(instance, "scaled down")

    async def kill(self, instance_id: str | None = None) -> None:
        for instance in list(self.instances):
            if instance_id is None or instance.id == instance_id:
                instance.kill("killed on request")

    def _retire(self, instance: Instance, reason: str) -> None:
        instance.fate.kill(reason)
        if instance.in_flight == 0:
            instance.kill(reason)
        else:
            self._recycle_when_idle(instance)

    async def _housekeeping(self) -> None:
        watchdog = self.backend.limits.mechanism == "rlimit+watchdog"
        period = self.backend.watchdog_period_s if watchdog else 0.25
        last_idle_check = time.monotonic()
        while not self.closed:
            await asyncio.sleep(period)
            if watchdog:
                self.monitor.watch_memory(self.instances)
            if not self.backend.sandbox.can_mount:  # plain temp folders: nothing else caps their size
                self.monitor.watch_disk(self.instances)
            if not self.backend.limits.has_pids:  # no pids.max: RLIMIT_NPROC, if any, is per uid
                self.monitor.watch_pids(self.instances, self.backend.processes)
            now = time.monotonic()
            if now - last_idle_check >= min(1.0, self.backend.idle_timeout_s / 4):
                last_idle_check = now
                self._scale_down_idle(now)
                self._keep_minimum()
                self.backend.retry_removals()

    def _scale_down_idle(self, now: float) -> None:
        if self.spare is not None and now - self.last_scale_up > self.backend.idle_timeout_s:
            self.drop_spare(f"no scale-up for {self.backend.idle_timeout_s:g} s")
        live = [i for i in self.instances if not i.fate.draining and i.ready.done()]
        extra = len(live) - self.runtime.min_instances
        for instance in live:
            if extra <= 0:
                break
            if instance.in_flight == 0 and now - instance.last_used > self.backend.idle_timeout_s:
                self._retire(instance, f"idle for more than {self.backend.idle_timeout_s:g} s")
                extra -= 1

    def _keep_minimum(self) -> None:
        live = len([i for i in self.instances if not i.fate.draining]) + self.starting
        if live < self.runtime.min_instances and self.last_create_error is None:
            self._scale_up()

    # ---- observation ------------------------------------------------------------------------

    def sample(self) -> dict[str, float]:
        """Resource gauges now (see ResourceMonitor); the spare is not counted."""
        return self.monitor.sample(self.instances)

    def logs(self) -> list[LogLine]:
        return list(self.log_lines)
