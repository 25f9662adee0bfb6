"""One function deployed on Ray: its actors (one instance each), their calls, gauges and logs.

The :class:`~plugtune.runtime.pool.InstancePool` routes and scales, as on the local backend: a call
goes to the ready actor with the fewest calls in flight below ``max_concurrency``; the calls
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
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from plugtune.runtime.backend import CallRequest, DeployFailed, DeployRequest, Failed, Happened, Returned
from plugtune.runtime.fate import Fate
from plugtune.runtime.pool import InstancePool
from plugtune.runtime.quota import QuotaExceeded, QuotaLedger
from plugtune.runtime.ray.facts import call_failed, host_failed, is_ray_error, start_failed
from plugtune.runtime.ray.keeper import DependencyTally
from plugtune.runtime.ray.loopback import is_loopback
from plugtune.runtime.ray.relay import PolicyRelay
from plugtune.sdk import PluginSpec, Runtime
from plugtune.types import LogLine

log = logging.getLogger(__name__)

GUARD_S = 5.0  # the actor answers a call by its deadline itself; past this much more it is lost
REPORT_PERIOD_S = 0.5


@dataclass(eq=False)
class RayInstance:
    id: str  # the actor's tag (its worker's instance ids start with it)
    handle: Any
    node_id: str = ""
    in_flight: int = 0
    ready: bool = False
    fate: Fate = field(default_factory=Fate)
    started_at: float = field(default_factory=time.perf_counter)
    last_used: float = field(default_factory=time.monotonic)
    stats: dict[str, float] = field(default_factory=dict)
    pending: dict[str, asyncio.Future[Returned | Failed]] = field(default_factory=dict)  # by call id
    outbox: list[CallRequest] = field(default_factory=list)  # not yet handed to the actor
    exchanging: bool = False
    submitting: bool = False

    @property
    def started(self) -> bool:
        return self.ready

    def is_usable(self) -> bool:
        return self.ready


class RayHost(Protocol):
    """What a Ray deployment uses of its backend (:class:`~plugtune.runtime.ray.backend.RayBackend`)."""

    address: str
    ledger: QuotaLedger
    start_timeout_s: float
    idle_timeout_s: float
    lost: Exception | None
    relay: PolicyRelay | None

    def new_actor(self, request: DeployRequest, runtime: Runtime) -> RayInstance: ...

    def kill_actor(self, handle: Any) -> None: ...

    def check_cluster(self) -> None: ...

    def watch_head(self) -> None: ...

    async def confirm_head(self) -> None: ...

    async def reach_node(self, node_id: str) -> str: ...


class RayDeployment:
    def __init__(self, backend: RayHost, request: DeployRequest, spec: PluginSpec, runtime: Runtime) -> None:
        self.backend = backend
        self.request = request
        self.spec = spec
        self.runtime = runtime
        self.plugin = request.entry
        self.pool: InstancePool[RayInstance] = InstancePool(
            self,
            self.plugin,
            runtime,
            idle_timeout_s=backend.idle_timeout_s,
            period_s=REPORT_PERIOD_S,
            idle_check_s=0.0,  # every report
            spares=False,
        )
        self.runtime_log = self.pool.runtime_log
        self.retired_bytes = 0.0
        self.cold_starts_ms: list[float] = []
        self.dependencies = DependencyTally()  # the actors' dependency meters, summed

    @property
    def instances(self) -> list[RayInstance]:
        """The actors calls are routed to (those starting among them)."""
        return self.pool.instances

    # ---- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        self.runtime_log("INFO", f"deployed on Ray ({self.backend.address}), limits enforced in each actor")
        if self.backend.relay is not None:  # a cluster of hosts: loopback means each node's own
            for dep in self.request.dependencies:
                if is_loopback(dep.host):
                    self.runtime_log(
                        "WARNING",
                        f"dependency {dep.name} is declared at {dep.host}:{dep.port}: on each Ray node "
                        "that is the node's own loopback, not the driver's; declare it by an address "
                        "the nodes reach",
                    )
        await self.pool.start()

    async def close(self) -> None:
        ending = self.pool.close()
        for task in list(self.pool.background):
            task.cancel()
        await asyncio.gather(*(self._stop(i, "the function was closed") for i in ending))

    # ---- the pool's maker: one actor --------------------------------------------------------

    def make(self) -> RayInstance:
        try:
            self.backend.ledger.reserve(self.runtime.memory_mb)
        except QuotaExceeded as exc:
            raise DeployFailed(str(exc)) from None
        started = time.perf_counter()
        instance = self.backend.new_actor(self.request, self.runtime)
        instance.started_at = started
        return instance

    async def launch(self, instance: RayInstance) -> None:
        """Wait until the actor's worker is ready; raises DeployFailed (the actor stopped)."""
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
        ready_ms = (time.perf_counter() - instance.started_at) * 1000
        self.cold_starts_ms.append(ready_ms)
        self.runtime_log(
            "INFO",
            f"instance {instance.id} ready in {ready_ms:.0f} ms on Ray node {instance.node_id[:12]} "
            f"(limits: {info['limits']})",
            instance.id,
        )
        if self.pool.closed:
            await self._stop(instance, "the function was closed")

    def end(self, instance: RayInstance, reason: str) -> None:
        instance.fate.kill(reason)
        self.pool.spawn(self._stop(instance, reason))

    def retire(self, instance: RayInstance, reason: str) -> None:
        self.end(instance, reason)

    def discard(self, instance: RayInstance, reason: str) -> None:
        self.end(instance, reason)

    async def watch(self, instances: list[RayInstance]) -> bool:
        """Check the head; collect each actor's gauges and log lines (an actor that does not answer
        is lost). False once the head is lost."""
        self.backend.watch_head()
        if self.backend.lost is not None:
            return False
        await self._collect_reports(instances)
        return True

    def tidy(self) -> None:
        pass

    async def _stop(self, instance: RayInstance, reason: str, error: DeployFailed | None = None) -> None:
        """Close the actor's worker (its last log lines come back), then end the actor."""
        was_live = instance.fate.end()
        self.pool.forget(instance)
        self.dependencies.forget(instance.id)
        if self.backend.lost is None:  # with the head gone, nothing would answer
            try:
                lines = await asyncio.wait_for(instance.handle.close.remote(), 5.0)
                self.pool.log_lines.extend(lines)
            except Exception as exc:  # noqa: BLE001 - the actor may be gone already; killing it is enough
                log.debug("%s: closing actor %s: %s", self.plugin, instance.id, exc)
        self.backend.kill_actor(instance.handle)
        if was_live:
            self.backend.ledger.release(self.runtime.memory_mb)
            self.retired_bytes += instance.stats.get("outbound_bytes", 0.0)
            if instance.ready:
                self.runtime_log("INFO", f"instance {instance.id} removed: {reason}", instance.id)
        if error is not None and error.logs:
            self.pool.log_lines.extend(error.logs)

    def _lost(self, instance: RayInstance, why: str) -> None:
        """Ray says the actor is gone (crash, node lost): forget it, grow again if needed."""
        if instance.fate.draining:
            return
        instance.fate.drain()
        self.runtime_log("WARNING", f"instance {instance.id} lost: {why}", instance.id)
        self.pool.spawn(self._stop(instance, why))
        self.pool.wake_all()

    # ---- calls ------------------------------------------------------------------------------

    async def invoke(self, request: CallRequest) -> Returned | Failed:
        self.backend.check_cluster()
        deadline = time.monotonic() + request.timeout_s
        if self.backend.relay is not None:  # the policy as the instance's node reaches it
            request = dataclasses.replace(request, args=await self.backend.relay.rewrite(request.args))
        instance = self.pool.pick()
        if instance is None:
            got = await self.pool.acquire(deadline)
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
            # The actor answers a call by its deadline itself (a Timeout when the plugin hangs): no
            # answer GUARD_S later means the actor, its node or the link to it is gone, not the plugin.
            await self.backend.confirm_head()
            why = await self.backend.reach_node(instance.node_id)
            text = (
                f"instance {instance.id} on Ray node {instance.node_id[:12]} did not answer within "
                f"timeout_s + {GUARD_S:g} s: {why or 'its actor or node is lost'}"
            )
            self._lost(instance, text)
            return Failed(Happened.DIED, text, instance_id=instance.id, latency_ms=_ms(started))
        except Exception as exc:
            if not is_ray_error(exc):
                raise
            await self.backend.confirm_head()
            failed = call_failed(exc, instance.id, instance.node_id, _ms(started))
            self._lost(instance, failed.message)
            return failed
        finally:
            instance.pending.pop(request.call_id, None)
            instance.in_flight -= 1
            instance.last_used = time.monotonic()
            self.pool.wake()

    def _pump(self, instance: RayInstance) -> None:
        """Hand the queued calls to the actor: in an exchange if none is out, else in a submit."""
        if not instance.outbox:
            return
        if not instance.exchanging:
            instance.exchanging = True
            self.pool.spawn(self._exchange(instance))
        elif not instance.submitting:
            instance.submitting = True
            self.pool.spawn(self._submit(instance))

    async def _exchange(self, instance: RayInstance) -> None:
        try:
            while instance.pending or instance.outbox:
                batch, instance.outbox = instance.outbox, []
                finished, lines = await instance.handle.exchange.remote(batch)
                self.pool.log_lines.extend(lines)
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
        for instance in self.pool.instances:
            _fail(instance.pending.values(), error)

    # ---- scaling, reports -------------------------------------------------------------------

    async def scale(self, instances: int) -> None:
        """Set the number of live instances (between min and max instances)."""
        await self.pool.scale(instances)

    async def kill(self, instance_id: str | None = None) -> None:
        """End instances' actors as a crash would (``instance_id``: an actor tag or its worker's id)."""
        for instance in list(self.pool.instances):
            if instance.ready and (instance_id is None or instance_id.split("-")[0] == instance.id):
                self.backend.kill_actor(instance.handle)

    async def _collect_reports(self, instances: list[RayInstance]) -> None:
        live = [i for i in instances if not i.fate.ended and i.ready]
        replies = await asyncio.gather(
            *(asyncio.wait_for(i.handle.report.remote(), 10.0) for i in live), return_exceptions=True
        )
        for instance, reply in zip(live, replies, strict=True):
            if isinstance(reply, BaseException):
                if isinstance(reply, asyncio.TimeoutError) or is_ray_error(reply):
                    why = f"it stopped answering ({type(reply).__name__}) on Ray node {instance.node_id[:12]}"
                    self._lost(instance, why)
                continue
            stats, lines, dependencies = reply
            instance.stats = stats
            self.pool.log_lines.extend(lines)
            self.dependencies.add(instance.id, dependencies)

    def sample(self) -> dict[str, float]:
        """Resource gauges over all actors: sums (instances, traffic), mean CPU %, max memory %; the
        declared dependencies' series over the period (see ``keeper.DependencyTally``)."""
        live = [i for i in self.pool.instances if not i.fate.ended and i.ready]
        n = len(live)
        cpu = [i.stats.get("cpu_percent", 0.0) for i in live]
        return {
            "instances": float(n),
            "cpu_percent": sum(cpu) / n if n else 0.0,
            "memory_percent": max((i.stats.get("memory_percent", 0.0) for i in live), default=0.0),
            "outbound_bytes": self.retired_bytes + sum(i.stats.get("outbound_bytes", 0.0) for i in live),
            "concurrency_per_instance": sum(i.in_flight for i in live) / n if n else 0.0,
            **self.dependencies.sample(),
        }

    def logs(self) -> list[LogLine]:
        return list(self.pool.log_lines)


def _fail(futures: Any, error: BaseException) -> None:
    for future in list(futures):
        if not future.done():
            future.set_exception(error)


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000
