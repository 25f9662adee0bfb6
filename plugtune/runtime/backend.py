"""The small interface every runtime backend implements (local processes now, Ray later).

A backend reports *what happened* with neutral records (:class:`Returned`, :class:`Failed` with a
:class:`Happened` fact); :mod:`plugtune.runtime.classify` alone turns those facts into the
failure taxonomy, so the taxonomy does not depend on how a backend notices a failure.
"""

from __future__ import annotations

import contextvars
import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from plugtune.runtime.dependencies import Dependency
from plugtune.sdk import PluginSpec, Runtime
from plugtune.types import LogLine, MetricPoint


class Happened(str, enum.Enum):
    """A fact about a failed call, as a backend observed it."""

    RAISED = "raised"  # the function raised (traceback attached)
    MEMORY_ERROR = "memory_error"  # the function raised MemoryError
    BAD_RETURN = "bad_return"  # the function returned something its kind cannot return
    DEADLINE = "deadline"  # the caller's deadline passed
    DIED = "died"  # the instance ended mid-call (exit, signal, lost connection)
    OOM_KILLED = "oom_killed"  # the instance was killed for going over its memory limit
    PIDS_LIMIT = "pids_limit"  # the instance hit its pids limit (fork/thread creation failed)
    DISK_FULL = "disk_full"  # the instance's private temp space is full (ENOSPC/EFBIG)
    NOT_CREATED = "not_created"  # no instance could be created (quota, import, setup, start-up)
    DEPENDENCY = "dependency"  # a service the function calls failed (429, 5xx, unreachable, ...)
    POLICY_REFUSED = "policy_refused"  # network policy-only refused a connection the function made


#: The instance a call should run on when it is still healthy and has a free slot (set by the job's
#: caller around a retry after a dependency failed: the instance is fine); "" for any.
PREFER_INSTANCE: contextvars.ContextVar[str] = contextvars.ContextVar("plugtune_prefer_instance", default="")


@dataclass(slots=True)
class CallRequest:
    call_id: str
    context: Any  # plugtune.sdk.Context
    args: tuple[Any, ...]
    timeout_s: float
    fault: str | None = None
    #: Run on this instance when it is still healthy and has a free slot (a call retried after its
    #: dependency failed: the instance is fine); any instance otherwise.
    prefer_instance: str = ""


@dataclass(slots=True)
class Returned:
    """The function returned; ``value`` is its encoded return value (see protocol.encode_result)."""

    value: Any
    metrics: dict[str, float]
    logs: list[LogLine]
    instance_id: str
    latency_ms: float


@dataclass(slots=True)
class Failed:
    happened: Happened
    message: str
    logs: list[LogLine] = field(default_factory=list)
    traceback: str = ""
    instance_id: str = ""
    peak_memory_mb: float | None = None
    latency_ms: float = 0.0
    cause: str = ""  # DEPENDENCY: "<DependencyCause>/<name>[/<Retry-After s>]"; POLICY_REFUSED: host:port


class DeployFailed(Exception):
    """The backend could not deploy the function; ``message`` says what the user must fix."""

    def __init__(self, message: str, traceback: str = "", logs: list[LogLine] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.traceback = traceback
        self.logs = logs or []
        self.intentional = False  # True when the runtime itself stopped the instance it was creating


@dataclass(frozen=True)
class DeployRequest:
    entry: str
    code_root: Path  # the snapshot folder
    relpath: str  # the module's path inside the code root
    function: str
    runtime: Runtime | dict[str, Any] | None  # a Runtime replaces the decorator's; a dict overrides fields
    env: dict[str, str]
    #: The services the plugin calls (job.yaml ``dependencies:``): reachable under policy-only.
    dependencies: tuple[Dependency, ...] = ()
    #: An undecorated TRL/verl reward function to adapt, as ``"<kind>/<shape>"`` (job.yaml's
    #: ``shape:``, e.g. ``"group_grader/trl"``; see :mod:`plugtune.sdk.shapes`), or "".
    adapt: str = ""

    def effective_runtime(self, decorator: Runtime) -> Runtime:
        """The limits instances get: the decorator's, replaced or overridden by the job's."""
        if isinstance(self.runtime, Runtime):
            return self.runtime
        return decorator.replace(**self.runtime) if self.runtime else decorator


class Deployment(Protocol):
    """One deployed function as a backend tracks it."""

    spec: PluginSpec
    runtime: Runtime

    async def invoke(self, request: CallRequest) -> Returned | Failed: ...

    async def scale(self, instances: int) -> None: ...

    async def kill(self, instance_id: str | None = None) -> None: ...

    def sample(self) -> dict[str, float]: ...

    def logs(self) -> list[LogLine]: ...

    async def close(self) -> None: ...


class Backend(Protocol):
    limits_mechanism: str

    async def deploy(self, request: DeployRequest) -> Deployment: ...

    async def close(self) -> None: ...


__all__ = [
    "Backend",
    "CallRequest",
    "DeployFailed",
    "DeployRequest",
    "Deployment",
    "Failed",
    "Happened",
    "LogLine",
    "MetricPoint",
    "Returned",
]
