"""A judge (an LLM-judge-like HTTP service) on 127.0.0.1 for the dependency tests.

The first path segment picks the mode: ``/ok``, ``/429`` (with ``Retry-After: 1``), ``/500``,
``/malformed`` (a 200 whose body is not JSON), ``/slow`` (answers after 2 s), ``/wait/<s>``
(answers after ``s`` seconds, at most 10), ``/flaky/<key>/<n>`` (the first ``n`` requests for
``key`` answer 429 with ``Retry-After: 1``, then 200), ``/chaos/<pct>`` (``pct`` % of requests,
drawn from a seeded generator, answer one of 429 / 500 / a malformed 200 / 2 s late, the rest
200); ``.../chat/completions`` answers in the OpenAI shape. ``dead_port()`` is a port nothing
listens on (the judge is down).

The server counts ``requests``, the requests in progress (``active``) and their most at once
(``peak``), and keeps ``log``: ``(time.monotonic(), path)`` per request, in arrival order.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Judge(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # http.server's name
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(min(length, 1 << 20))
        server: Any = self.server
        with server.lock:
            server.requests += 1
            server.active += 1
            server.peak = max(server.peak, server.active)
            server.log.append((time.monotonic(), self.path))
        try:
            self._answer(server)
        finally:
            with server.lock:
                server.active -= 1

    def _answer(self, server: Any) -> None:
        parts = self.path.strip("/").split("/")
        mode = parts[0]
        if mode == "slow":
            time.sleep(2.0)
        if mode == "wait":
            time.sleep(min(float(parts[1]), 10.0))
        if mode == "chaos":
            with server.lock:
                u = server.rng.random()
            pct = float(parts[1]) / 100
            mode = "ok" if u >= pct else ("429", "500", "malformed", "slow")[int(u / pct * 4)]
            if mode == "slow":
                time.sleep(2.0)
            with server.lock:
                server.chaos[mode] = server.chaos.get(mode, 0) + 1
        if mode == "flaky":
            with server.lock:
                seen = server.flaky[parts[1]] = server.flaky.get(parts[1], 0) + 1
            mode = "429" if seen <= int(parts[2]) else "ok"
        if mode == "429":
            self._send(429, b'{"error": {"message": "rate limited"}}', {"Retry-After": "1"})
        elif mode == "500":
            self._send(500, b'{"error": {"message": "the judge broke"}}')
        elif mode == "malformed":
            self._send(200, b"<html>not json")
        elif self.path.endswith("/chat/completions"):
            body = {
                "id": "c1",
                "object": "chat.completion",
                "created": 0,
                "model": "judge",
                "choices": [
                    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "0.75"}}
                ],
            }
            self._send(200, json.dumps(body).encode())
        else:
            self._send(200, b'{"score": 0.75}')

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:  # the client gave up waiting (a /slow answer after its timeout)
            pass

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's name
        pass


@contextmanager
def judge(port: int = 0, seed: int = 0, host: str = "127.0.0.1") -> Iterator[ThreadingHTTPServer]:
    """The judge, listening on 127.0.0.1 (``server.server_address[1]``; ``port``: that one) until the
    block ends; ``server.chaos`` counts the answers of ``/chaos`` by kind (``ok``, ``429``, ...).
    ``host``: another address of this machine (one a test's network namespace reaches)."""
    server = ThreadingHTTPServer((host, port), _Judge)
    server.daemon_threads = True
    server.requests = 0  # type: ignore[attr-defined]
    server.active = server.peak = 0  # type: ignore[attr-defined]
    server.log = []  # type: ignore[attr-defined]
    server.flaky = {}  # type: ignore[attr-defined]
    server.chaos = {}  # type: ignore[attr-defined]
    server.rng = random.Random(seed)  # type: ignore[attr-defined]
    server.lock = threading.Lock()  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def dead_port() -> int:
    """A port on 127.0.0.1 that refuses connections (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: A grader that asks the judge at ``{url}`` (``.format(url=...)``) for its score, with httpx.
JUDGED_GRADER = """
import httpx
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    reply = httpx.post("{url}", json={{"answer": trajectory.completion}}, timeout=5)
    reply.raise_for_status()
    return float(reply.json()["score"])
"""


def url_of(server: ThreadingHTTPServer, path: str) -> str:
    """The judge's URL for ``path`` (its mode first, e.g. ``500`` or ``flaky/k/2``)."""
    return f"http://127.0.0.1:{server.server_address[1]}/{path}"
