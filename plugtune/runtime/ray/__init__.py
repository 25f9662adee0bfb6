"""The function runtime's Ray backend (``pip install -e '.[ray]'``): instances are Ray actors.

Imported lazily: nothing here imports Ray until a ``RayRuntime`` starts.
"""

from __future__ import annotations

from plugtune.runtime.ray.cluster import LocalCluster, RayUnavailable
from plugtune.runtime.ray.runtime import RayRuntime

__all__ = ["LocalCluster", "RayRuntime", "RayUnavailable"]
