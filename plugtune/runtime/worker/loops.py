"""The event loop of an async instance: uvloop when it can be imported, else asyncio's own.

uvloop runs the loop and its transports in C, which makes a call's round trip cheaper, but its
transports write past the Python socket methods that :func:`.watch.install_net_counter` counts.
So on uvloop the transports the loop creates for the plugin's network connections (TCP and UDP;
with TLS the plaintext is counted, as the socket counter does for an ``SSLSocket``) are wrapped
in one that counts the bytes handed to it. ``loop.sock_*`` calls use the Python socket methods
and are counted there.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
from collections.abc import Callable
from typing import Any

from plugtune.runtime.worker import network
from plugtune.runtime.worker.watch import INET, count_outbound

try:  # imported in the zygote, so a forked instance does not pay for it
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency; a platform without it falls back
    uvloop = None  # type: ignore[assignment]


def new_event_loop() -> asyncio.AbstractEventLoop:
    if uvloop is None:  # pragma: no cover
        return asyncio.new_event_loop()
    return _counting_loop(uvloop.Loop)()


def _counting_loop(base: type) -> type:
    class CountingLoop(base):
        async def getaddrinfo(
            self,
            host: Any,
            port: Any,
            *,
            family: int = 0,
            type: int = 0,  # noqa: A002 - asyncio's own keyword
            proto: int = 0,
            flags: int = 0,
        ) -> Any:
            if network.GUARD is None:
                return await super().getaddrinfo(
                    host, port, family=family, type=type, proto=proto, flags=flags
                )
            # policy-only: through the guard's getaddrinfo (declared names), as asyncio's loop does
            call = functools.partial(network.GUARD.getaddrinfo, host, port, family, type, proto, flags)
            return await self.run_in_executor(None, call)

        async def create_connection(self, protocol_factory: Any, *args: Any, **kwargs: Any) -> Any:
            if network.GUARD is not None and kwargs.get("sock") is None:
                args, kwargs = await self._guarded(args, kwargs)
            made: list[CountingTransport] = []
            transport, protocol = await super().create_connection(
                _counted(protocol_factory, made), *args, **kwargs
            )
            return (made[0] if made else transport), protocol

        async def create_server(self, protocol_factory: Any, *args: Any, **kwargs: Any) -> Any:
            return await super().create_server(_counted(protocol_factory, None), *args, **kwargs)

        async def _guarded(
            self, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> tuple[tuple[Any, ...], dict[str, Any]]:
            """The host resolved by the guard and checked as the audit hook checks a Python connect
            (uvloop connects in C): a refused address raises PolicyRefused."""
            host = args[0] if args else kwargs.pop("host", None)
            port = args[1] if len(args) > 1 else kwargs.pop("port", None)
            if host is None or port is None or network.GUARD is None:
                return args, kwargs
            address = str(host)
            if not _numeric(address):
                family = kwargs.get("family", 0)
                infos = await self.getaddrinfo(host, port, family=family, type=socket.SOCK_STREAM)
                address = str(infos[0][4][0])
                if kwargs.get("ssl") and not kwargs.get("server_hostname"):
                    kwargs["server_hostname"] = host  # TLS still checks the name, not the address
            network.GUARD.check(address, int(port))
            return (address, port, *args[2:]), kwargs

        async def connect_accepted_socket(self, protocol_factory: Any, *args: Any, **kwargs: Any) -> Any:
            made: list[CountingTransport] = []
            transport, protocol = await super().connect_accepted_socket(
                _counted(protocol_factory, made), *args, **kwargs
            )
            return (made[0] if made else transport), protocol

        async def create_datagram_endpoint(self, protocol_factory: Any, *args: Any, **kwargs: Any) -> Any:
            made: list[CountingTransport] = []
            transport, protocol = await super().create_datagram_endpoint(
                _counted(protocol_factory, made), *args, **kwargs
            )
            return (made[0] if made else transport), protocol

        async def start_tls(self, transport: Any, *args: Any, **kwargs: Any) -> Any:
            counted = isinstance(transport, CountingTransport)
            inner = transport.inner if counted else transport
            tls = await super().start_tls(inner, *args, **kwargs)
            return CountingTransport(tls) if counted and tls is not None else tls

    return CountingLoop


def _counted(factory: Callable[[], Any], made: list[CountingTransport] | None) -> Callable[[], Any]:
    """A protocol factory whose protocols get a counting transport in ``connection_made``."""

    def make() -> Any:
        protocol = factory()
        original = protocol.connection_made

        def connection_made(transport: Any) -> None:
            sock = transport.get_extra_info("socket")
            if sock is not None and getattr(sock, "family", None) in INET:
                transport = CountingTransport(transport)
                if made is not None:
                    made.append(transport)
            original(transport)

        try:
            protocol.connection_made = connection_made
        except AttributeError:  # a protocol with __slots__ (asyncio.DatagramProtocol itself)
            cls = type(protocol)
            hooked = {"__slots__": (), "connection_made": lambda self, transport: connection_made(transport)}
            try:
                protocol.__class__ = type(cls.__name__, (cls,), hooked)
            except TypeError:  # pragma: no cover - a C protocol: its bytes go uncounted
                pass
        return protocol

    return make


def _numeric(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    return True


class CountingTransport(asyncio.Transport, asyncio.DatagramTransport):
    """Forwards everything to the loop's transport; counts what the plugin writes."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner

    def write(self, data: Any) -> None:
        count_outbound(data)
        self.inner.write(data)

    def writelines(self, list_of_data: Any) -> None:
        chunks = list(list_of_data)
        for chunk in chunks:
            count_outbound(chunk)
        self.inner.writelines(chunks)

    def sendto(self, data: Any, addr: Any = None) -> None:
        count_outbound(data)
        self.inner.sendto(data, addr)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.inner.get_extra_info(name, default)

    def is_closing(self) -> bool:
        return bool(self.inner.is_closing())

    def close(self) -> None:
        self.inner.close()

    def abort(self) -> None:
        self.inner.abort()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.inner.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.inner.get_protocol()

    def is_reading(self) -> bool:
        return bool(self.inner.is_reading())

    def pause_reading(self) -> None:
        self.inner.pause_reading()

    def resume_reading(self) -> None:
        self.inner.resume_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.inner.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return int(self.inner.get_write_buffer_size())

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self.inner.get_write_buffer_limits()

    def write_eof(self) -> None:
        self.inner.write_eof()

    def can_write_eof(self) -> bool:
        return bool(self.inner.can_write_eof())

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"<counted {self.inner!r}>"


__all__ = ["CountingTransport", "new_event_loop"]
