"""The function runtime: deploy plugins, call them under limits, classify every failure.

``LocalRuntime`` runs each instance as a resource-limited local process (forked from a
per-function zygote); ``RayRuntime`` runs each as a Ray actor on a cluster (the same limits,
enforced by plugtune's worker on the actor's node); ``InProcessRuntime`` runs plugins inside the
caller for fast local tests. Exports are loaded lazily so that worker processes, which import
``plugtune.runtime.worker``, stay light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from plugtune.runtime.choice import runtime_for
    from plugtune.runtime.faults import FaultInjection
    from plugtune.runtime.function import Function
    from plugtune.runtime.inprocess import InProcessRuntime
    from plugtune.runtime.quota import Quota
    from plugtune.runtime.ray import RayRuntime
    from plugtune.runtime.runtime import LocalRuntime

_EXPORTS = {
    "FaultInjection": "plugtune.runtime.faults",
    "Function": "plugtune.runtime.function",
    "InProcessRuntime": "plugtune.runtime.inprocess",
    "LocalRuntime": "plugtune.runtime.runtime",
    "Quota": "plugtune.runtime.quota",
    "RayRuntime": "plugtune.runtime.ray",
    "runtime_for": "plugtune.runtime.choice",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'plugtune.runtime' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "FaultInjection",
    "Function",
    "InProcessRuntime",
    "LocalRuntime",
    "Quota",
    "RayRuntime",
    "runtime_for",
]
