"""``runtime_for``: the runtime of a backend's name (job.yaml's ``plugins.runtime_backend``)."""

from __future__ import annotations

from pathlib import Path

from plugtune.runtime.quota import Quota
from plugtune.runtime.runtime import BaseRuntime, LocalRuntime

BACKENDS = ("local", "ray")


def runtime_for(
    backend: str,
    ray_address: str | None = None,
    quota: Quota | None = None,
    state_dir: Path | None = None,
    metrics_period_s: float = 5.0,
) -> BaseRuntime:
    """The runtime of job.yaml's ``plugins.runtime_backend``: ``local`` processes or ``ray`` actors
    (on the cluster at ``ray_address``; None: a local Ray head started for this runtime)."""
    if backend == "ray":
        from plugtune.runtime.ray import RayRuntime

        return RayRuntime(ray_address, quota, state_dir, metrics_period_s=metrics_period_s)
    if backend == "local":
        return LocalRuntime(quota, state_dir, metrics_period_s=metrics_period_s)
    raise ValueError(f"runtime backend {backend!r}: use one of {', '.join(BACKENDS)}")
