"""``Runtime``: the resources one plugin's instances get."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

#: Upper bounds that catch typos (``memory_mb=20480000``) before they reach the runtime.
LIMITS: dict[str, tuple[float, float]] = {
    "memory_mb": (16, 262_144),
    "timeout_s": (0.01, 86_400),
    "max_concurrency": (1, 10_000),
    "min_instances": (0, 1_000),
    "max_instances": (1, 1_000),
    "cpu": (0.01, 256),
    "tmp_mb": (1, 1_048_576),
    "max_pids": (1, 1_000_000),
}

#: ``Runtime.network``: no network; only the policy gateway; the host's network unrestricted.
NETWORKS = ("none", "policy-only", "any")


@dataclass(frozen=True)
class Runtime:
    """Resources and scaling of a plugin's instances.

    memory_mb: memory limit per instance; going over it is ``FaaS OOM``.
    timeout_s: wall-clock limit per call; going over it is ``Timeout``.
    max_concurrency: calls one instance runs at once (event-loop tasks for ``async def``,
        threads for sync functions). A sync function with 1 runs every call on the instance's
        main thread (signal-based timeouts work); with more, every call runs on a pool thread.
    min_instances / max_instances: the autoscaler's bounds.
    cpu: CPU quota per instance in cores, where the host lets the runtime set one.
    network: what the instances can reach: ``"policy-only"`` (the default: the policy gateway
        the rollout is given and the services declared as the job's dependencies (job.yaml
        ``dependencies:``, or ``deploy(..., dependencies=...)``), nothing else — no other port of
        this host, no internet),
        ``"none"`` (only the instance's own loopback) or ``"any"`` (the host's network).
    tmp_mb: size of the instance's private temp space ($TMPDIR and $HOME, removed when the
        instance ends); filling it is ``FaaS disk limit``.
    max_pids: processes and threads the plugin's code may start in one instance (on top of one
        per ``max_concurrency`` the runtime itself uses); going over it is ``FaaS pids limit``.
    dependencies: the services this plugin calls, as job.yaml's ``dependencies:`` (``{"judge":
        "http://127.0.0.1:8000/v1"}`` or ``{"judge": {"url": ..., "rpm": 600}}``): under
        ``policy-only`` its instances reach them at their own URL; a call that fails on one is a
        ``Dependency error``. The job's ``dependencies:`` add to these (the job's win on a name).
    """

    memory_mb: int = 1024
    timeout_s: float = 60.0
    max_concurrency: int = 8
    min_instances: int = 0
    max_instances: int = 4
    cpu: float = 1.0
    network: str = "policy-only"
    tmp_mb: int = 512
    max_pids: int = 256
    dependencies: Mapping[str, Any] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        for problem in self.problems():
            raise ValueError(problem)

    def problems(self) -> list[str]:
        out: list[str] = []
        if self.network not in NETWORKS:
            out.append(f"Runtime.network={self.network!r} must be one of: {', '.join(NETWORKS)}")
        if self.dependencies is not None and not (
            isinstance(self.dependencies, Mapping)
            and all(
                isinstance(k, str) and isinstance(v, (str, Mapping)) for k, v in self.dependencies.items()
            )
        ):
            out.append(
                f"Runtime.dependencies={self.dependencies!r} must map names to a URL or host:port "
                "(or to {'url': ..., 'rpm': ...})"
            )
        for f in fields(self):
            if f.name not in LIMITS:
                continue
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                out.append(f"Runtime.{f.name} must be a number, got {value!r}")
                continue
            if f.type in ("int",) and not isinstance(value, int):
                out.append(f"Runtime.{f.name} must be a whole number, got {value!r}")
                continue
            lo, hi = LIMITS[f.name]
            if not lo <= value <= hi:
                out.append(f"Runtime.{f.name}={value!r} is outside the allowed range {lo:g}..{hi:g}")
        if not out and self.min_instances > self.max_instances:
            out.append(
                f"Runtime.min_instances={self.min_instances} is larger than "
                f"max_instances={self.max_instances}"
            )
        return out

    def replace(self, **overrides: Any) -> Runtime:
        """A copy with the given fields changed (job.yaml overrides the decorator)."""
        unknown = set(overrides) - {f.name for f in fields(self)}
        if unknown:
            raise ValueError(f"unknown Runtime field(s): {', '.join(sorted(unknown))}")
        return Runtime(**{**asdict(self), **overrides})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
