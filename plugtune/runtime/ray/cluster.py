"""Connecting to a Ray cluster, and the small local cluster that tests and benchmarks start.

``connect()`` joins ``PLUGTUNE_RAY_ADDRESS`` (``host:port`` of an existing head, or ``auto``) or,
without one, starts a Ray head for this process alone, on 127.0.0.1. ``LocalCluster`` starts real
``ray start`` nodes bound to 127.0.0.1 under their own temp dir and stops exactly those. Loopback
addresses stay loopback (see ``loopback``: Ray alone would move them to the host's external one).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from plugtune.errors import PlatformError
from plugtune.runtime.ray.loopback import is_loopback, keep_loopback


class RayUnavailable(PlatformError):
    """Raised when Ray is not installed or the cluster cannot be reached; ``message`` says what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(message, cause="ray unavailable")


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayUnavailable(
            "the ray backend needs Ray: pip install -e '.[ray]' (or pip install 'ray[default]==2.60.0')"
        ) from None
    return ray


def connect(address: str | None) -> bool:
    """Join the cluster at ``address`` (None: start a local head); True when this call started Ray."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    if not address or is_loopback(address):
        keep_loopback()
    try:
        ray.init(
            address=address or None,
            _node_ip_address=None if address else "127.0.0.1",
            namespace="plugtune",
            log_to_driver=False,
            include_dashboard=False if not address else None,
            configure_logging=False,
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = f"the Ray cluster at PLUGTUNE_RAY_ADDRESS={address}" if address else "a local Ray head"
        raise RayUnavailable(f"could not connect to {where}: {first_line(exc)}") from None
    return True


def disconnect() -> None:
    import_ray().shutdown()


def first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:500]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LocalCluster:
    """A Ray cluster of ``ray start`` nodes on this machine, in its own temp dir (tests, benchmarks).

    ``host``: the address the head (and nodes added here) use; another than 127.0.0.1 is an
    address of this machine that other hosts reach it by (tests put nodes in network namespaces)."""

    host: str = "127.0.0.1"
    temp_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ptray-", dir="/tmp")))
    port: int = field(default_factory=free_port)
    nodes: list[str] = field(default_factory=list)  # the resource tag of each node, head first

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start_head(self, num_cpus: float = 1, resource: str = "node_head") -> None:
        self._ray_start(
            ["--head", f"--port={self.port}", f"--temp-dir={self.temp_dir}", "--include-dashboard=false"],
            num_cpus,
            resource,
        )

    def add_node(self, num_cpus: float = 1, resource: str = "") -> str:
        resource = resource or f"node_{len(self.nodes)}"
        self._ray_start([f"--address={self.address}"], num_cpus, resource)
        return resource

    def _ray_start(self, args: list[str], num_cpus: float, resource: str) -> None:
        cmd = [
            sys.executable,
            "-m",
            "plugtune.runtime.ray.loopback",  # the ray CLI, kept on 127.0.0.1 (when it is the host)
            "start",
            *args,
            f"--node-ip-address={self.host}",
            f"--num-cpus={num_cpus}",
            f'--resources={{"{resource}": 100}}',
            "--disable-usage-stats",
        ]
        # The mode is explicit: with it unset, Ray 2.60 turns token auth on for a head whenever
        # ~/.ray/auth_token exists (a local `ray.init()` head writes one) while `ray start
        # --address` nodes join without it and are refused. These nodes listen on 127.0.0.1 only.
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"ray start failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        self.nodes.append(resource)

    def processes(self) -> list[psutil.Process]:
        """Every process of this cluster (found by its temp dir on the command line)."""
        marker = str(self.temp_dir)
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if any(marker in part for part in proc.info["cmdline"] or []):
                    found.append(proc)
            except psutil.Error:
                continue
        return found

    def raylet_of(self, resource: str) -> psutil.Process | None:
        for proc in self.processes():
            try:
                cmd = " ".join(proc.cmdline())
            except psutil.Error:
                continue
            if proc.name() == "raylet" and f"--static_resource_list={resource}," in cmd:
                return proc
        return None

    def stop(self) -> None:
        """Kill this cluster's processes (and their children) and remove its temp dir."""
        procs = self.processes()
        for proc in list(procs):
            try:
                procs.extend(proc.children(recursive=True))
            except psutil.Error:
                pass
        for proc in procs:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=5)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and self.processes():
            time.sleep(0.1)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
