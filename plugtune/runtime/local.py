"""The local-process backend: each instance is a limited process forked from the function's zygote."""

from __future__ import annotations

import itertools
from typing import Any

import psutil

from plugtune.runtime.backend import DeployFailed, DeployRequest
from plugtune.runtime.deployment import LocalDeployment
from plugtune.runtime.limits import Limits
from plugtune.runtime.quota import QuotaExceeded, QuotaLedger
from plugtune.runtime.zygote_client import Zygote
from plugtune.sdk import Kind, PluginSpec, Runtime


def spec_from(raw: dict[str, Any]) -> PluginSpec:
    return PluginSpec(
        kind=Kind(raw["kind"]),
        name=raw["name"],
        runtime=Runtime(**raw["runtime"]),
        weight=float(raw["weight"]),
        is_async=bool(raw["is_async"]),
    )


class LocalBackend:
    """Runs each instance as a local process under this runtime's limits."""

    def __init__(
        self,
        limits: Limits,
        ledger: QuotaLedger,
        *,
        use_zygote: bool = True,
        idle_timeout_s: float = 60.0,
        watchdog_period_s: float = 0.05,
        spares: bool = True,
        start_timeout_s: float = 120.0,
    ) -> None:
        self.limits = limits
        self.limits_mechanism = limits.mechanism
        self.ledger = ledger
        self.use_zygote = use_zygote
        self.idle_timeout_s = idle_timeout_s
        self.watchdog_period_s = watchdog_period_s
        self.ids = itertools.count(1)
        self.spares = spares
        self.start_timeout_s = start_timeout_s
        self.deployments: list[LocalDeployment] = []

    async def deploy(self, request: DeployRequest) -> LocalDeployment:
        config = {
            "code_root": str(request.code_root),
            "relpath": request.relpath,
            "function": request.function,
            "env": dict(request.env),
        }
        zygote = Zygote(config, request.entry)
        try:
            raw = await zygote.start(self.start_timeout_s)
        except DeployFailed as exc:
            exc.logs = zygote.output_logs() + exc.logs
            await zygote.aclose()
            raise
        spec = spec_from(raw)
        runtime = request.effective_runtime(spec.runtime)
        machine_mb = psutil.virtual_memory().total >> 20
        if runtime.memory_mb > machine_mb:
            await zygote.aclose()
            raise DeployFailed(
                f"memory_mb={runtime.memory_mb} is more than this machine has ({machine_mb} MiB)"
            )
        self.deployments = [d for d in self.deployments if not d.closed]
        deployment = LocalDeployment(
            self, request, spec, runtime, zygote if self.use_zygote else None, config
        )
        if not self.use_zygote:
            await zygote.aclose()
        try:
            await deployment.start()
        except BaseException:
            await deployment.close()
            raise
        self.deployments.append(deployment)
        return deployment

    def reserve(self, memory_mb: int) -> None:
        """Reserve quota for an instance; spare instances give theirs up first."""
        try:
            self.ledger.reserve(memory_mb)
        except QuotaExceeded:
            for deployment in self.deployments:
                deployment.drop_spare("its quota is needed by a serving instance")
            self.ledger.reserve(memory_mb)

    def next_instance_id(self) -> str:
        return f"i{next(self.ids)}"

    async def close(self) -> None:
        self.limits.close()
