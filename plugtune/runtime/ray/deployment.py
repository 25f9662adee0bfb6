"""One function deployed on Ray: its actors (one instance each), routing, autoscaling, gauges, logs.

A call goes to the ready actor with the fewest calls in flight below ``max_concurrency``; the calls
in flight to one actor are multiplexed over few Ray calls, so Ray's per-call cost is paid per
batch: an ``exchange`` hands the actor the calls queued since the last one and returns the outcomes
finished by then (at least one), while a ``submit`` hands over calls that arrive while an exchange
is out. One call alone is one Ray call. When all actors are full, the function grows toward
``max_instances`` by in-flight demand, Ray spreading the new actors over nodes. Idle actors above
``min_instances`` are stopped. Each actor enforces limits and deadlines itself (see ``host``); the
driver only translates Ray's own failures (an actor or node lost) into facts.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from plugtune.runtime.backend import CallRequest, DeployFailed, DeployRequest, Failed, Happened, Returned
from plugtune.runtime.quota import QuotaExceeded
from plugtune.runtime.ray.facts import call_failed, host_failed, is_ray_error, start_failed
from plugtune.sdk import PluginSpec, Runtime
from plugtune.types import LogLine

if TYPE_CHECKING:
    from plugtune.runtime.ray.backend import RayBackend

log = logging.getLogger(__name__)

GUARD_S = 5.0  # the actor answers a call by its deadline itself; past this much more it is lost
REPORT_PERIOD_S = 0.5
MAX_LOG_LINES = 20_000


@dataclass(eq=False)
class RayInstance:
    tag: str
    handle: Any
    node_id: str = ""
    in_flight: int = 0
    ready: bool = False
    ended: bool = False
    lost: bool = False
    last_used: float = field(default_factory=time.monotonic)
    stats: dict[str, float] = field(default_factory=dict)
    pending: dict[str, asyncio.Future[Returned | Failed]] = field(default_factory=dict)  # by call id
    outbox: list[CallRequest] = field(default_factory=list)  # not yet handed to the actor
    exchanging: bool = False
    submitting: bool = False


class RayDeployment:
    def __init__(
        self, backend: RayBackend, request: DeployRequest, spec: PluginSpec, runtime: Runtime
    ) -> None:
        self.backend = backend
        self.request = request
        self.spec = spec
        self.runtime = runtime
        self.plugin = request.entry
        self.instances: list[RayInstance] = []
        self.starting = 0
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.log_lines: collections.deque[LogLine] = collections.deque(maxlen=MAX_LOG_LINES)
        self.last_create_error: DeployFailed | None = None
        self.closed = False
        self.retired_bytes = 0.0
        self.cold_starts_ms: list[float] = []
        self._tasks: set[asyncio.Task[Any]] = set()

    # ---- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        self.runtime_log("INFO", f"deployed on Ray ({self.backend.address}), limits enforced in each actor")
        first = max(1, self.runtime.min_instances)
        results = await asyncio.gather(*(self._add() for _ in range(first)), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        self._spawn(self._housekeeping())

    async def close(self) -> None:
        self.closed = True
        for task in list(self._tasks):
            task.cancel()
        self._wake(all_of_them=True)
        await asyncio.gather(*(self._stop(i, "the function was closed") for i in list(self.instances)))

    def runtime_log(self, level: str, text: str, instance_id: str = "") -> None:
        self.log_lines.append(
            LogLine(time.time(), level, self.plugin, text, "runtime", instance_id=instance_id)
        )
        log.log(logging.ERROR if level == "ERROR" else logging.DEBUG, "%s: %s", self.plugin, text)

    # ---- instances --------------------------------------------------------------------------

    async def _add(self) -> RayInstance:
        """Create one actor and wait until its worker is ready; raises DeployFailed."""
        self.starting += 1
        try:
            return await self._create()
        finally:
            self.starting -= 1
            self._wake(all_of_them=True)

    async def _create(self) -> RayInstance:
        try:
            self.backend.ledger.reserve(self.runtime.memory_mb)
        except QuotaExceeded as exc:
            raise DeployFailed(str(exc)) from None
        started = time.perf_counter()
        instance = self.backend.new_actor(self.request, self.runtime)
        timeout = self.backend.start_timeout_s
        try:
            info = await asyncio.wait_for(instance.handle.start.remote(), timeout)
        except asyncio.TimeoutError:
            error = DeployFailed(
                f"no Ray node started the instance within {timeout:g} s: is every node's CPU/memory "
                f"taken (cpu={self.runtime.cpu:g}, memory_mb={self.runtime.memory_mb}), or is setup() stuck?"
            )
            await self._stop(instance, "it was not ready in time", error)
            raise error from None
        except Exception as exc:
            if not is_ray_error(exc):
                raise
            failure = start_failed(exc)
            await self._stop(
                instance, "it failed to start", failure if isinstance(failure, DeployFailed) else None
            )
            raise failure from None
        if "error" in info:
            message, tb, logs = info["error"]
            error = DeployFailed(message, tb, logs)
            await self._stop(instance, "it failed to start", error)
            raise error
        instance.node_id, instance.ready = info["node_id"], True
        self.instances.append(instance)
        ready_ms = (time.perf_counter() - started) * 1000
        self.cold_starts_ms.append(ready_ms)
        self.runtime_log(
            "INFO",
            f"instance {instance.tag} ready in {ready_ms:.0f} ms on Ray node {instance.node_id[:12]} "
            f"(limits: {info['limits']})",
            instance.tag,
        )
        if self.closed:
            await self._stop(instance, "the function was closed")
        return instance

    async def _stop(self, instance: RayInstance, reason: str, error: DeployFailed | None = None) -> None:
        """Close the actor's worker (its last log lines come back), then end the actor."""
        was_live = not instance.ended
        instance.ended = True
        if instance in self.instances:
            self.instances.remove(instance)
        if self.backend.lost is None:  # with the head gone, nothing would answer
            try:
                lines = await asyncio.wait_for(instance.handle.close.remote(), 5.0)
                self.log_lines.extend(lines)
            except Exception as exc:  # noqa: BLE001 - the actor may be gone already; killing it is enough
                log.debug("%s: closing actor %s: %s", self.plugin, instance.tag, exc)
        self.backend.kill_actor(instance.handle)
        if was_live:
            self.backend.ledger.release(self.runtime.memory_mb)
            self.retired_bytes += instance.stats.get("outbound_bytes", 0.0)
            if instance.ready:
                self.runtime_log("INFO", f"instance {instance.tag} removed: {reason}", instance.tag)
        if error is not None and error.logs:
            self.log_lines.extend(error.logs)

    def _lost(self, instance: RayInstance, why: str) -> None:
        """Ray says the actor is gone (crash, node lost): forget it, grow again if needed."""
        if instance.ended or instance.lost:
            return
        instance.lost = True
        self.runtime_log("WARNING", f"instance {instance.tag} lost: {why}", instance.tag)
        self._spawn(self._stop(instance, why))
        self._wake(all_of_them=True)

    # ---- calls ------------------------------------------------------------------------------

    async def invoke(self, request: CallRequest) -> Returned | Failed:
        self.backend.check_cluster()
        deadline = time.monotonic() + request.timeout_s
        instance = self._pick()
        if instance is None:
            got = await self._acquire(deadline)
            if isinstance(got, Failed):
                return got
            instance = got
        instance.in_flight += 1
        started = time.perf_counter()
        future: asyncio.Future[Returned | Failed] = asyncio.get_running_loop().create_future()
        instance.pending[request.call_id] = future
        instance.outbox.append(request)
        self._pump(instance)
        try:
            return await asyncio.wait_for(future, request.timeout_s + GUARD_S)
        except asyncio.TimeoutError:
            await self.backend.confirm_head()
            self._lost(instance, f"it did not answer within timeout_s + {GUARD_S:g} s")
            text = f"the call ran past timeout_s={request.timeout_s:g} on instance {instance.tag}"
            return Failed(Happened.DEADLINE, text, instance_id=instance.tag, latency_ms=_ms(started))
        except Exception as exc:
            if not is_ray_error(exc):
                raise
            await self.backend.confirm_head()
            failed = call_failed(exc, instance.tag, instance.node_id, _ms(started))
            self._lost(instance, failed.message)
            return failed
        finally:
            instance.pending.pop(request.call_id, None)
            instance.in_flight -= 1
            instance.last_used = time.monotonic()
            self._wake()

    def _pump(self, instance: RayInstance) -> None:
        """Hand the queued calls to the actor: in an exchange if none is out, else in a submit."""
        if not instance.outbox:
            return
        if not instance.exchanging:
            instance.exchanging = True
            self._spawn(self._exchange(instance))
        elif not instance.submitting:
            instance.submitting = True
            self._spawn(self._submit(instance))

    async def _exchange(self, instance: RayInstance) -> None:
        try:
            while instance.pending or instance.outbox:
                batch, instance.outbox = instance.outbox, []
                finished, lines = await instance.handle.exchange.remote(batch)
                self.log_lines.extend(lines)
                for call_id, outcome, host_error in finished:
                    future = instance.pending.pop(call_id, None)  # answered: no exchange waits for it
                    if future is None or future.done():
                        continue  # the driver gave up on it already
                    if host_error:
                        future.set_exception(host_failed(host_error))
                    else:
                        future.set_result(outcome)
        except Exception as exc:  # noqa: BLE001 - the actor or Ray failed: every call out fails with it
            _fail(instance.pending.values(), exc)
        finally:
            instance.exchanging = False
            self._pump(instance)

    async def _submit(self, instance: RayInstance) -> None:
        batch, instance.outbox = instance.outbox, []
        try:
            await instance.handle.submit.remote(batch)
        except Exception as exc:  # noqa: BLE001 - as in _exchange
            _fail((instance.pending[r.call_id] for r in batch if r.call_id in instance.pending), exc)
        finally:
            instance.submitting = False
            self._pump(instance)

    def fail_all(self, error: BaseException) -> None:
        """Every call out fails with ``error`` now (the cluster is lost)."""
        for instance in self.instances:
            _fail(instance.pending.values(), error)

    def _pick(self) -> RayInstance | None:
        best: RayInstance | None = None
        limit = self.runtime.max_concurrency
        for instance in self.instances:
            if instance.ended or not instance.ready or instance.in_flight >= limit:
                continue
            if best is None or instance.in_flight < best.in_flight:
                best = instance
        return best

    async def _acquire(self, deadline: float) -> RayInstance | Failed:
        loop = asyncio.get_running_loop()
        while not self.closed:
            instance = self._pick()
            if instance is not None:
                return instance
            live = len([i for i in self.instances if not i.ended]) + self.starting
            waiting = len(self.waiters) + 1
            if live < self.runtime.max_instances and self.starting * self.runtime.max_concurrency < waiting:
                self._scale_up()
            if not self.instances and self.starting == 0 and self.last_create_error is not None:
                error = self.last_create_error
                return Failed(Happened.NOT_CREATED, error.message, error.logs, error.traceback)
            waiter = loop.create_future()
            self.waiters.append(waiter)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                await asyncio.wait_for(waiter, remaining)
            except asyncio.TimeoutError:
                break
        if self.closed:
            return Failed(Happened.DIED, "the function was closed")
        return Failed(Happened.DEADLINE, f"no instance was free within timeout_s={self.runtime.timeout_s:g}")

    def _scale_up(self) -> None:
        self.starting += 1  # counted now, so other waiters in this loop turn see it
        self.last_create_error = None

        async def grow() -> None:
            self.starting -= 1
            try:
                await self._add()
            except DeployFailed as exc:
                self.last_create_error = exc
                self.runtime_log("ERROR", f"could not add an instance: {exc.message}")
                self._wake(all_of_them=True)

        self._spawn(grow())

    def _wake(self, all_of_them: bool = False) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                if not all_of_them:
                    return

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- scaling, reports -------------------------------------------------------------------

    async def scale(self, instances: int) -> None:
        """Set the number of live instances (between min and max instances)."""
        target = max(self.runtime.min_instances, min(instances, self.runtime.max_instances))
        live = [i for i in self.instances if not i.ended]
        if len(live) < target:
            await asyncio.gather(*(self._add() for _ in range(target - len(live))))
        for instance in sorted(live, key=lambda i: i.in_flight)[: max(0, len(live) - target)]:
            await self._stop(instance, "scaled down")

    async def kill(self, instance_id: str | None = None) -> None:
        """End instances' actors as a crash would (``instance_id``: an actor tag or its worker's id)."""
        for instance in list(self.instances):
            if instance_id is None or instance_id.split("-")[0] == instance.tag:
                self.backend.kill_actor(instance.handle)

    async def _housekeeping(self) -> None:
        while not self.closed:
            await asyncio.sleep(REPORT_PERIOD_S)
            self.backend.watch_head()
            if self.backend.lost is not None:
                return
            await self._collect_reports()
            now = time.monotonic()
            idle_s = self.backend.idle_timeout_s
            live = [i for i in self.instances if not i.ended]
            extra = len(live) - self.runtime.min_instances
            for instance in live:
                if extra > 0 and instance.in_flight == 0 and now - instance.last_used > idle_s:
                    self._spawn(self._stop(instance, f"idle for more than {idle_s:g} s"))
                    extra -= 1
            if len(live) + self.starting < self.runtime.min_instances and self.last_create_error is None:
                self._scale_up()

    async def _collect_reports(self) -> None:
        live = [i for i in self.instances if not i.ended]
        replies = await asyncio.gather(
            *(asyncio.wait_for(i.handle.report.remote(), 10.0) for i in live), return_exceptions=True
        )
        for instance, reply in zip(live, replies, strict=True):
            if isinstance(reply, BaseException):
                if isinstance(reply, asyncio.TimeoutError) or is_ray_error(reply):
                    why = f"it stopped answering ({type(reply).__name__}) on Ray node {instance.node_id[:12]}"
                    self._lost(instance, why)
                continue
            stats, lines = reply
            instance.stats = stats
            self.log_lines.extend(lines)

    def sample(self) -> dict[str, float]:
        """Resource gauges over all actors: sums (instances, traffic), mean CPU %, max memory %."""
        live = [i for i in self.instances if not i.ended and i.ready]
        n = len(live)
        cpu = [i.stats.get("cpu_percent", 0.0) for i in live]
        return {
            "instances": float(n),
            "cpu_percent": sum(cpu) / n if n else 0.0,
            "memory_percent": max((i.stats.get("memory_percent", 0.0) for i in live), default=0.0),
            "outbound_bytes": self.retired_bytes + sum(i.stats.get("outbound_bytes", 0.0) for i in live),
            "concurrency_per_instance": sum(i.in_flight for i in live) / n if n else 0.0,
        }

    def logs(self) -> list[LogLine]:
        return list(self.log_lines)


def _fail(futures: Any, error: BaseException) -> None:
    for future in list(futures):
        if not future.done():
            future.set_exception(error)


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000
