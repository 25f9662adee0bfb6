"""Ray nodes on hosts of their own, made on this machine: the head stays on this host (with the
driver, the test process), each other node runs in a network namespace of its own, linked by a veth
pair to a bridge that carries the head's address, with its own /tmp and a Python that sees neither
the project's checkout (the folder holding it, and /work: the other engineers' notes) nor plugtune.

A node's view is made by ``unshare --mount`` inside its namespace: a tmpfs over /tmp (its Ray temp
dir, runtime_env unpacks and plugin temp space live there, apart from the head's), its own
/etc/hosts that names the head (``head_name``), the project's venv mounted as an overlay at
/tmp/.node/venv with plugtune's editable install whited out (and any ``hide``-named modules: the
node then lacks them as a machine without them would), then a tmpfs over each ``HIDDEN`` folder.
It starts with a scrubbed environment (no PYTHONPATH, no VIRTUAL_ENV).

Root only. Everything is named with this process's id (``ptb<tag>``, ``ptn<tag>-<i>``,
``ptv<tag><i>h``) and ``stop()`` removes it all, also after a failure; nothing is touched that
this object did not create. ``python -m tests.runtime.ray.apart`` makes a cluster of a head and one
node, prints the addresses, and stops it on Enter (to look around by hand).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from plugtune.runtime.ray import LocalCluster

VENV = Path(sys.prefix)
SITE = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
NODE_ROOT = "/tmp/.node"  # in the node's own /tmp
#: Where a node's mount namespace holds the venv before its /tmp is covered (a checkout, and its
#: venv, may live under /tmp, as a CI clone does); an empty folder on the host, removed at stop.
LOWER_ROOT = "/run/plugtune-apart"
CHECKOUT = Path(__file__).resolve().parents[3]


def hidden_paths(checkout: Path = CHECKOUT) -> tuple[str, ...]:
    """What every node's view covers: /work (the other engineers' notes) and the folder holding the
    checkout, wherever that is (a CI clone may sit at /check/work/main; one under /tmp is covered
    with /tmp already). Only folders that exist, none inside another, none of / itself."""
    wanted = [Path("/work"), checkout.parent]
    chosen: list[Path] = []
    for path in sorted(wanted, key=lambda p: len(p.parts)):
        if len(path.parts) < 2 or not path.is_dir() or path.is_relative_to("/tmp"):
            continue
        if not any(path.is_relative_to(c) for c in chosen):
            chosen.append(path)
    return tuple(str(p) for p in chosen)


HIDDEN = hidden_paths()  # covered in every node's view: the checkout and everything around it
COMMAND_S = 30.0


class NamespaceError(RuntimeError):
    """A command that builds the hosts failed; the message has its output."""


def sh(*args: str, timeout: float = COMMAND_S, check: bool = True) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise NamespaceError(f"{shlex.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def can_make_hosts() -> str:
    """Why network and mount namespaces cannot be made here ('' when they can)."""
    if os.geteuid() != 0:
        return "needs root (ip netns, unshare --mount)"
    for tool in ("ip", "unshare", "nsenter", "ss", "mknod"):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0:
            return f"needs the {tool} command"
    return ""


@dataclass
class Node:
    index: int
    netns: str
    veth: str  # the bridge's end; the node's end is inside netns
    ip: str
    hide: tuple[str, ...]
    resource: str


@dataclass
class ApartCluster:
    """A Ray head on this host at ``10.77.<n>.1`` and nodes at ``.2``, ``.3``... behind a bridge."""

    tag: str = field(default_factory=lambda: str(os.getpid() % 100000))
    nodes: list[Node] = field(default_factory=list)
    head: LocalCluster | None = None
    bridge_up: bool = False

    subnet: str = ""  # 10.77.<n>: the first /24 from this process's id that no interface here holds

    def __post_init__(self) -> None:
        if not self.subnet:
            held = sh("ip", "-o", "-4", "addr", "show", check=False)
            for k in range(200):
                candidate = f"10.77.{(int(self.tag) + k) % 200 + 20}"
                if f" {candidate}." not in held:
                    self.subnet = candidate
                    break
            else:
                raise NamespaceError("every 10.77.<n>.0/24 that tests use is held by an interface here")

    @property
    def bridge(self) -> str:
        return f"ptb{self.tag}"

    @property
    def head_ip(self) -> str:
        return f"{self.subnet}.1"

    @property
    def head_name(self) -> str:
        """The head's host name in the nodes' /etc/hosts (this host's file is left as it is)."""
        return f"head-{self.tag}.apart"

    @property
    def address(self) -> str:
        assert self.head is not None
        return self.head.address

    def start_head(self, num_cpus: float = 0) -> None:
        """The bridge and the head on it (no CPUs by default: every actor goes to a node)."""
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        self.bridge_up = True
        sh("ip", "addr", "add", f"{self.head_ip}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        self.head = LocalCluster(host=self.head_ip)
        self.head.start_head(num_cpus=num_cpus)

    def add_node(self, num_cpus: float = 1, hide: tuple[str, ...] = ()) -> Node:
        """A node on a host of its own; ``hide``: top-level modules its Python lacks."""
        assert self.head is not None, "start_head() first"
        i = len(self.nodes) + 1
        ip = f"{self.subnet}.{i + 1}"
        node = Node(i, f"ptn{self.tag}-{i}", f"ptv{self.tag}{i}h", ip, hide, f"apart_{i}")
        self.nodes.append(node)
        inner = f"ptv{self.tag}{i}n"
        sh("ip", "netns", "add", node.netns)
        sh("ip", "link", "add", node.veth, "type", "veth", "peer", "name", inner, "netns", node.netns)
        sh("ip", "link", "set", node.veth, "master", self.bridge, "up")
        inside = ("ip", "netns", "exec", node.netns)
        sh(*inside, "ip", "addr", "add", f"{node.ip}/24", "dev", inner)
        sh(*inside, "ip", "link", "set", inner, "up")
        sh(*inside, "ip", "link", "set", "lo", "up")
        Path(self._lower(node)).mkdir(parents=True, exist_ok=True)
        script = self._node_script(node, num_cpus)
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
        cmd = [*inside, "unshare", "--mount", "--propagation", "private", "--", "/bin/bash", "-c", script]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        if done.returncode != 0:
            output = f"{done.stdout}\n{done.stderr}"
            raise NamespaceError(f"node {node.ip} did not start ({done.returncode}):\n{output}")
        return node

    def _lower(self, node: Node) -> str:
        return f"{LOWER_ROOT}/{self.tag}-{node.index}"

    def _node_script(self, node: Node, num_cpus: float) -> str:
        site = f"{NODE_ROOT}/up/{SITE}"
        plugtune_files = [p.name for p in (VENV / SITE).iterdir() if "plugtune" in p.name.lower()]
        whiteouts = " ".join(shlex.quote(f"{site}/{name}") for name in [*plugtune_files, *node.hide])
        ray_start = (
            "from ray.scripts.scripts import main; import sys; "
            f"sys.argv = ['ray', 'start', '--address={self.address}', '--node-ip-address={node.ip}', "
            f"'--num-cpus={num_cpus:g}', '--resources={json.dumps({node.resource: 100})}', "
            "'--disable-usage-stats']; main()"
        )
        return "\n".join(
            [
                "set -euo pipefail",
                f"mount --bind {shlex.quote(str(VENV))} {self._lower(node)}",  # before /tmp is covered
                "mount -t tmpfs -o size=4g,mode=1777 ptnode /tmp",
                f"mkdir -p {site} {NODE_ROOT}/work {NODE_ROOT}/venv {NODE_ROOT}/home",
                # its own /etc/hosts: the head by name, as a host's resolver would give it
                f"cp /etc/hosts {NODE_ROOT}/hosts",
                f"echo '{self.head_ip} {self.head_name}' >> {NODE_ROOT}/hosts",
                f"mount --bind {NODE_ROOT}/hosts /etc/hosts",
                *(f"mknod {w} c 0 0" for w in whiteouts.split()),
                f"mount -t overlay ptnode -o lowerdir={self._lower(node)},upperdir={NODE_ROOT}/up,"
                f"workdir={NODE_ROOT}/work {NODE_ROOT}/venv",
                *(f"mount -t tmpfs -o size=1m,mode=0755 hidden {h}" for h in HIDDEN),
                f"export HOME={NODE_ROOT}/home RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled",
                f"cd {NODE_ROOT}/home",
                f"exec {NODE_ROOT}/venv/bin/python -c {shlex.quote(ray_start)}",
            ]
        )

    def wait_joined(self, ray: object, within_s: float = 60.0) -> None:
        """Until every node is alive in the cluster's view (``ray``: the driver's joined module)."""
        want = {n.ip for n in self.nodes}
        deadline = time.monotonic() + within_s
        alive: set[str] = set()
        while time.monotonic() < deadline:
            alive = {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}  # type: ignore[attr-defined]
            if want <= alive:
                return
            time.sleep(0.5)
        raise NamespaceError(f"nodes {sorted(want - alive)} did not join within {within_s:g} s")

    def pids_of(self, node: Node) -> list[int]:
        out = sh("ip", "netns", "pids", node.netns, check=False)
        return [int(p) for p in out.split()]

    def stop_node(self, node: Node) -> None:
        """Kill every process in the node's namespace; then remove the namespace and its link."""
        procs = []
        for pid in self.pids_of(node):
            try:
                procs.append(psutil.Process(pid))
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, psutil.Error):
                continue
        psutil.wait_procs(procs, timeout=10)
        sh("ip", "netns", "del", node.netns, check=False)
        sh("ip", "link", "del", node.veth, check=False)
        for folder in (self._lower(node), LOWER_ROOT):  # empty on the host: the bind was the node's
            with contextlib.suppress(OSError):
                os.rmdir(folder)

    def stop(self) -> None:
        """Remove everything this cluster made, whatever state it is in."""
        for node in self.nodes:
            self.stop_node(node)
        if self.head is not None:
            self.head.stop()
        if self.bridge_up:
            sh("ip", "link", "del", self.bridge, check=False)
            self.bridge_up = False

    def leftovers(self) -> list[str]:
        """What of this cluster still exists (empty after ``stop()``)."""
        links = sh("ip", "-o", "link", "show", check=False)
        netns = sh("ip", "netns", "list", check=False)
        left = [n.netns for n in self.nodes if n.netns in netns.split()]
        names = [self.bridge, *(n.veth for n in self.nodes)]
        left += [name for name in names if f" {name}:" in links or f" {name}@" in links]
        if self.head is not None:
            left += [f"pid {p.pid}" for p in self.head.processes()]
        return left


if __name__ == "__main__":
    cluster = ApartCluster()
    try:
        cluster.start_head()
        node = cluster.add_node()
        print(f"head {cluster.address}, node {node.ip} in netns {node.netns}; Enter stops it")
        input()
    finally:
        cluster.stop()
        print("left:", cluster.leftovers())
