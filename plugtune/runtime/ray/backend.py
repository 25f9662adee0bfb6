"""The Ray backend: each plugin instance is a Ray actor running plugtune's supervisor on its node.

The snapshot folder is shipped as the actors' ``runtime_env`` ``working_dir`` (Ray stores it in
the cluster by content hash, so every node runs exactly the code the console shows), and plugtune
itself as one of its ``py_modules``; before the first deploy each node is checked for the rest of
what it needs (``nodes``). One keeper actor holds the declared dependencies' budgets for every
actor (``keeper``); a relay lets the other nodes reach a loopback policy (``relay``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import time
from pathlib import Path
from typing import Any

from plugtune.runtime.backend import DeployFailed, DeployRequest
from plugtune.runtime.local import spec_from
from plugtune.runtime.quota import QuotaLedger
from plugtune.runtime.ray.cluster import import_ray
from plugtune.runtime.ray.code import ship, ship_plugtune
from plugtune.runtime.ray.deployment import RayDeployment, RayInstance
from plugtune.runtime.ray.facts import cluster_lost, is_ray_error, start_failed
from plugtune.runtime.ray.host import InstanceHost, read_spec_sync
from plugtune.runtime.ray.keeper import KEEPER_CALLS, BudgetKeeper
from plugtune.runtime.ray.loopback import is_loopback
from plugtune.runtime.ray.nodes import NodeCheck
from plugtune.runtime.ray.relay import PolicyRelay
from plugtune.sdk import Runtime

log = logging.getLogger(__name__)

MIB = 1 << 20
HEALTH_PERIOD_S = 5.0
HEALTH_TIMEOUT_S = 20.0
DIAL_TIMEOUT_S = 5.0
ACTOR_METHODS = 16  # at once on one actor: an exchange, a submit, report, close (calls are batched)


class RayBackend:
    limits_mechanism = "ray actor + node-local limits"

    def __init__(
        self,
        address: str,
        ledger: QuotaLedger,
        *,
        idle_timeout_s: float = 60.0,
        start_timeout_s: float = 120.0,
        runtime_env: dict[str, Any] | None = None,
        ship_plugtune: bool = True,
    ) -> None:
        ray = import_ray()
        self.ray = ray
        self.address = address
        self.ledger = ledger
        self.idle_timeout_s = idle_timeout_s
        self.start_timeout_s = start_timeout_s
        self.runtime_env = dict(runtime_env or {})
        self.tags = itertools.count(1)
        self.host_class = ray.remote(InstanceHost)
        # A fresh worker per probe: a reused one can sit in a working_dir Ray has since removed and
        # unpacked again, where os.getcwd() fails with ENOENT.
        self.read_spec = ray.remote(max_calls=1)(read_spec_sync)
        self.deployments: list[RayDeployment] = []
        self.shipped: dict[Path, str] = {}  # snapshot folder -> its gcs:// package
        self.ship_plugtune = ship_plugtune
        self.plugtune_uri = ""  # plugtune's own gcs:// package, once shipped
        self.nodes: NodeCheck | None = None
        self.keeper: Any = None  # BudgetKeeper's actor, made with the first instance
        self.lost: Exception | None = None
        self.gcs_address: str = ray.get_runtime_context().gcs_address
        self.relay = self._policy_relay()
        self._last_health = time.monotonic()
        self._health: asyncio.Task[None] | None = None

    def _policy_relay(self) -> PolicyRelay | None:
        """A relay to loopback policies for the other nodes, unless the driver's node is loopback."""
        here = self.ray.get_runtime_context().get_node_id()
        [host] = [n["NodeManagerAddress"] for n in self.ray.nodes() if n["NodeID"] == here] or [""]
        if not host or is_loopback(host):
            return None
        return PolicyRelay(host, self._node_addresses)

    def _node_addresses(self) -> set[str]:
        return {str(n["NodeManagerAddress"]) for n in self.ray.nodes() if n.get("Alive")}

    async def deploy(self, request: DeployRequest) -> RayDeployment:
        await self._check_nodes()
        raw = await self._read_spec(request)
        spec = spec_from(raw)
        runtime = request.effective_runtime(spec.runtime)
        self._check_feasible(runtime)
        deployment = RayDeployment(self, request, spec, runtime)
        try:
            await deployment.start()
        except BaseException:
            await deployment.close()
            raise
        self.deployments.append(deployment)
        return deployment

    async def _read_spec(self, request: DeployRequest) -> dict[str, Any]:
        """Import the plugin once on a node (no CPU reserved) for its decorator's spec."""
        options = {"num_cpus": 0, "runtime_env": self._runtime_env(request), "max_retries": 0}
        try:
            ref = self.read_spec.options(**options).remote(_config(request), self.start_timeout_s)
            answer = await asyncio.wait_for(ref, self.start_timeout_s + 30)
        except asyncio.TimeoutError:
            raise DeployFailed(
                f"Ray did not run the plugin's import within {self.start_timeout_s:g} s"
            ) from None
        except Exception as exc:
            if not is_ray_error(exc):
                raise
            raise start_failed(exc) from None  # DeployFailed, or PlatformError for plugtune's own bug
        if "error" in answer:
            message, tb, logs = answer["error"]
            raise DeployFailed(message, tb, logs)
        return dict(answer["spec"])

    async def _check_nodes(self) -> None:
        """Every live node has what plugtune's instances need there (each node checked once)."""
        if self.nodes is None:
            env: dict[str, Any] = {k: v for k, v in self.runtime_env.items() if k == "env_vars"}
            if self.ship_plugtune:
                self.plugtune_uri = await asyncio.to_thread(ship_plugtune)
                env["py_modules"] = [self.plugtune_uri]
            self.nodes = NodeCheck(self.ray, env, self.ship_plugtune, self.start_timeout_s)
        await self.nodes.check()

    def _check_feasible(self, runtime: Runtime) -> None:
        """Ray would keep an actor no node can hold pending forever: say so now instead."""
        nodes = [n for n in self.ray.nodes() if n.get("Alive")]
        need_mem = runtime.memory_mb * MIB
        for node in nodes:
            resources = node.get("Resources", {})
            if resources.get("CPU", 0) >= runtime.cpu and resources.get("memory", 0) >= need_mem:
                return
        sizes = [(n["Resources"].get("CPU", 0), n["Resources"].get("memory", 0) / MIB) for n in nodes]
        largest = max(sizes, default=(0, 0))
        raise DeployFailed(
            f"infeasible on this Ray cluster: an instance asks for cpu={runtime.cpu:g} and "
            f"memory_mb={runtime.memory_mb}, and no node has that much (largest: {largest[0]:g} CPU, "
            f"{largest[1]:.0f} MiB); lower the plugin's Runtime or add a bigger node"
        )

    def _runtime_env(self, request: DeployRequest) -> dict[str, Any]:
        uri = self.shipped.get(request.code_root)
        if uri is None:
            uri = self.shipped[request.code_root] = ship(request.code_root)
        env = {**self.runtime_env, "working_dir": uri}
        if self.plugtune_uri:
            env["py_modules"] = [*env.get("py_modules", []), self.plugtune_uri]
        return env

    def new_actor(self, request: DeployRequest, runtime: Runtime) -> RayInstance:
        tag = f"r{next(self.tags)}"
        options = {
            "num_cpus": runtime.cpu,
            "memory": runtime.memory_mb * MIB,
            "scheduling_strategy": "SPREAD",
            "runtime_env": self._runtime_env(request),
            "max_restarts": 0,
            "max_concurrency": ACTOR_METHODS,
        }
        keeper = self._keeper() if request.dependencies or runtime.dependencies else None
        handle = self.host_class.options(**options).remote(
            tag,
            # job.yaml's dependencies (the node's bridge lets the instance reach them) and their budgets
            {**_config(request), "dependencies": list(request.dependencies), "keeper": keeper},
            runtime,
            self.start_timeout_s,
            self.idle_timeout_s,
        )
        return RayInstance(tag, handle)

    def _keeper(self) -> Any:
        """The actor that holds the job's dependency budgets for every actor (see ``keeper``)."""
        if self.keeper is None:
            options: dict[str, Any] = {"num_cpus": 0, "max_concurrency": KEEPER_CALLS, "max_restarts": 0}
            if self.plugtune_uri:
                options["runtime_env"] = {"py_modules": [self.plugtune_uri]}
            self.keeper = self.ray.remote(BudgetKeeper).options(**options).remote()
        return self.keeper

    def kill_actor(self, handle: Any) -> None:
        try:
            self.ray.kill(handle, no_restart=True)
        except Exception:  # noqa: BLE001, S110 - already gone
            pass

    def check_cluster(self) -> None:
        """Raise ``internal error`` when the cluster's head no longer answers (checked in background)."""
        if self.lost is not None:
            raise cluster_lost(self.address, self.lost)
        self.watch_head()

    def watch_head(self) -> None:
        """Check the head in the background every HEALTH_PERIOD_S; a lost one fails every call out."""
        now = time.monotonic()
        if self.lost is None and self._health is None and now - self._last_health > HEALTH_PERIOD_S:
            self._last_health = now
            self._health = asyncio.get_running_loop().create_task(self._check_head())

    async def confirm_head(self) -> None:
        """Raise ``internal error`` now if the head is gone: a call that Ray failed is the plugin's
        only while the cluster itself still answers."""
        if self.lost is None:
            if self._health is None:
                self._health = asyncio.get_running_loop().create_task(self._check_head())
            await asyncio.shield(self._health)
        self.check_cluster()

    async def reach_node(self, node_id: str) -> str:
        """Why the driver cannot reach the node's raylet ('' when it can, or the node is unknown)."""
        nodes = await asyncio.to_thread(self.ray.nodes)
        found = [n for n in nodes if n["NodeID"] == node_id]
        if not found:
            return ""
        address = f"{found[0]['NodeManagerAddress']}:{found[0]['NodeManagerPort']}"
        if not found[0].get("Alive"):
            return f"Ray lists its node ({address}) as dead"
        try:
            await asyncio.wait_for(asyncio.to_thread(_dial, address), DIAL_TIMEOUT_S + 1)
        except (OSError, asyncio.TimeoutError) as exc:
            return f"its node {address} is unreachable from the driver ({type(exc).__name__}: {exc})"
        return ""

    async def _check_head(self) -> None:
        try:  # a refused connection says "gone" at once; ray.nodes() alone retries for a minute
            await asyncio.wait_for(asyncio.to_thread(_dial, self.gcs_address), DIAL_TIMEOUT_S)
            await asyncio.wait_for(asyncio.to_thread(self.ray.nodes), HEALTH_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - any failure to reach the head means it is lost
            self.lost = (
                exc
                if not isinstance(exc, asyncio.TimeoutError)
                else TimeoutError(f"no answer from the head within {HEALTH_TIMEOUT_S:g} s")
            )
            log.error("the Ray head at %s is lost: %s", self.address, self.lost)
            error = cluster_lost(self.address, self.lost)
            for deployment in self.deployments:
                deployment.fail_all(error)
        finally:
            self._health = None

    async def close(self) -> None:
        for deployment in self.deployments:
            if not deployment.pool.closed:
                await deployment.close()
        if self._health is not None:
            self._health.cancel()
        if self.relay is not None:
            await self.relay.close()
        if self.keeper is not None:
            self.kill_actor(self.keeper)
            self.keeper = None


def _dial(address: str) -> None:
    host, _, port = address.rpartition(":")
    socket.create_connection((host.strip("[]"), int(port)), timeout=DIAL_TIMEOUT_S).close()


def _config(request: DeployRequest) -> dict[str, Any]:
    return {
        "entry": request.entry,
        "relpath": request.relpath,
        "function": request.function,
        "adapt": request.adapt,
        "env": dict(request.env),
    }
