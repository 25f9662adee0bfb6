"""The async instance's event loop: uvloop, with what the plugin sends over the network counted."""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from plugtune.runtime.worker import watch
from plugtune.runtime.worker.loops import CountingTransport, new_event_loop
from tests.runtime.helpers import eventually


async def _traffic(tmp: Path) -> dict[str, int]:
    got: dict[str, int] = {}

    async def drain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got["tcp"] = len(await reader.read())
        writer.close()

    counted: dict[str, int] = {}
    server = await asyncio.start_server(drain, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    before = watch.outbound_bytes()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert isinstance(writer.transport, CountingTransport)
    assert writer.transport.get_extra_info("peername")[1] == port
    writer.write(b"x" * 100_000)
    writer.writelines([b"y" * 10, memoryview(b"z" * 5)])
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    await eventually(lambda: "tcp" in got)
    counted["tcp"] = watch.outbound_bytes() - before

    before = watch.outbound_bytes()
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
        asyncio.DatagramProtocol, remote_addr=receiver.getsockname()
    )
    transport.sendto(b"u" * 1000)
    transport.close()
    receiver.close()
    counted["udp"] = watch.outbound_bytes() - before

    before = watch.outbound_bytes()
    path = str(tmp / "s.sock")
    unix = await asyncio.start_unix_server(drain, path)
    _, local = await asyncio.open_unix_connection(path)
    local.write(b"not network" * 100)
    await local.drain()
    local.close()
    counted["unix"] = watch.outbound_bytes() - before
    server.close()
    unix.close()
    counted["tcp_received"] = got.get("tcp", -1)
    return counted


def test_uvloop_transports_count_what_the_plugin_sends(tmp_path: Path) -> None:
    loop = new_event_loop()
    assert type(loop).__module__ == "plugtune.runtime.worker.loops"
    try:
        counted = loop.run_until_complete(_traffic(tmp_path))
    finally:
        loop.close()
    assert counted == {"tcp": 100_015, "udp": 1000, "unix": 0, "tcp_received": 100_015}


async def _tls_traffic(cert: Path, key: Path) -> dict[str, int]:
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context()
    client_ctx.check_hostname = False
    client_ctx.verify_mode = ssl.CERT_NONE
    got: list[int] = []

    async def drain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got.append(len(await reader.read()))
        writer.close()

    server = await asyncio.start_server(drain, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    counted: dict[str, int] = {}
    before = watch.outbound_bytes()
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx)
    writer.write(b"t" * 5000)
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    counted["tls"] = watch.outbound_bytes() - before

    before = watch.outbound_bytes()
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    await writer.start_tls(client_ctx)  # the loop gets the transport it made, not the counting one
    assert isinstance(writer.transport, CountingTransport)
    writer.write(b"s" * 7000)
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    counted["start_tls"] = watch.outbound_bytes() - before
    await eventually(lambda: len(got) == 2)
    server.close()
    counted["received"] = sum(got)
    return counted


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
@pytest.mark.skipif(sys.version_info < (3, 11), reason="StreamWriter.start_tls is 3.11+")
def test_tls_plaintext_is_counted_also_after_start_tls(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost"]
        + ["-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    loop = new_event_loop()
    try:
        counted = loop.run_until_complete(_tls_traffic(cert, key))
    finally:
        loop.close()
    assert counted == {"tls": 5000, "start_tls": 7000, "received": 12_000}
