"""One function deployed on the local backend: its instances are limited local processes.

The :class:`~plugtune.runtime.pool.InstancePool` routes, scales and keeps the spare; this module is
the local backend's part of it (create an instance in its cgroup and temp folder, start it from the
zygote, watch its limits, end and clean it up) and the call itself: a call past its deadline gets
``DEADLINE``; its instance is asked to cancel it (async) or drained and recycled (a stuck sync thread).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import Any, NamedTuple, Protocol

from plugtune.runtime import protocol as p
from plugtune.runtime.backend import CallRequest, DeployFailed, DeployRequest, Failed, Happened, Returned
from plugtune.runtime.bridge import PolicyBridge
from plugtune.runtime.instance import RECYCLED, Instance
from plugtune.runtime.launcher import Launcher
from plugtune.runtime.limits import InstanceLimits, Limits, rlimits
from plugtune.runtime.monitor import ProcessTable, ResourceMonitor
from plugtune.runtime.pool import Deadlines, InstancePool
from plugtune.runtime.quota import QuotaExceeded, QuotaLedger
from plugtune.runtime.sandbox import Sandbox, User
from plugtune.runtime.zygote_client import Zygote
from plugtune.sdk import PluginSpec, Runtime
from plugtune.types import LogLine

log = logging.getLogger(__name__)

ASYNC_CANCEL_GRACE_S = 1.0
ENDS_INSTANCE = ("eof", "oom")  # injected faults that end their instance (FaultInjection)
ALONE_POLL_S = 0.02
IDLE_CHECK_S = 1.0  # at most this long between idle checks (a quarter of idle_timeout_s when shorter)


class LocalHost(Protocol):
    """What a local deployment uses of its backend (:class:`~plugtune.runtime.local.LocalBackend`):
    the machine's limits, quota, sandbox and process table, shared by its functions."""

    limits_mechanism: str
    limits: Limits
    ledger: QuotaLedger
    sandbox: Sandbox
    processes: ProcessTable
    unremoved: list[InstanceLimits]
    start_timeout_s: float
    idle_timeout_s: float
    watchdog_period_s: float
    spares: bool

    def reserve(self, memory_mb: int) -> None: ...

    def next_instance_id(self) -> str: ...

    def retry_removals(self) -> None: ...

    def release(self, config: dict[str, Any]) -> None: ...


class Watched(NamedTuple):
    """A call whose deadline is watched."""

    instance: Instance
    request: CallRequest
    started: float


class LocalDeployment:
    def __init__(
        self,
        backend: LocalHost,
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
        self.plugin = request.entry
        watchdog = backend.limits.mechanism == "rlimit+watchdog"
        self.pool: InstancePool[Instance] = InstancePool(
            self,
            self.plugin,
            runtime,
            idle_timeout_s=backend.idle_timeout_s,
            period_s=backend.watchdog_period_s if watchdog else 0.25,
            idle_check_s=min(IDLE_CHECK_S, backend.idle_timeout_s / 4),
            spares=backend.spares,
        )
        self.runtime_log = self.pool.runtime_log
        self.launcher = Launcher(zygote, self.runtime_log)
        self.monitor = ResourceMonitor(runtime)
        self.config = config
        self.user = User(*config["user"]) if config.get("user") else None
        self.cold_starts_ms: list[float] = []
        self.deadlines: Deadlines[Watched] = Deadlines(self._expire)
        self.bridge: PolicyBridge | None = None  # network policy-only: the instances' way to the policy

    @property
    def instances(self) -> list[Instance]:
        """The instances calls are routed to (those starting among them; the spare is not)."""
        return self.pool.instances

    @property
    def spare(self) -> Instance | None:
        return self.pool.spare

    # ---- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        self.runtime_log("INFO", f"deployed with limits: {self.backend.limits_mechanism}")
        await self.pool.start()

    async def close(self) -> None:
        ending = self.pool.close()
        for instance in ending:
            instance.kill("the function was closed")
        await asyncio.sleep(0)
        tasks = [i.end_task for i in ending if i.end_task is not None] + list(self.pool.background)
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
        for instance in ending:
            await self._cleanup(instance)
        await self.launcher.close()
        self.backend.release(self.config)
        if self.bridge is not None:
            await self.bridge.close()

    # ---- the pool's maker: one instance's process, limits and end ----------------------------

    def make(self) -> Instance:
        """A new instance: its quota, cgroup and temp folder (its process starts in :meth:`start`)."""
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
        instance = Instance(
            instance_id, self.plugin, limits, self.pool.log_lines.append, self._on_end, self.pool.wake
        )
        instance.started_at = started
        instance.max_pids = runtime.max_pids
        instance.uid = uid
        try:
            instance.tmp_dir = self.backend.sandbox.make_tmp(instance_id, self.user, runtime.tmp_mb)
        except OSError as exc:
            limits.remove()
            self.backend.ledger.release(runtime.memory_mb)
            raise DeployFailed(f"could not create the instance's temp folder: {exc}") from None
        return instance

    async def launch(self, instance: Instance) -> None:
        """Start the instance's process (zygote fork, else a fresh spawn) and wait until it is ready."""
        runtime, limits = self.runtime, instance.limits
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w = os.pipe()
        config = {
            **self.config,
            "instance_id": instance.id,
            "cgroup_procs": limits.cgroup_procs,
            "cgroup_wait": self._cgroup_wait(limits),
            "rlimit_data": limits.rlimit_data,
            "rlimits": self._rlimits(runtime),
            "tmp_dir": str(instance.tmp_dir),
            "memory_mb": runtime.memory_mb,
            "max_concurrency": runtime.max_concurrency,
        }
        try:
            await instance.attach(parent, out_r)
            await self.launcher.launch(instance, config, child.fileno(), out_w)
        except BaseException as exc:  # noqa: BLE001 - cleaned up, then raised again
            child.close()
            os.close(out_w)
            instance.kill("start-up failed")
            self.pool.forget(instance)
            await self._cleanup(instance)
            raise DeployFailed(f"could not start an instance: {exc}") from None
        child.close()
        os.close(out_w)
        if config["cgroup_wait"]:
            self._move_into_cgroup(instance)
        await self._ready(instance)

    async def _ready(self, instance: Instance) -> None:
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
        ready_ms = (time.perf_counter() - instance.started_at) * 1000
        self.cold_starts_ms.append(ready_ms)
        self.runtime_log(
            "INFO",
            f"instance {instance.id} ready in {ready_ms:.1f} ms (setup {setup_ms:.0f} ms)",
            instance.id,
        )

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
        why = instance.fate.killed or "it ended"
        self.runtime_log(
            "WARNING" if not instance.fate.killed else "INFO",
            f"instance {instance.id} removed: {why}",
            instance.id,
        )
        asyncio.get_running_loop().create_task(self._cleanup(instance))
        self.pool.ended(instance)

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

    def end(self, instance: Instance, reason: str) -> None:
        instance.kill(reason)

    def retire(self, instance: Instance, reason: str) -> None:
        instance.fate.kill(reason)
        if instance.in_flight == 0:
            instance.kill(reason)
        else:
            self._recycle_when_idle(instance)

    def discard(self, instance: Instance, reason: str) -> None:
        instance.kill(reason)
        self._release(instance)

    async def watch(self, instances: list[Instance]) -> bool:
        """The watches for limits the kernel does not hold here (memory, temp space, pids)."""
        if self.backend.limits.mechanism == "rlimit+watchdog":
            self.monitor.watch_memory(instances)
        if not self.backend.sandbox.can_mount:  # plain temp folders: nothing else caps their size
            self.monitor.watch_disk(instances)
        if not self.backend.limits.has_pids:  # no pids.max: RLIMIT_NPROC, if any, is per uid
            self.monitor.watch_pids(instances, self.backend.processes)
        return True

    def tidy(self) -> None:
        self.backend.retry_removals()

    def drop_spare(self, reason: str) -> None:
        """Give up the spare, the warm one or one still starting, and its quota slot, now."""
        self.pool.drop_spare(reason)

    # ---- calls ------------------------------------------------------------------------------

    async def invoke(self, request: CallRequest) -> Returned | Failed:
        ctx = request.context
        if self.bridge is not None:
            self.bridge.allow_args(request.args)
        call = p.Call(
            request.call_id,
            p.encode_context(ctx, request.call_id, self.plugin, time.time() + request.timeout_s),
            p.encode_args(self.spec.kind, request.args),
            request.fault,
        )
        message = [p.CALL, *call]
        trajectory_id = ctx.trajectory_id
        started = time.perf_counter()
        deadline = time.monotonic() + request.timeout_s
        instance = self.pool.pick(request.prefer_instance)
        if instance is None:
            got = await self.pool.acquire(deadline)
            if isinstance(got, Failed):
                return got
            instance = got
        if request.fault in ENDS_INSTANCE:
            alone = await self._alone_on(instance, deadline)
            if isinstance(alone, Failed):
                return alone
            instance = alone
        pending = instance.start_call(request.call_id, trajectory_id, message)
        watched = self.deadlines.watch(
            deadline - time.monotonic(), request.call_id, Watched(instance, request, started)
        )
        try:
            result = await pending.future
        except asyncio.CancelledError:
            instance.abandon(request.call_id)  # its slot frees when the instance answers
            raise
        finally:
            watched.pop(request.call_id, None)
            self.pool.wake()
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
            got = await self.pool.acquire(deadline)  # it ended meanwhile (another fault): another one
            if isinstance(got, Failed):
                return got
            instance = got
        return instance

    def _expire(self, watched: Watched) -> None:
        instance, request, started = watched
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
            self.pool.wake()

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

    # ---- scaling, observation ---------------------------------------------------------------

    async def scale(self, instances: int) -> None:
        """Set the number of live instances (between min and max instances)."""
        await self.pool.scale(instances)

    async def kill(self, instance_id: str | None = None) -> None:
        for instance in list(self.pool.instances):
            if instance_id is None or instance.id == instance_id:
                instance.kill("killed on request")

    def sample(self) -> dict[str, float]:
        """Resource gauges now (see ResourceMonitor); the spare is not counted."""
        return self.monitor.sample(self.pool.instances)

    def logs(self) -> list[LogLine]:
        return list(self.pool.log_lines)
