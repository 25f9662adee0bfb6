"""``Policy``: how a rollout reaches the model being trained (the policy gateway)."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Any, ClassVar


class PolicyError(RuntimeError):
    """Raised by ``Policy.chat`` when the gateway answers with an error or cannot be reached."""


# A reused keep-alive connection that the server has meanwhile closed fails in one of these ways
# before any reply arrives; the request is then sent once more on a fresh connection.
_STALE_CONNECTION = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


@dataclass(frozen=True)
class Policy:
    """An OpenAI-compatible endpoint with a per-trajectory key; tokens are recorded server-side.

    Use ``openai()`` / ``async_openai()`` for the official client, or ``chat()`` / ``achat()``,
    which need no extra package. ``chat`` keeps one HTTP connection open per thread and server,
    so a rollout's calls (and the next rollouts run on the same thread) skip the TCP handshake.
    """

    base_url: str
    api_key: str
    model: str = "policy"
    timeout_s: float = 600.0

    # Per thread: (scheme, host:port) -> an open keep-alive connection.
    _connections: ClassVar[threading.local] = threading.local()

    def openai(self) -> Any:
        """A sync ``openai.OpenAI`` client bound to this trajectory."""
        import openai

        return openai.OpenAI(
            base_url=self.base_url, api_key=self.api_key, timeout=self.timeout_s, max_retries=0
        )

    def async_openai(self) -> Any:
        """An ``openai.AsyncOpenAI`` client bound to this trajectory."""
        import openai

        return openai.AsyncOpenAI(
            base_url=self.base_url, api_key=self.api_key, timeout=self.timeout_s, max_retries=0
        )

    def chat(self, messages: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
        """POST /chat/completions and return the JSON reply (stdlib only, blocking).

        Raises ``PolicyError`` with the gateway's message on an error reply, and when the
        gateway cannot be reached or does not answer within ``timeout_s``.
        """
        body = json.dumps({"model": self.model, "messages": messages, **params}).encode()
        url = urllib.parse.urlsplit(self.base_url.rstrip("/") + "/chat/completions")
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"}
        try:
            status, payload = self._post(url, body, headers)
        except TimeoutError as exc:
            raise PolicyError(
                f"the policy gateway at {self.base_url} did not answer within {self.timeout_s:g} s"
            ) from exc
        except (OSError, http.client.HTTPException) as exc:
            raise PolicyError(f"cannot reach the policy gateway at {self.base_url}: {exc}") from exc
        if status >= 400:
            raise PolicyError(f"policy gateway answered {status}: {payload.decode(errors='replace')}")
        try:
            return dict(json.loads(payload))
        except ValueError as exc:
            raise PolicyError(f"the policy gateway's reply is not JSON: {payload[:200]!r}") from exc

    async def achat(self, messages: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
        """``chat`` for ``async def`` rollouts: runs the request off the event loop."""
        return await asyncio.to_thread(self.chat, messages, **params)

    @staticmethod
    def content(reply: dict[str, Any]) -> str:
        """The assistant text of a ``chat`` reply."""
        return str(reply["choices"][0]["message"].get("content") or "")

    def _post(self, url: urllib.parse.SplitResult, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        """Status and body of one POST, on this thread's open connection when there is one."""
        pool = _thread_pool(self._connections)
        key = (url.scheme, url.netloc)
        conn = pool.get(key)
        reused = conn is not None and conn.sock is not None
        if conn is None:
            conn = pool[key] = _connect(url, self.timeout_s)
        path = url.path + (f"?{url.query}" if url.query else "")
        try:
            try:
                return _exchange(conn, path, body, headers, self.timeout_s)
            except _STALE_CONNECTION:
                if not reused:
                    raise
                conn.close()
                return _exchange(conn, path, body, headers, self.timeout_s)
        except BaseException:
            conn.close()  # never leave a half-sent request or half-read reply for the next call
            raise


def _thread_pool(local: threading.local) -> dict[tuple[str, str], http.client.HTTPConnection]:
    pool: dict[tuple[str, str], http.client.HTTPConnection] | None = getattr(local, "pool", None)
    if pool is None:
        pool = local.pool = {}
    return pool


def _connect(url: urllib.parse.SplitResult, timeout_s: float) -> http.client.HTTPConnection:
    if url.scheme == "https":
        return http.client.HTTPSConnection(url.netloc, timeout=timeout_s)
    if url.scheme == "http":
        return http.client.HTTPConnection(url.netloc, timeout=timeout_s)
    raise PolicyError(f"the policy base_url must start with http:// or https://, not {url.scheme!r}")


def _exchange(
    conn: http.client.HTTPConnection, path: str, body: bytes, headers: dict[str, str], timeout_s: float
) -> tuple[int, bytes]:
    conn.timeout = timeout_s
    sock: socket.socket | None = conn.sock
    if sock is None:
        conn.connect()
        sock = conn.sock
        # http.client sends the headers and the body in two writes: without TCP_NODELAY the body
        # waits for the server's delayed ACK of the headers (tens of ms per request).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(timeout_s)
    conn.request("POST", path, body=body, headers=headers)
    response = conn.getresponse()
    return response.status, response.read()
