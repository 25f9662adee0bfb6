"""An instance's network: ``none``, ``policy-only`` (the policy gateway and nothing else) or ``any``.

``enter_network(config)`` runs once at a zygote's (or fresh-spawned worker's) start, after the
environment is scrubbed, while the process is still privileged and before the user's code is
imported. ``none`` and ``policy-only`` move the process into a network namespace of its own (the
zygote's instances share their function's) with only a loopback interface: no other host port
(the store's database, the console, other jobs' gateways) and no internet is reachable.

``policy-only`` instances reach the policy through a :class:`PolicyForwarder`: a thread started in
the instance (after the fork: threads do not survive one) listens on 127.0.0.1 inside the namespace
and relays each connection over a Unix socket (those cross namespaces) to the supervisor's
``PolicyBridge``, which only connects to the policy addresses the function's calls were given.
The rollout's ``policy.base_url`` is rewritten to the forwarder's address.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import fcntl
import os
import socket
import struct
import threading
import urllib.parse
from typing import Any

from plugtune.runtime.worker.loader import LoadError

NONE, POLICY_ONLY, ANY = "none", "policy-only", "any"
MODES = (NONE, POLICY_ONLY, ANY)

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
HEADER_MAX = 512  # the forwarder's first line to the bridge: "host port\n"


class NetworkUnavailable(LoadError):
    """This host cannot give the instance its own network namespace (no CAP_SYS_ADMIN, no user
    namespaces); the message says why and that ``network: any`` is the way out."""


def mode_of(config: dict[str, Any]) -> str:
    return str((config.get("network") or {}).get("mode", ANY))


def enter_network(config: dict[str, Any]) -> None:
    """Enter the network the config's ``network.mode`` asks for; raises NetworkUnavailable."""
    mode = mode_of(config)
    if mode == ANY:
        return
    unshare_network(mode)
    _loopback_up()


def unshare_network(mode: str) -> None:
    """A new network namespace: directly as root, else inside a new user namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) == 0:
        return
    first = ctypes.get_errno()
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        second = ctypes.get_errno()
        raise NetworkUnavailable(
            f"network: {mode} needs a network namespace of its own, and this host gives none: "
            f"unshare(CLONE_NEWNET) failed ({errno.errorcode.get(first, first)}: the runtime has no "
            f"CAP_SYS_ADMIN) and so did a new user namespace ({errno.errorcode.get(second, second)}: "
            "user namespaces are disabled or blocked by seccomp). Run the runtime as root, allow user "
            "namespaces (sysctl user.max_user_namespaces), or set `network: any` in the plugin's "
            "Runtime or job.yaml runtime: to use the host's network unrestricted."
        )
    # Keep the same uid/gid inside, so files and the supervisor's sockets see the same owner.
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def _loopback_up() -> None:
    """A new namespace's ``lo`` starts down; up, the plugin's own localhost servers work."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sh22x", b"lo", 0)
        flags = struct.unpack("16sh22x", fcntl.ioctl(s, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | IFF_UP))


def policy_router(config: dict[str, Any]) -> PolicyForwarder | None:
    """The instance's forwarder when its network is ``policy-only`` (None otherwise)."""
    network = config.get("network") or {}
    if network.get("mode") != POLICY_ONLY or not network.get("bridge"):
        return None
    return PolicyForwarder(str(network["bridge"]))


class PolicyForwarder:
    """Listens on 127.0.0.1 (one port per policy address) and relays each connection to the bridge."""

    def __init__(self, bridge_path: str) -> None:
        self.bridge_path = bridge_path
        self.urls: dict[str, str] = {}
        self.ports: dict[tuple[str, int], int] = {}
        self.lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None

    def route(self, base_url: str) -> str:
        """``base_url`` as this instance reaches it: through a forwarder port (one dict lookup when known)."""
        routed = self.urls.get(base_url)
        if routed is not None:
            return routed
        with self.lock:
            parts = urllib.parse.urlsplit(base_url)
            host = parts.hostname or ""
            port = parts.port or (443 if parts.scheme == "https" else 80)
            local = self.ports.get((host, port))
            if local is None:
                local = self.ports[(host, port)] = self._listen(host, port)
            routed = self.urls[base_url] = urllib.parse.urlunsplit(
                parts._replace(netloc=f"127.0.0.1:{local}")
            )
        return routed

    def _listen(self, host: str, port: int) -> int:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        sock.listen(256)
        sock.setblocking(False)
        loop = self._running_loop()
        header = f"{host} {port}\n".encode()

        async def serve() -> None:
            await loop.create_server(lambda: _Inbound(self.bridge_path, header), sock=sock)

        asyncio.run_coroutine_threadsafe(serve(), loop)
        return int(sock.getsockname()[1])

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self.loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="plugtune-policy-forwarder", daemon=True).start()
            self.loop = loop
        return self.loop


class Splice(asyncio.Protocol):
    """One side of a relayed connection: what it reads is written to its peer; either end closes both."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: Splice | None = None
        self.pending: list[bytes] = []
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def join(self, peer: Splice) -> None:
        self.peer, peer.peer = peer, self
        if self.closed or peer.closed:
            for side in (self, peer):
                if side.transport is not None:
                    side.transport.close()
            return
        for side in (self, peer):
            if side.pending and side.peer is not None and side.peer.transport is not None:
                side.peer.transport.write(b"".join(side.pending))
            side.pending.clear()

    def data_received(self, data: bytes) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write(data)
        else:
            self.pending.append(data)

    def eof_received(self) -> bool:
        return False  # HTTP does not half-close: the end of one side ends the connection

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class _Inbound(Splice):
    """A plugin's connection to the forwarder: opens the bridge connection and names the target."""

    def __init__(self, bridge_path: str, header: bytes) -> None:
        super().__init__()
        self.bridge_path = bridge_path
        self.header = header

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, upstream = await loop.create_unix_connection(Splice, self.bridge_path)
        except OSError:
            if self.transport is not None:
                self.transport.close()
            return
        assert upstream.transport is not None
        upstream.transport.write(self.header)
        self.join(upstream)
