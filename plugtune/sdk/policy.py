"""``Policy``: how a rollout reaches the model being trained (the policy gateway)."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Any

from plugtune.sdk import _transport as transport


class PolicyError(RuntimeError):
    """Raised by ``Policy.chat`` / ``achat`` when the gateway answers with an error or cannot be reached."""


@dataclass(frozen=True)
class Policy:
    """An OpenAI-compatible endpoint with a per-trajectory key; tokens are recorded server-side.

    ``chat()`` / ``achat()`` are the cheapest path: they need no extra package and keep HTTP
    connections open between calls (``chat`` one per thread and server, ``achat`` a few per event
    loop and server: see ``plugtune.sdk._transport``), so a rollout's calls, and the next
    rollouts', skip the TCP handshake. ``openai()`` / ``async_openai()`` return the official
    client; building one costs tens of ms, so one base client is kept per process and server
    (and, for ``async_openai``, per event loop), and each trajectory gets a cheap copy with its
    own key (``with_options``) that shares the base client's connection pool.
    """

    base_url: str
    api_key: str
    model: str = "policy"
    timeout_s: float = 600.0

    def openai(self) -> Any:
        """A sync ``openai.OpenAI`` client bound to this trajectory (shares the process's pool)."""
        key = (self.base_url, self.timeout_s)
        base = _sync_clients.get(key)
        if base is None:
            import openai

            base = _sync_clients.setdefault(key, openai.OpenAI(**self._client_options()))
        return base.with_options(api_key=self.api_key)

    def async_openai(self) -> Any:
        """An ``openai.AsyncOpenAI`` client bound to this trajectory (shares the loop's pool).

        Outside a running event loop there is no loop to share with: a new client is built.
        """
        import openai

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return openai.AsyncOpenAI(**{**self._client_options(), "api_key": self.api_key})
        clients = _loop_clients(loop)
        key = (self.base_url, self.timeout_s)
        base = clients.get(key)
        if base is None:
            base = clients[key] = openai.AsyncOpenAI(**self._client_options())
        return base.with_options(api_key=self.api_key)

    def _client_options(self) -> dict[str, Any]:
        return {"base_url": self.base_url, "api_key": "-", "timeout": self.timeout_s, "max_retries": 0}

    def chat(self, messages: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
        """POST /chat/completions and return the JSON reply (stdlib only, blocking).

        Raises ``PolicyError`` with the gateway's message on an error reply, and when the
        gateway cannot be reached or does not answer within ``timeout_s``.
        """
        url, body, headers = self._request(messages, params)
        try:
            status, payload = transport.post(url, body, headers, self.timeout_s)
        except TimeoutError as exc:
            raise self._late() from exc
        except (OSError, http.client.HTTPException) as exc:
            raise self._unreachable(exc) from exc
        return self._reply(status, payload)

    async def achat(self, messages: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
        """``chat`` for ``async def`` rollouts, on the running event loop (no thread).

        Any number of calls can be in flight at once; each holds one of the loop's kept-alive
        connections while it waits. Same errors as ``chat``.
        """
        url, body, headers = self._request(messages, params)
        try:
            status, payload = await asyncio.wait_for(transport.apost(url, body, headers), self.timeout_s)
        except (asyncio.TimeoutError, TimeoutError) as exc:
            raise self._late() from exc
        except (OSError, http.client.HTTPException) as exc:
            raise self._unreachable(exc) from exc
        return self._reply(status, payload)

    @staticmethod
    def content(reply: dict[str, Any]) -> str:
        """The assistant text of a ``chat`` reply."""
        return str(reply["choices"][0]["message"].get("content") or "")

    def _request(
        self, messages: list[dict[str, Any]], params: dict[str, Any]
    ) -> tuple[urllib.parse.SplitResult, bytes, dict[str, str]]:
        url = urllib.parse.urlsplit(self.base_url.rstrip("/") + "/chat/completions")
        if url.scheme not in ("http", "https"):
            raise PolicyError(f"the policy base_url must start with http:// or https://, not {url.scheme!r}")
        body = json.dumps({"model": self.model, "messages": messages, **params}).encode()
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"}
        return url, body, headers

    def _reply(self, status: int, payload: bytes) -> dict[str, Any]:
        if status >= 400:
            raise PolicyError(f"policy gateway answered {status}: {payload.decode(errors='replace')}")
        try:
            return dict(json.loads(payload))
        except ValueError as exc:
            raise PolicyError(f"the policy gateway's reply is not JSON: {payload[:200]!r}") from exc

    def _late(self) -> PolicyError:
        return PolicyError(
            f"the policy gateway at {self.base_url} did not answer within {self.timeout_s:g} s"
        )

    def _unreachable(self, exc: BaseException) -> PolicyError:
        return PolicyError(f"cannot reach the policy gateway at {self.base_url}: {exc}")


# ---- the official clients: one base client per process and server (and event loop) ------------

_sync_clients: dict[tuple[str, float], Any] = {}
_loops_lock = threading.Lock()
_loops: dict[asyncio.AbstractEventLoop, dict[tuple[str, float], Any]] = {}


def _loop_clients(loop: asyncio.AbstractEventLoop) -> dict[tuple[str, float], Any]:
    """The base async clients of ``loop``; those of loops closed meanwhile are let go."""
    with _loops_lock:
        clients = _loops.get(loop)
        if clients is None:
            for closed in [other for other in _loops if other.is_closed()]:
                del _loops[closed]
            clients = _loops[loop] = {}
        return clients


def _forget_clients() -> None:
    """In a forked child: the parent's connections are not this process's to use."""
    _sync_clients.clear()
    _loops.clear()


os.register_at_fork(after_in_child=_forget_clients)
