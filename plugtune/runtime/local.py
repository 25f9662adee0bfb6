"""The local-process backend: each instance is a limited process forked from the function's zygote."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import psutil

from plugtune.runtime.backend import DeployFailed, DeployRequest
from plugtune.runtime.bridge import PolicyBridge, network_problem
from plugtune.runtime.budget import Budgets
from plugtune.runtime.dependencies import Dependency, parse_dependencies, wire
from plugtune.runtime.deployment import LocalDeployment
from plugtune.runtime.limits import RLIMIT, InstanceLimits, Limits, pids_max, rlimits
from plugtune.runtime.monitor import ProcessTable
from plugtune.runtime.quota import QuotaExceeded, QuotaLedger
from plugtune.runtime.sandbox import Sandbox, requested_tmp_mb
from plugtune.runtime.worker.network import ANY, POLICY_ONLY
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
        self.network_problems: dict[str, str | None] = {}  # mode -> why this host cannot give it
        self.sandbox = Sandbox(limits.has_pids)
        self.isolation = self.sandbox.isolation
        self.functions = itertools.count(1)
        self.zygotes = itertools.count(1)
        self.processes = ProcessTable()  # the process watch's view, where no pids cgroup counts
        self.unremoved: list[InstanceLimits] = []  # cgroups of ended instances still holding a process
        self.budgets = Budgets()  # the declared dependencies' rpm/concurrency, shared by all functions

    async def deploy(self, request: DeployRequest) -> LocalDeployment:
        config = self.sandboxed(request)
        # The network is entered before the plugin is imported, so before its decorator's Runtime is
        # known: the job's setting, else the default; a decorator asking otherwise costs a restart.
        # The zygote's limits, too: its import runs under the job's (else the default) limits, and
        # under the decorator's once known (started again where they allow more than it had). A
        # decorator that declares dependencies the job does not costs a restart too (the instances'
        # network is made for them).
        bridge = PolicyBridge(lambda level, text: None, self.budgets)
        bridge.declare(request.dependencies)
        config["dependencies"] = wire(request.dependencies)
        asked = request.effective_runtime(Runtime())
        try:
            zygote, raw = await self._start_zygote(config, request.entry, asked, bridge)
            spec = spec_from(raw)
            runtime = request.effective_runtime(spec.runtime)
            declared = _with_decorators(request.dependencies, spec.runtime)
            if declared != request.dependencies:  # the decorator names more: the instances must know
                bridge.declare(declared)
                config["dependencies"] = wire(declared)
            if (
                runtime.network != asked.network
                or self._allows_more(runtime, asked)
                or declared != request.dependencies
            ):
                await zygote.aclose()
                zygote, raw = await self._start_zygote(config, request.entry, runtime, bridge)
            else:
                await _hold_zygote(zygote, runtime)
        except BaseException:
            await bridge.close()
            self.release(config)
            raise
        machine_mb = psutil.virtual_memory().total >> 20
        if runtime.memory_mb > machine_mb:
            await zygote.aclose()
            await bridge.close()
            self.release(config)
            raise DeployFailed(
                f"memory_mb={runtime.memory_mb} is more than this machine has ({machine_mb} MiB)"
            )
        self.deployments = [d for d in self.deployments if not d.pool.closed]
        deployment = LocalDeployment(
            self, request, spec, runtime, zygote if self.use_zygote else None, config
        )
        deployment.bridge = bridge if runtime.network == POLICY_ONLY else None
        bridge.log = deployment.runtime_log
        if deployment.bridge is None:
            await bridge.close()
        if not self.use_zygote:
            await zygote.aclose()
        try:
            await deployment.start()
        except BaseException:
            await deployment.close()
            raise
        self.deployments.append(deployment)
        return deployment

    async def _start_zygote(
        self, config: dict[str, Any], entry: str, runtime: Runtime, bridge: PolicyBridge
    ) -> tuple[Zygote, dict[str, Any]]:
        """Start the function's zygote in ``runtime``'s network and limits; raises DeployFailed."""
        mode = runtime.network
        if mode != ANY:
            if mode not in self.network_problems:
                self.network_problems[mode] = await network_problem(mode)
            problem = self.network_problems[mode]
            if problem:
                raise DeployFailed(problem)
        network: dict[str, Any] = {"mode": mode}
        if mode == POLICY_ONLY:
            network["bridge"] = bridge.path or await bridge.start()
            network["dependencies"] = config.get("dependencies") or []
        config["network"] = network
        limits = self._zygote_limits(config, runtime)
        zygote = Zygote(config, entry, limits)
        try:
            return zygote, await zygote.start(self.start_timeout_s)
        except DeployFailed as exc:
            exc.logs = zygote.output_logs() + exc.logs
            exc.message = _import_memory(exc.message, limits, runtime)
            await zygote.aclose()
            raise

    def _zygote_limits(self, config: dict[str, Any], runtime: Runtime) -> InstanceLimits:
        """The zygote's own cgroup and rlimits: its instances' (the module's code runs in it)."""
        user = config.get("user")
        name = f"{Path(config['tmp_dir']).name}-{next(self.zygotes)}"
        try:
            limits = self.limits.instance(
                name, runtime.memory_mb, runtime.cpu, runtime.max_concurrency, runtime.max_pids, None
            )
        except OSError as exc:
            raise DeployFailed(f"could not create the plugin's zygote cgroup: {exc}") from None
        try:
            limits.set_limits(runtime.memory_mb, _zygote_pids(runtime))
        except OSError as exc:
            limits.remove()
            raise DeployFailed(f"could not set the plugin's zygote cgroup's limits: {exc}") from None
        config["zygote_limits"] = {
            "cgroup_procs": limits.cgroup_procs,
            "rlimit_data": limits.rlimit_data,
            "rlimits": rlimits(runtime, bool(user), self.limits.has_pids),
        }
        return limits

    def _allows_more(self, runtime: Runtime, had: Runtime) -> bool:
        """Whether ``runtime``'s instances may have an rlimit above the zygote's (an instance cannot
        raise one its zygote lowered), started with ``had``'s."""
        own_uid, pids = self.sandbox.is_root, self.limits.has_pids
        wanted, given = rlimits(runtime, own_uid, pids), rlimits(had, own_uid, pids)
        if any(value > given.get(name, value - 1) for name, value in wanted.items()):
            return True
        return self.limits.mechanism == RLIMIT and runtime.memory_mb > had.memory_mb

    def sandboxed(self, request: DeployRequest) -> dict[str, Any]:
        """The function's worker config: its sandbox (see :meth:`Sandbox.prepare`) and its entry."""
        try:
            name, tmp_mb = f"f{next(self.functions)}", requested_tmp_mb(request.runtime)
            sandbox = self.sandbox.prepare(request.code_root, name, tmp_mb)
        except OSError as exc:
            raise DeployFailed(f"could not prepare the plugin's sandbox: {exc}") from None
        return {
            **sandbox,
            "relpath": request.relpath,
            "function": request.function,
            "adapt": request.adapt,
            "env": dict(request.env),
        }

    def release(self, config: dict[str, Any]) -> None:
        """Give back what :meth:`sandboxed` took (the function was closed or never started)."""
        self.sandbox.release(config)

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

    def retry_removals(self) -> None:
        """Kill what is left in ended instances' cgroups and remove them (called by housekeeping)."""
        left = []
        for limits in self.unremoved:
            limits.kill_all()
            if not limits.remove():
                left.append(limits)
        self.unremoved = left

    async def close(self) -> None:
        self.retry_removals()
        self.limits.close()
        self.sandbox.close()


def _import_memory(message: str, limits: InstanceLimits, runtime: Runtime) -> str:
    """A failed import's message, saying so when it went over memory_mb (killed, or MemoryError)."""
    over = f"importing the plugin went over memory_mb={runtime.memory_mb}"
    why = (
        "module-level code runs under the function's limits (while importing: job.yaml's "
        f"runtime.memory_mb, else the default {Runtime().memory_mb}); allocate less at import "
        "(in setup() or the first call), or raise memory_mb"
    )
    if limits.oom_kills() > 0:
        peak = limits.peak_mb()
        return f"{over}: the kernel killed it{f' at {peak:.0f} MiB' if peak else ''}; {why}"
    if "MemoryError" in message:
        return f"{message.rstrip(': ')} ({over}); {why}"
    return message


def _zygote_pids(runtime: Runtime) -> int:
    """An instance's pids limit, plus room for the instances it forked that have not yet moved to
    their own cgroups."""
    return pids_max(runtime.max_pids, runtime.max_concurrency) + runtime.max_instances + 2


def _with_decorators(declared: tuple[Dependency, ...], runtime: Runtime) -> tuple[Dependency, ...]:
    """The job's dependencies plus those the plugin's decorator names (the job's win on a name);
    raises DeployFailed when the decorator's are malformed."""
    if not runtime.dependencies:
        return declared
    try:
        own = parse_dependencies(runtime.dependencies)
    except ValueError as exc:
        raise DeployFailed(f"Runtime.dependencies: {exc}") from None
    names = {d.name for d in declared}
    return declared + tuple(d for d in own if d.name not in names)


async def _hold_zygote(zygote: Zygote, runtime: Runtime) -> None:
    """The decorator's memory and pids limits on the zygote (its import ran under the job's)."""
    if zygote.limits is None:
        return
    try:
        zygote.limits.set_limits(runtime.memory_mb, _zygote_pids(runtime))
    except OSError as exc:
        await zygote.aclose()
        raise DeployFailed(
            f"the plugin's zygote could not be held to memory_mb={runtime.memory_mb} "
            f"max_pids={runtime.max_pids} ({exc.strerror}): its module-level code uses more"
        ) from None
