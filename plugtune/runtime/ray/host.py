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
from pathlib import Path
from typing import Any

from plugtune.runtime.backend import CallRequest, DeployFailed, DeployRequest, Failed, Returned
from plugtune.runtime.deployment import LocalDeployment
from plugtune.runtime.limits import detect
from plugtune.runtime.local import LocalBackend
from plugtune.runtime.quota import Quota, QuotaLedger
from plugtune.runtime.sandbox import Sandbox
from plugtune.runtime.zygote_client import Zygote
from plugtune.sdk import Runtime
from plugtune.types import LogLine

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
        self.sent_logs = 0

    async def start(self) -> dict[str, Any]:
        """Start the worker; returns where it runs, or ``{"error": [message, traceback, logs]}``."""
        import ray

        self.backend = NodeBackend(self.tag, self.start_timeout_s, self.idle_timeout_s)
        request = DeployRequest(
            entry=self.config["entry"],
            code_root=Path(os.getcwd()),  # Ray unpacked the snapshot here (runtime_env working_dir)
            relpath=self.config["relpath"],
            function=self.config["function"],
            runtime=self.runtime,
            env=dict(self.config["env"]),
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

    async def invoke(self, request: CallRequest) -> tuple[Returned | Failed, list[LogLine]]:
        """The call's outcome, and the log lines written since the last reply (the call's among
        them), so the driver has a call's lines by the time it has its outcome."""
        assert self.deployment is not None
        outcome = await self.deployment.invoke(request)
        return outcome, self._new_lines()

    async def report(self) -> tuple[dict[str, float], list[LogLine]]:
        """The gauges now and the log lines written since the last reply."""
        if self.deployment is None:
            return {}, []
        return self.deployment.sample(), self._new_lines()

    def _new_lines(self) -> list[LogLine]:
        assert self.deployment is not None
        lines = self.deployment.log_lines
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
            lines = list(self.deployment.log_lines)
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
        return {"error": [f"could not prepare the plugin's sandbox: {exc}", "", []]}
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
