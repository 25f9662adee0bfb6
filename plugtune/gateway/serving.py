"""``ThreadedServer``: an ASGI app served by uvicorn on a background thread of this process.

The policy gateway, the engines' token gateway and the local vLLM-compatible server all serve
so: bind a socket here (an OSError becomes a ``PlatformError`` that names the address), run
uvicorn on it in a daemon thread, return once it accepts connections, stop within a timeout.

    server = ThreadedServer("plugtune-gateway", "the policy gateway")
    port = server.start(app, "127.0.0.1", 0)      # 0: any free port
    server.stop()
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

from plugtune.errors import PlatformError


class ThreadedServer:
    """One uvicorn server on a thread named ``thread_name``; ``what`` names it in errors."""

    def __init__(self, thread_name: str, what: str) -> None:
        self.thread_name, self.what = thread_name, what
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self, app: Any, host: str, port: int = 0, *, timeout_s: float = 30.0, **config: Any) -> int:
        """Serve ``app`` on ``host:port`` (uvicorn settings in ``config``); returns the bound port
        once the server accepts connections."""
        # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
        # without it a reply's body waits for the client's delayed ACK of its headers (~40 ms).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise PlatformError(f"{self.what} cannot listen on {host}:{port}: {exc}") from exc
        bound = int(sock.getsockname()[1])
        settings = {"log_level": "warning", "lifespan": "off", "access_log": False, **config}
        self._server = uvicorn.Server(uvicorn.Config(app, **settings))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name=self.thread_name, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                sock.close()
                raise PlatformError(f"{self.what} did not start within {timeout_s:.0f} s")
            time.sleep(0.01)
        return bound

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._server, self._thread = None, None
