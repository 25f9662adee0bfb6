"""The policy gateway as other Ray nodes reach it.

A job's gateway listens on the driver's 127.0.0.1, which on another node is that node's own. When
the driver joined the cluster by another address, the backend opens a TCP relay on that address
(the one every node reaches the driver by) for each loopback policy that calls are given, and the
calls' ``Policy`` names the relay instead. The relay takes connections from the cluster's nodes
only (their addresses as Ray lists them); the gateway's per-trajectory keys still hold.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import urllib.parse
from collections.abc import Callable
from typing import Any

from plugtune.runtime.ray.loopback import is_loopback
from plugtune.sdk import Policy

log = logging.getLogger(__name__)

CHUNK = 1 << 16


class PolicyRelay:
    """``host``: the driver's node address; ``node_addresses``: the cluster's node addresses now."""

    def __init__(self, host: str, node_addresses: Callable[[], set[str]]) -> None:
        self.host = host
        self.node_addresses = node_addresses
        self.known: set[str] = set()
        self.ports: dict[tuple[str, int], int] = {}  # loopback target -> relay port
        self.servers: list[asyncio.Server] = []
        self.lock = asyncio.Lock()
        self.pipes: set[asyncio.Task[None]] = set()

    async def rewrite(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """``args`` with each loopback ``Policy`` pointed at its relay."""
        if not any(isinstance(a, Policy) and _loopback_target(a.base_url) for a in args):
            return args
        out = []
        for arg in args:
            target = _loopback_target(arg.base_url) if isinstance(arg, Policy) else None
            if target is not None:
                port = await self._port_for(target)
                parts = urllib.parse.urlsplit(arg.base_url)
                relayed = parts._replace(netloc=f"{self.host}:{port}").geturl()
                arg = dataclasses.replace(arg, base_url=relayed)
            out.append(arg)
        return tuple(out)

    async def _port_for(self, target: tuple[str, int]) -> int:
        async with self.lock:
            port = self.ports.get(target)
            if port is None:
                server = await asyncio.start_server(lambda r, w: self._serve(target, r, w), self.host, 0)
                self.servers.append(server)
                port = self.ports[target] = int(server.sockets[0].getsockname()[1])
                log.info("policy %s:%d relayed for the Ray nodes at %s:%d", *target, self.host, port)
            return port

    async def _serve(
        self, target: tuple[str, int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        peer = str(writer.get_extra_info("peername")[0]).removeprefix("::ffff:")
        if peer not in self.known:
            self.known = await asyncio.to_thread(self.node_addresses)
        if peer not in self.known:
            log.warning("policy relay: refused %s, not a node of the Ray cluster", peer)
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError as exc:
            log.warning("policy relay: the policy at %s:%d is unreachable: %s", *target, exc)
            writer.close()
            return
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            up_writer.close()
            writer.close()

    async def close(self) -> None:
        for server in self.servers:
            server.close()
        for server in self.servers:
            await server.wait_closed()
        self.servers.clear()
        self.ports.clear()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until EOF, then half-close; a reset ends the other direction too."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()


def _loopback_target(base_url: str) -> tuple[str, int] | None:
    parts = urllib.parse.urlsplit(base_url)
    if not is_loopback(parts.hostname) or parts.scheme != "http":
        return None
    return (parts.hostname or "127.0.0.1", parts.port or 80)
