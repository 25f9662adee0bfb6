"""``PolicyRelay``: a tiny OpenAI-compatible server on 127.0.0.1 that stands in for the policy gateway.

Each trajectory gets its own key (as with the gateway); every ``POST /v1/chat/completions`` is
answered by a function — forwarding to another OpenAI-compatible endpoint (``--policy-url``), or
playing back a recorded trajectory (``plugtune replay``) — and the conversation is recorded per
trajectory, so a test shows what the rollout sent and received. No tokens are recorded.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from plugtune.sdk import Policy
from plugtune.types import TokenTrace

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 32 << 20


class RelayError(Exception):
    """An answer function's refusal: sent to the rollout as an OpenAI-style error reply."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


#: ``answer(trajectory_id, request_body) -> chat.completion reply``; raises RelayError to refuse.
Answer = Callable[[str, dict[str, Any]], dict[str, Any]]


@dataclass
class _Conversation:
    messages: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)


class PolicyRelay:
    """Serves ``answer`` over HTTP with per-trajectory keys; a ``PolicyServer`` for the GroupRunner."""

    def __init__(self, answer: Answer, model_name: str = "policy") -> None:
        self.answer = answer
        self.model_name = model_name
        self._keys: dict[str, str] = {}
        self._conversations: dict[str, _Conversation] = {}
        self._registry = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("start() the relay first")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    @property
    def weights_lock(self) -> AbstractContextManager[Any]:
        return nullcontext()

    def set_policy_version(self, version: int) -> None:
        return None

    def start(self) -> None:
        if self._server is not None:
            return
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="plugtune-relay", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(5.0)
        self._server, self._thread = None, None

    def __enter__(self) -> PolicyRelay:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def open(self, trajectory_id: str) -> Policy:
        key = "pt-relay-" + secrets.token_urlsafe(16)
        with self._registry:
            for old in [k for k, t in self._keys.items() if t == trajectory_id]:
                del self._keys[old]
            self._keys[key] = trajectory_id
            self._conversations[trajectory_id] = _Conversation()
        return Policy(base_url=self.base_url, api_key=key, model=self.model_name)

    def take(self, trajectory_id: str) -> TokenTrace:
        """The recorded conversation (no token ids). KeyError for an unknown id."""
        with self._registry:
            conversation = self._conversations.pop(trajectory_id)
            for old in [k for k, t in self._keys.items() if t == trajectory_id]:
                del self._keys[old]
        with conversation.lock:
            return TokenTrace(
                prompt_ids=[],
                response_ids=[],
                response_mask=[],
                response_logprobs=[],
                messages=list(conversation.messages),
                finish_reason=conversation.finish_reason,
            )

    def handle(self, key: str, body: dict[str, Any]) -> dict[str, Any]:
        with self._registry:
            trajectory_id = self._keys.get(key)
            conversation = self._conversations.get(trajectory_id) if trajectory_id is not None else None
        if trajectory_id is None or conversation is None:
            raise RelayError(401, "Incorrect API key: use the key of this trajectory (policy.api_key)")
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise RelayError(400, "'messages' must be a list of chat messages")
        if body.get("stream"):
            raise RelayError(400, "streaming is not supported by plugtune's test relay; use stream=False")
        with conversation.lock:  # one call at a time per trajectory, as the gateway does
            reply = self.answer(trajectory_id, body)
            choice = (reply.get("choices") or [{}])[0]
            conversation.messages = [*messages, dict(choice.get("message") or {})]
            conversation.finish_reason = str(choice.get("finish_reason") or "")
        return reply


def _handler_for(relay: PolicyRelay) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
            log.debug("relay: " + format, *args)

        def do_GET(self) -> None:  # the stdlib's name
            if self.path.rstrip("/").endswith("/models"):
                self._send(200, {"object": "list", "data": [{"id": relay.model_name, "object": "model"}]})
            else:
                self._send(404, _error(f"no route {self.path}"))

        def do_POST(self) -> None:
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, _error(f"no route {self.path}; use POST /v1/chat/completions"))
                return
            try:
                length = int(self.headers.get("content-length") or 0)
                if length > MAX_BODY_BYTES:
                    raise RelayError(413, "request body too large")
                body = json.loads(self.rfile.read(length) or b"{}")
                if not isinstance(body, dict):
                    raise RelayError(400, "the request body must be a JSON object")
                header = self.headers.get("authorization", "")
                key = header[len("Bearer ") :].strip() if header.lower().startswith("bearer ") else ""
                self._send(200, relay.handle(key, body))
            except RelayError as exc:
                self._send(exc.status, _error(exc.message))
            except (ValueError, UnicodeDecodeError) as exc:
                self._send(400, _error(f"the request body is not valid JSON: {exc}"))

        def _send(self, status: int, document: dict[str, Any]) -> None:
            data = json.dumps(document).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def _error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": None}}


def forward_to(base_url: str, api_key: str, model: str, timeout_s: float = 600.0) -> Answer:
    """An answer that forwards each request to another OpenAI-compatible endpoint."""
    url = base_url.rstrip("/") + "/chat/completions"

    def answer(trajectory_id: str, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps({**body, "model": model or body.get("model")}).encode()
        request = urllib.request.Request(
            url,
            data=data,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return dict(json.loads(response.read()))
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:2000].decode(errors="replace")
            raise RelayError(exc.code, f"{url} answered {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise RelayError(502, f"cannot reach the policy at {url}: {exc}") from None

    return answer


def completion(message: dict[str, Any], model: str, finish_reason: str | None = None) -> dict[str, Any]:
    """A chat.completion reply carrying ``message``."""
    reason = finish_reason or ("tool_calls" if message.get("tool_calls") else "stop")
    return {
        "id": "chatcmpl-" + secrets.token_hex(8),
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": reason, "logprobs": None}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }
