"""A service that resets the connection while the client reads its reply: urllib lets the socket's
ConnectionResetError out bare (only while sending does it wrap it in URLError), and that is the
dependency's failure (unreachable), named by the host:port the client's frames were on, not the
plugin's bug. Seen flaking in the full suite: which of the two a reset became depended on timing."""

from __future__ import annotations

import socket
import struct
import threading
import urllib.request

import pytest

from plugtune.runtime.worker.dependency import UNREACHABLE, find

BODY = b"{}"


def _resets_after_the_request(server: socket.socket) -> None:
    conn, _ = server.accept()
    with conn:
        conn.settimeout(10)
        # the whole request, its body too (urllib sends the headers and the body apart; a reset
        # between them is a reset while sending, which CI saw): the client now waits for the reply
        received = b""
        while not received.endswith(b"\r\n\r\n" + BODY):
            chunk = conn.recv(65536)
            if not chunk:
                return
            received += chunk
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_a_reset_while_reading_the_reply_is_the_dependencys_unreachable() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        thread = threading.Thread(target=_resets_after_the_request, args=(server,), daemon=True)
        thread.start()
        with pytest.raises(ConnectionResetError) as raised:  # bare, as urllib lets it out
            urllib.request.urlopen(f"http://127.0.0.1:{port}/score", data=BODY, timeout=10)
        thread.join(10)
    found = find(raised.value, "", {("127.0.0.1", port): "judge"})
    assert found is not None, "a reset inside the client is the service's, not the plugin's"
    assert (found.cause, found.dependency, found.port) == (UNREACHABLE, "judge", port)
    assert found.error.startswith("ConnectionResetError")


def test_a_connection_error_raised_outside_any_client_stays_the_plugins() -> None:
    try:
        raise ConnectionResetError("the plugin's own socket code")
    except ConnectionResetError as exc:
        assert find(exc, "", {("127.0.0.1", 1): "judge"}) is None
