"""The Ray actor that is one plugin instance: plugtune's own supervisor, run on the actor's node.

Ray places the actor (``num_cpus``, ``memory``) but its ``memory=`` only schedules, so the actor
does not run the plugin itself: it runs the local backend, which forks the project's worker as a
child process under a cgroup child (or rlimit + watchdog) on that node and talks the usual
Unix-socket protocol to it. Limits, timeouts, the event-loop watch and the failure facts are then
the same code as on the local backend; the actor only relays calls, logs and gauges.
"""

from __future__ import annotations

import asyncio
import os
import time
import traceback
from pathlib import Path
from typing import Any

from plugtune.runtime.backend import CallRequest, DeployFailed, DeployRequest, Failed, Returned
from plugtune.runtime.deployment import LocalDeployment
from plugtune.runtime.limits import Limits, detect, rlimits
from plugtune.runtime.local import LocalBackend
from plugtune.runtime.quota import Quota, QuotaLedger
from plugtune.runtime.ray.keeper import SharedBudgets, drain
from plugtune.runtime.sandbox import Sandbox
from plugtune.runtime.zygote_client import Zygote
from plugtune.sdk import Runtime
from plugtune.types import LogLine

Finished = tuple[str, "Returned | Failed | None", str]  # call id, outcome, or plugtune's own error

NO_QUOTA = Quota(max_functions=1, max_instances=4, total_memory_mb=1 << 26)  # the driver keeps the quota


class NodeBackend(LocalBackend):
    """The local backend inside one actor: instance ids carry the actor's tag (``r3-i1``)."""

    def __init__(self, tag: str, start_timeout_s: float, idle_timeout_s: float) -> None:
        super().__init__(
            detect(None),
            QuotaLedger(NO_QUOTA),
            use_zygote=True,
            idle_timeout_s=idle_timeout_s,
            spares=False,
            start_timeout_s=start_timeout_s,
        )
        self.tag = tag

    def next_instance_id(self) -> str:
        return f"{self.tag}-i{next(self.ids)}"


class InstanceHost:
    """One plugin instance on a Ray node (wrapped with ``ray.remote`` by the driver)."""

    def __init__(
        self,
        tag: str,
        config: dict[str, Any],
        runtime: Runtime,
        start_timeout_s: float,
        idle_timeout_s: float,
    ) -> None:
        self.tag = tag
        self.config = config
        # One worker process serves the actor; a worker that dies is replaced inside the same actor,
        # and a second may start while a stuck one drains (it stops after idle_timeout_s).
        self.runtime = runtime.replace(min_instances=1, max_instances=2)
        self.start_timeout_s = start_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.backend: NodeBackend | None = None
        self.deployment: LocalDeployment | None = None
        self.finished: list[Finished] = []
        self.finished_any = asyncio.Event()
        self.running: set[asyncio.Task[None]] = set()

    async def start(self) -> dict[str, Any]:
        """Start the worker; returns where it runs, or ``{"error": [message, traceback, logs]}``."""
        import ray

        self.backend = NodeBackend(self.tag, self.start_timeout_s, self.idle_timeout_s)
        if self.config.get("keeper") is not None:  # the job's dependency budgets, shared by every actor
            self.backend.budgets = SharedBudgets(self.config["keeper"])
        request = DeployRequest(
            entry=self.config["entry"],
            code_root=Path(os.getcwd()),  # Ray unpacked the snapshot here (runtime_env working_dir)
            relpath=self.config["relpath"],
            function=self.config["function"],
            runtime=self.runtime,
            env=dict(self.config["env"]),
            adapt=str(self.config.get("adapt") or ""),
            dependencies=tuple(self.config.get("dependencies") or ()),
        )
        try:
            self.deployment = await self.backend.deploy(request)
        except DeployFailed as exc:
            return {"error": [exc.message, exc.traceback, exc.logs]}
        context = ray.get_runtime_context()
        return {
            "node_id": context.get_node_id(),
            "limits": self.backend.limits_mechanism,
            "pid": os.getpid(),
        }

    async def exchange(self, batch: list[CallRequest]) -> tuple[list[Finished], list[LogLine]]:
        """Start ``batch``, wait until at least one call out has finished, and return every
        finished one with the log lines written since the last reply (the calls' among them)."""
        self._start(batch)
        await self.finished_any.wait()
        finished, self.finished = self.finished, []
        self.finished_any.clear()
        return finished, self._new_lines()

    async def submit(self, batch: list[CallRequest]) -> None:
        """Start ``batch``; its outcomes come back with a later exchange."""
        self._start(batch)

    def _start(self, batch: list[CallRequest]) -> None:
        for request in batch:
            task = asyncio.get_running_loop().create_task(self._run(request))
            self.running.add(task)
            task.add_done_callback(self.running.discard)

    async def _run(self, request: CallRequest) -> None:
        outcome = await self._outcome(request)
        self.finished.append(outcome)  # the list of now: an exchange may have taken the one of the start
        self.finished_any.set()

    async def _outcome(self, request: CallRequest) -> Finished:
        assert self.deployment is not None
        try:
            return request.call_id, await self.deployment.invoke(request), ""
        except Exception as exc:  # noqa: BLE001 - plugtune's own bug: the driver makes it an internal error
            return request.call_id, None, f"{type(exc).__name__}: {exc}"[:500]

    async def report(self) -> tuple[dict[str, float], list[LogLine], dict[str, dict[str, Any]]]:
        """The gauges now, the log lines written since the last reply (or report), and what the
        bridge's meters measured of the declared dependencies since the last report."""
        if self.deployment is None:
            return {}, [], {}
        bridge = self.deployment.bridge
        return self.deployment.sample(), self._new_lines(), drain(bridge.meters) if bridge else {}

    def _new_lines(self) -> list[LogLine]:
        assert self.deployment is not None
        lines = self.deployment.pool.log_lines
        new = list(lines)
        lines.clear()
        return new

    async def kill_worker(self) -> None:
        if self.deployment is not None:
            await self.deployment.kill()

    async def close(self) -> list[LogLine]:
        """Stop the worker and remove its limits; returns the last log lines."""
        lines: list[LogLine] = []
        if self.deployment is not None:
            await self.deployment.close()
            lines = list(self.deployment.pool.log_lines)
        if self.backend is not None:
            await self.backend.close()
        return lines


async def read_spec(config: dict[str, Any], start_timeout_s: float) -> dict[str, Any]:
    """Import the plugin in a worker process on a node (as the zygote does locally, in the same
    sandbox: its own uid, temp folder and mount namespace) and return its spec, or
    ``{"error": [message, traceback, logs]}`` when it cannot be imported."""
    sandbox = Sandbox(has_pids_cgroup=False)
    try:
        worker = {**config, **sandbox.prepare(Path(os.getcwd()), "spec", Runtime().tmp_mb)}
    except OSError as exc:
        sandbox.close()
        return {"error": [f"could not prepare the plugin's sandbox: {exc}", traceback.format_exc(), []]}
    # the import runs under the default instance's rlimits (its memory, open files, file size,
    # and processes where it has its own uid), as a local zygote's does
    asked = Runtime()
    data = Limits().instance("spec", asked.memory_mb, asked.cpu, asked.max_concurrency, asked.max_pids, None)
    own_uid = bool(worker.get("user"))
    worker["zygote_limits"] = {"rlimit_data": data.rlimit_data, "rlimits": rlimits(asked, own_uid, False)}
    zygote = Zygote(worker, config["entry"])
    try:
        raw = await zygote.start(start_timeout_s)
    except DeployFailed as exc:
        return {"error": [exc.message, exc.traceback, zygote.output_logs() + exc.logs]}
    finally:
        await zygote.aclose()
        sandbox.release(worker)
        sandbox.close()
    return {"spec": raw, "at": time.time()}


def read_spec_sync(config: dict[str, Any], start_timeout_s: float) -> dict[str, Any]:
    return asyncio.run(read_spec(config, start_timeout_s))
