"""``LocalRuntime`` and the deploy steps every runtime shares (entry, snapshot, quota, errors)."""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import psutil

from plugtune.errors import Cause, PluginCallError
from plugtune.runtime.backend import Backend, DeployFailed, DeployRequest
from plugtune.runtime.classify import call_error
from plugtune.runtime.dependencies import Dependency, parse_dependencies
from plugtune.runtime.faults import FaultInjection
from plugtune.runtime.function import RUNNING, Function
from plugtune.runtime.limits import detect
from plugtune.runtime.local import LocalBackend
from plugtune.runtime.quota import Quota, QuotaLedger, how_to_raise
from plugtune.runtime.sandbox import Isolation
from plugtune.runtime.snapshot import SnapshotError, take
from plugtune.sdk import Runtime
from plugtune.sdk.shapes import SHAPES

log = logging.getLogger(__name__)

R = TypeVar("R", bound="BaseRuntime")


def parse_entry(entry: str, label: str = "") -> tuple[Path, str]:
    """``"path/to/file.py:function"`` -> (path, function); raises a Create faas fault naming the plugin
    ``label`` (else the entry) when malformed."""
    if not isinstance(entry, str) or ":" not in entry:
        raise create_fault(label or entry, f"entry {entry!r} must look like 'path/to/file.py:function'")
    path, _, function = entry.rpartition(":")
    if not path or not function.isidentifier():
        raise create_fault(label or entry, f"entry {entry!r} must look like 'path/to/file.py:function'")
    return Path(path), function


def create_fault(
    entry: Any, message: str, traceback: str = "", logs: list[Any] | None = None
) -> PluginCallError:
    return call_error(Cause.CREATE_FAULT, message, plugin=str(entry), traceback=traceback, logs=logs)


class BaseRuntime:
    """Deploys plugins onto a backend; use as ``async with``."""

    def __init__(self, quota: Quota | None, state_dir: Path | None, metrics_period_s: float) -> None:
        if quota is not None and not isinstance(quota, Quota):
            raise TypeError(f"quota must be a plugtune.runtime.Quota, got {type(quota).__name__}")
        if not 0 < metrics_period_s <= 10:
            raise ValueError(f"metrics_period_s={metrics_period_s} must be in (0, 10]")
        self.quota = quota or Quota()
        self.ledger = QuotaLedger(self.quota)
        self.metrics_period_s = metrics_period_s
        self._own_state = state_dir is None
        self.state_dir = (
            Path(state_dir) if state_dir is not None else Path(tempfile.mkdtemp(prefix="plugtune-rt-"))
        )
        self.functions: list[Function] = []
        self.backend: Backend | None = None

    async def __aenter__(self: R) -> R:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start(self) -> None:
        raise NotImplementedError

    @property
    def limits_mechanism(self) -> str:
        return self.backend.limits_mechanism if self.backend is not None else ""

    async def deploy(
        self,
        entry: str,
        runtime: Runtime | dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        inject: FaultInjection | None = None,
        dependencies: Mapping[str, Any] | Iterable[Dependency] | None = None,
        name: str = "",
        shape: str = "",
        group: bool = False,
    ) -> Function:
        """Snapshot the entry's folder and start the function; raises ``PluginCallError`` (Create faas
        fault) naming what is wrong when it cannot.

        ``runtime``: a ``Runtime`` replaces the decorator's; a dict (job.yaml's settings) overrides
        only the fields it names. ``dependencies``: the services the plugin calls, as job.yaml's
        ``dependencies:`` (``{"judge": "http://127.0.0.1:8000/v1"}`` or ``{"judge": {"url": ...,
        "rpm": 600}}``): under ``network: policy-only`` the instances reach these and the policy
        only; raises ValueError when one is malformed. ``name``: what the job calls the plugin
        (job.yaml's name); its errors, from deploying it on, name it so (else by its entry).
        ``shape``: the entry is an undecorated TRL or verl reward function (``"trl"``, ``"trl-text"``,
        ``"verl"``), adapted as ``@grader(shape=...)`` (``@group_grader`` with ``group``) would."""
        if self.backend is None:
            raise RuntimeError("use the runtime as `async with ...` (or await start()) before deploy()")
        label = name or entry
        path, function = parse_entry(entry, label)
        _check_options(runtime, env, inject)
        if dependencies is None or isinstance(dependencies, Mapping):
            declared = parse_dependencies(dependencies)
        else:
            declared = tuple(dependencies)
        live = [f for f in self.functions if f.status == RUNNING]
        if len(live) >= self.quota.max_functions:
            raise create_fault(
                label,
                f"quota exceeded: {len(live)} functions are deployed "
                f"(max_functions={self.quota.max_functions}: {how_to_raise('max_functions')})",
            )
        if isinstance(runtime, Runtime):
            self._check_memory(label, runtime)
        try:
            snapshot = take(path, self.state_dir)
        except (SnapshotError, OSError) as exc:
            raise create_fault(label, str(exc)) from None
        if shape and shape not in SHAPES:
            raise ValueError(f"shape={shape!r}: use one of {', '.join(SHAPES)}")
        adapt = f"{'group_grader' if group else 'grader'}/{shape}" if shape else ""
        request = DeployRequest(
            entry, snapshot.root, snapshot.relpath, function, runtime, dict(env or {}), declared, adapt
        )
        try:
            deployment = await self.backend.deploy(request)
        except DeployFailed as exc:
            raise create_fault(label, exc.message, exc.traceback, exc.logs) from None
        fn = Function(entry, deployment, snapshot, inject, self.metrics_period_s, name)
        if inject is not None and inject.dependency_faults:
            bridge = getattr(deployment, "bridge", None)  # the local backend's policy-only relay
            if bridge is None:
                await fn.close()
                raise ValueError(
                    f"{entry}: dependency faults are injected in the relay of `network: policy-only` "
                    f"on the local backend; this function runs with network: {fn.runtime.network} on "
                    f"{type(self).__name__}"
                )
            bridge.inject = inject
        self.functions.append(fn)
        log.info("deployed %s (code %s, limits %s)", entry, snapshot.code_hash[:12], self.limits_mechanism)
        return fn

    def _check_memory(self, entry: str, runtime: Runtime) -> None:
        total = psutil.virtual_memory().total >> 20
        if runtime.memory_mb > total:
            raise create_fault(
                entry, f"memory_mb={runtime.memory_mb} is more than this machine has ({total} MiB)"
            )
        if runtime.memory_mb > self.quota.total_memory_mb:
            raise create_fault(
                entry,
                f"quota exceeded: memory_mb={runtime.memory_mb} is more than the runtime's "
                f"total_memory_mb={self.quota.total_memory_mb} ({how_to_raise('total_memory_mb')})",
            )

    async def close(self) -> None:
        for fn in self.functions:
            await fn.close()
        self.functions.clear()
        if self.backend is not None:
            await self.backend.close()
        if self._own_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)


def _check_options(runtime: Any, env: Any, inject: Any) -> None:
    if isinstance(runtime, dict):
        try:
            Runtime().replace(**runtime)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"runtime overrides {runtime!r}: {exc}") from None
    elif runtime is not None and not isinstance(runtime, Runtime):
        raise TypeError(
            f"runtime must be a plugtune.Runtime or a dict of overrides, got {type(runtime).__name__}"
        )
    if env is not None and (
        not isinstance(env, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        raise TypeError("env must be a dict of str -> str")
    if inject is not None and not isinstance(inject, FaultInjection):
        raise TypeError(f"inject must be a FaultInjection, got {type(inject).__name__}")


class LocalRuntime(BaseRuntime):
    """The function runtime on this machine: each instance is a limited local process.

    ``limits``: None (auto), "cgroup" or "rlimit" (forces RLIMIT_DATA + the RSS watchdog).
    ``metrics_period_s``: how often metrics are sampled (<= 10 s).
    ``idle_timeout_s``: an idle instance above ``min_instances`` is stopped after this long.
    ``use_zygote``: fork instances from a pre-warmed zygote (False: fresh spawn each time).
    ``start_timeout_s``: how long importing the plugin, or an instance's ``setup()``, may take.
    ``spare_instances``: keep one ready instance per function that can still scale up, handed out
    on the next scale-up (it counts against the quota, and yields when quota is needed).
    """

    def __init__(
        self,
        quota: Quota | None = None,
        state_dir: Path | None = None,
        *,
        limits: str | None = None,
        metrics_period_s: float = 5.0,
        idle_timeout_s: float = 60.0,
        use_zygote: bool = True,
        spare_instances: bool = True,
        start_timeout_s: float = 120.0,
    ) -> None:
        super().__init__(quota, state_dir, metrics_period_s)
        self.spare_instances = spare_instances
        if limits not in (None, "cgroup", "rlimit"):
            raise ValueError(f"limits={limits!r}: use 'cgroup', 'rlimit' or None (auto)")
        if not idle_timeout_s > 0:
            raise ValueError(f"idle_timeout_s={idle_timeout_s} must be > 0")
        if not 0 < start_timeout_s <= 3600:
            raise ValueError(f"start_timeout_s={start_timeout_s} must be in (0, 3600]")
        self.start_timeout_s = start_timeout_s
        self._limits_choice = limits
        self.idle_timeout_s = idle_timeout_s
        self.use_zygote = use_zygote

    @property
    def isolation(self) -> Isolation:
        """What each instance is held to: its user, temp space, pids limit, environment."""
        if not isinstance(self.backend, LocalBackend):
            raise RuntimeError("use the runtime as `async with ...` (or await start()) first")
        return self.backend.isolation

    async def start(self) -> None:
        if self.backend is None:
            self.backend = LocalBackend(
                detect(self._limits_choice),
                self.ledger,
                use_zygote=self.use_zygote,
                idle_timeout_s=self.idle_timeout_s,
                spares=self.spare_instances,
                start_timeout_s=self.start_timeout_s,
            )
