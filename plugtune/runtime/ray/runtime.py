"""``RayRuntime``: ``LocalRuntime``'s sibling whose instances are Ray actors on a cluster."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from plugtune.runtime.quota import Quota
from plugtune.runtime.ray.backend import RayBackend
from plugtune.runtime.ray.cluster import connect, disconnect
from plugtune.runtime.runtime import BaseRuntime


class RayRuntime(BaseRuntime):
    """The function runtime on a Ray cluster: each instance is an actor placed by Ray, its limits
    and deadlines enforced by plugtune's worker on the actor's node.

    ``address``: the cluster's head (``host:port`` or ``auto``); None starts a local Ray head for
    this runtime (stopped on close). ``idle_timeout_s``, ``start_timeout_s``, ``metrics_period_s``:
    as for ``LocalRuntime``. ``runtime_env``: more of Ray's ``runtime_env`` for every actor
    (``env_vars``, ``pip``, ...; plugtune sets ``working_dir`` to the snapshot itself); one that a
    node cannot set up is a ``Create faas fault`` with Ray's reason. ``ship_plugtune``: send this
    process's plugtune package to the nodes with every actor (Ray ``py_modules``), so a node needs
    only the driver's Python and Ray; off, each node must have the driver's plugtune version
    installed (default: on, unless ``PLUGTUNE_RAY_SHIP_PLUGTUNE=0``). Before the first deploy every
    node is checked for what it needs; one that lacks a piece is a ``Create faas fault`` naming the
    node and the piece. Raises ``RayUnavailable`` when Ray is missing or the head cannot be reached.
    """

    def __init__(
        self,
        address: str | None = None,
        quota: Quota | None = None,
        state_dir: Path | None = None,
        *,
        metrics_period_s: float = 5.0,
        idle_timeout_s: float = 60.0,
        start_timeout_s: float = 120.0,
        runtime_env: dict[str, Any] | None = None,
        ship_plugtune: bool | None = None,
    ) -> None:
        super().__init__(quota, state_dir, metrics_period_s)
        if runtime_env is not None and "working_dir" in runtime_env:
            raise ValueError("runtime_env: leave out working_dir, plugtune ships the plugin's snapshot as it")
        if not idle_timeout_s > 0:
            raise ValueError(f"idle_timeout_s={idle_timeout_s} must be > 0")
        if not 0 < start_timeout_s <= 3600:
            raise ValueError(f"start_timeout_s={start_timeout_s} must be in (0, 3600]")
        self.address = address
        self.idle_timeout_s = idle_timeout_s
        self.start_timeout_s = start_timeout_s
        self.runtime_env = dict(runtime_env or {})
        if ship_plugtune is None:
            ship_plugtune = os.environ.get("PLUGTUNE_RAY_SHIP_PLUGTUNE", "1") != "0"
        self.ship_plugtune = ship_plugtune
        self._started_ray = False

    async def start(self) -> None:
        if self.backend is None:
            self._started_ray = connect(self.address)
            self.backend = RayBackend(
                self.address or "a local head",
                self.ledger,
                idle_timeout_s=self.idle_timeout_s,
                start_timeout_s=self.start_timeout_s,
                runtime_env=self.runtime_env,
                ship_plugtune=self.ship_plugtune,
            )

    async def close(self) -> None:
        await super().close()
        if self._started_ray:
            disconnect()
            self._started_ray = False
