"""An instance's network: ``none``, ``policy-only`` (the policy gateway and declared dependencies) or ``any``.

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

Declared dependencies (job.yaml ``dependencies:``) are reached at their real URL, unchanged in the
plugin's code, by a per-dependency listener in the namespace plus name rewriting (no proxy
variables): the forwarder listens at the dependency's own ``host:port`` when its host is a loopback
address (``http://127.0.0.1:8000`` is ``127.0.0.1:8000`` inside the namespace too), and at an
address of its own in 127.77.0.0/16 for a host name, which ``socket.getaddrinfo`` (patched in the
instance only; every Python client resolves through it: httpx, openai, requests, urllib, aiohttp's
default resolver) answers for that name; each listener relays to the bridge naming the real
``host port``, and the bridge (outside the namespace) resolves and connects. TLS is end to end: the
plugin's client still verifies the real name. A dependency given by a non-loopback IP address has no
such address inside the namespace: declare it by a host name. Ports below 1024 are made bindable
in the namespace where it allows (ip_unprivileged_port_start).

Anything else a plugin connects to over TCP (a host that is neither the policy nor declared, an
unknown name, a loopback port nothing in the instance listens on) is refused at ``connect``
(an audit hook) with :class:`PolicyRefused`, whose message names the ``host:port`` and how to
declare it; the first refusal of each target is also a WARNING in the plugin's log.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import fcntl
import ipaddress
import os
import socket
import struct
import sys
import threading
import urllib.parse
from collections.abc import Callable
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
    if mode == POLICY_ONLY:
        _low_ports_bindable()


def _low_ports_bindable() -> None:
    """Let the instance's uid listen on a declared dependency's port below 1024 (443, 80) inside
    its own namespace (a per-namespace setting; best effort: older kernels keep it fixed)."""
    try:
        with open("/proc/sys/net/ipv4/ip_unprivileged_port_start", "w") as f:
            f.write("0")
    except OSError:
        pass


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
    forwarder = PolicyForwarder(str(network["bridge"]))
    for name, host, port in network.get("dependencies") or []:
        forwarder.declare(str(name), str(host), int(port))
    return forwarder


REFUSAL = (
    "network policy-only: refused a connection to {target}: it is neither the policy nor a declared "
    "dependency of this function. Declare the service in job.yaml `dependencies:` (e.g. "
    "`dependencies: {{judge: {example}}}`; in Python: deploy(..., dependencies={{'judge': '{example}'}})), "
    "or set `network: any` in the plugin's runtime"
)


class PolicyRefused(ConnectionRefusedError):
    """A connection ``network: policy-only`` refused; ``target`` is the ``host:port`` it went to."""

    def __init__(self, target: str, example: str) -> None:
        super().__init__(errno.ECONNREFUSED, REFUSAL.format(target=target, example=example))
        self.target = target
        self.policy_refused = target


class NameRefused(socket.gaierror):
    """A host name that is not declared and cannot be resolved inside the namespace."""

    def __init__(self, target: str, example: str) -> None:
        super().__init__(socket.EAI_NONAME, REFUSAL.format(target=target, example=example))
        self.target = target
        self.policy_refused = target


class Guard:
    """The instance's side of ``policy-only`` for the plugin's own connections: declared names
    resolve to the forwarder's listeners, every other TCP connection is refused."""

    def __init__(self, forwarder: PolicyForwarder, warn: Callable[[str], None]) -> None:
        self.forwarder = forwarder
        self.warn = warn
        self.real = socket.getaddrinfo
        self.warned: set[str] = set()

    def refuse(self, error: PolicyRefused | NameRefused) -> None:
        if error.target not in self.warned and len(self.warned) < 64:
            self.warned.add(error.target)
            self.warn(str(error.args[1]))
        raise error

    def getaddrinfo(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode("idna") if isinstance(host, bytes) else host
        alias = self.forwarder.names.get(name.lower()) if isinstance(name, str) else None
        if alias is not None:
            kwargs.pop("family", None)
            return self.real(alias, port, socket.AF_INET, *args[1:], **kwargs)
        try:
            return self.real(host, port, *args, **kwargs)
        except socket.gaierror:
            if not isinstance(name, str) or _is_ip(name):
                raise
            self.refuse(NameRefused(f"{name}:{port}", f"http://{name}:{port}"))
            raise

    def check(self, host: str, port: int) -> None:
        """Raise :class:`PolicyRefused` unless a TCP connection to ``host:port`` (an address) is allowed."""
        if (host, port) in self.forwarder.listening:
            return
        if _is_loopback(host) and _listened(port):
            return  # the plugin's own server inside its instance
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.refuse(PolicyRefused(target, f"http://{target}"))

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        if event != "socket.connect":
            return
        sock, address = args
        if getattr(sock, "family", None) not in (socket.AF_INET, socket.AF_INET6):
            return
        if getattr(sock, "type", None) != socket.SOCK_STREAM or not isinstance(address, tuple):
            return
        self.check(str(address[0]), int(address[1]))


#: The instance's guard once ``guard`` installed it (``loops`` asks it: uvloop resolves and connects
#: in C, past ``socket.getaddrinfo`` and the audit hook).
GUARD: Guard | None = None


def guard(forwarder: PolicyForwarder, warn: Callable[[str], None]) -> Guard:
    """Install, in this instance only, the name rewriting of the declared dependencies and the
    refusal of any other connection (see the module's docstring)."""
    global GUARD
    GUARD = Guard(forwarder, warn)
    socket.getaddrinfo = GUARD.getaddrinfo
    sys.addaudithook(GUARD.hook)
    return GUARD


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    return True


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def _listened(port: int) -> bool:
    """Whether a TCP socket in this network namespace listens on ``port`` (unknown: True)."""
    wanted = f":{port:04X}"
    try:
        for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
            with open(table) as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    if len(fields) > 3 and fields[3] == "0A" and fields[1].endswith(wanted):
                        return True
    except OSError:
        return True
    return False


class PolicyForwarder:
    """Listens on 127.0.0.1 (one port per policy address) and relays each connection to the bridge."""

    def __init__(self, bridge_path: str) -> None:
        self.bridge_path = bridge_path
        self.urls: dict[str, str] = {}
        self.ports: dict[tuple[str, int], int] = {}
        self.lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.names: dict[str, str] = {}  # a declared dependency's host name -> its address in here
        self.listening: set[tuple[str, int]] = set()  # every (address, port) the forwarder listens on
        self.problems: list[str] = []  # declared dependencies that could not be given an address

    def declare(self, name: str, host: str, port: int) -> None:
        """Listen for the dependency at its own ``host:port`` as this namespace sees it."""
        host = host.lower()
        if host == "localhost":
            local = self.names["localhost"] = "127.0.0.1"
        elif _is_ip(host):
            local = host
        else:
            local = self.names.get(host) or f"127.77.{len(self.names) // 250}.{len(self.names) % 250 + 1}"
            self.names[host] = local
        try:
            with self.lock:
                self._listen(host, port, local, port)
        except OSError as exc:
            self.problems.append(
                f"network policy-only: the dependency {name} ({host}:{port}) cannot be reached from "
                f"this instance: listening at {local}:{port} in its network failed ({exc})"
                + ("; declare it by a host name, not an IP address" if not _is_loopback(local) else "")
            )

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

    def _listen(self, host: str, port: int, local: str = "127.0.0.1", local_port: int = 0) -> int:
        family = socket.AF_INET6 if ":" in local else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            if local_port:  # a dependency's own port: every instance of the function listens on it
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((local, local_port))
        except OSError:
            sock.close()
            raise
        sock.listen(256)
        sock.setblocking(False)
        loop = self._running_loop()
        header = f"{host} {port}\n".encode()

        async def serve() -> None:
            await loop.create_server(lambda: _Inbound(self.bridge_path, header), sock=sock)

        asyncio.run_coroutine_threadsafe(serve(), loop)
        bound = int(sock.getsockname()[1])
        self.listening.add((local, bound))
        return bound

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
