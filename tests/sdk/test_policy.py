from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from plugtune.sdk import Policy, PolicyError


class Gateway(ThreadingHTTPServer):
    """A stand-in policy gateway that records which client connection sent each request."""

    daemon_threads = True
    request_queue_size = 64  # the listen backlog: many connections may arrive at once

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.requests: list[tuple[int, dict[str, Any]]] = []  # (client port, body)
        self.drop_after_reply = False  # close the connection silently, as an idle timeout does
        self.delay_s = 0.0
        self.status = 200
        self.framing = "length"  # how the reply's body is delimited: length | chunked | eof | garbage
        self.lock = threading.Condition()
        self.gather = 0  # answer nothing until this many requests are in flight together (30 s at most)
        self.in_flight = 0
        self.most_in_flight = 0  # requests being answered at one time, at most

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def ports(self) -> list[int]:
        return [port for port, _ in self.requests]

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up (the timeout test) leaves a broken pipe behind: expected


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive unless a side closes
    server: Gateway

    def do_POST(self) -> None:  # http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append((self.client_address[1], body))
        with self.server.lock:
            self.server.in_flight += 1
            self.server.most_in_flight = max(self.server.most_in_flight, self.server.in_flight)
            self.server.lock.notify_all()
            self.server.lock.wait_for(lambda: self.server.most_in_flight >= self.server.gather, timeout=30)
        time.sleep(self.server.delay_s)
        with self.server.lock:
            self.server.in_flight -= 1
        if self.server.status != 200:
            payload = json.dumps({"error": {"message": "max_tokens: must be positive"}}).encode()
        else:
            message = {"role": "assistant", "content": f"seen {len(body['messages'])}"}
            reply = {"choices": [{"message": message}], "auth": self.headers["Authorization"]}
            payload = json.dumps(reply).encode()
        framing = self.server.framing
        if framing == "garbage":
            self.wfile.write(b"SMTP ready\r\n\r\n")
            self.close_connection = True
            return
        self.send_response(self.server.status)
        self.send_header("Content-Type", "application/json")
        if framing == "length":
            self.send_header("Content-Length", str(len(payload)))
        elif framing == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if framing == "chunked":
            for i in range(0, len(payload), 7):
                piece = payload[i : i + 7]
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.wfile.write(payload)
        self.close_connection = self.server.drop_after_reply or framing == "eof"

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    server = Gateway()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


ASK = [{"role": "user", "content": "1+1?"}]


def test_calls_on_one_thread_share_one_connection_and_threads_do_not(gateway: Gateway) -> None:
    policy = Policy(gateway.base_url, "key-1")
    replies = [policy.chat(ASK, max_tokens=4) for _ in range(3)]
    assert [Policy.content(r) for r in replies] == ["seen 1"] * 3
    assert replies[0]["auth"] == "Bearer key-1"
    assert gateway.requests[0][1] == {"model": "policy", "messages": ASK, "max_tokens": 4}
    other_key = Policy(gateway.base_url, "key-2")  # another trajectory, same server: same connection
    assert other_key.chat(ASK)["auth"] == "Bearer key-2"
    assert len(set(gateway.ports())) == 1
    elsewhere = threading.Thread(target=policy.chat, args=(ASK,))
    elsewhere.start()
    elsewhere.join(10)
    assert len(gateway.requests) == 5 and len(set(gateway.ports())) == 2


def test_a_connection_the_server_closed_is_reopened_once(gateway: Gateway) -> None:
    policy = Policy(gateway.base_url, "key")
    gateway.drop_after_reply = True
    for _ in range(3):
        assert Policy.content(policy.chat(ASK)) == "seen 1"
    assert len(gateway.requests) == 3  # each request reached the server exactly once
    assert len(set(gateway.ports())) == 3


def test_an_error_reply_raises_policy_error_with_the_gateways_message(gateway: Gateway) -> None:
    policy = Policy(gateway.base_url, "key")
    gateway.status = 400
    with pytest.raises(PolicyError, match="answered 400: .*max_tokens: must be positive"):
        policy.chat(ASK, max_tokens=-1)
    gateway.status = 200
    assert Policy.content(policy.chat(ASK)) == "seen 1"


def test_the_timeout_is_honoured(gateway: Gateway) -> None:
    gateway.delay_s = 4.0  # far past the 0.2 s timeout, so a loaded machine's slowness stays between
    started = time.monotonic()
    with pytest.raises(PolicyError, match="did not answer within 0.2 s"):
        Policy(gateway.base_url, "key", timeout_s=0.2).chat(ASK)
    assert time.monotonic() - started < 3.0  # not the gateway's 4 s
    gateway.delay_s = 0.0
    assert Policy.content(Policy(gateway.base_url, "key", timeout_s=5).chat(ASK)) == "seen 1"


def test_an_unreachable_gateway_is_a_policy_error() -> None:
    with pytest.raises(PolicyError, match="cannot reach the policy gateway at http://127.0.0.1:9/v1"):
        Policy("http://127.0.0.1:9/v1", "key", timeout_s=2).chat(ASK)
    with pytest.raises(PolicyError, match="must start with http"):
        Policy("ftp://127.0.0.1:9/v1", "key").chat(ASK)


async def test_achat_calls_on_one_loop_reuse_a_connection_and_concurrent_calls_each_hold_one(
    gateway: Gateway,
) -> None:
    policy = Policy(gateway.base_url, "key")
    turns = [*ASK, {"role": "assistant", "content": "2"}, *ASK]
    replies = [await policy.achat(turns, max_tokens=4) for _ in range(3)]
    assert [Policy.content(r) for r in replies] == ["seen 3"] * 3 and replies[0]["auth"] == "Bearer key"
    assert gateway.requests[0][1] == {"model": "policy", "messages": turns, "max_tokens": 4}
    assert len(set(gateway.ports())) == 1
    gateway.gather = 4  # held until all four are in flight: none can free a connection for another
    together = await asyncio.gather(*(Policy(gateway.base_url, f"key-{i}").achat(ASK) for i in range(4)))
    assert sorted(r["auth"] for r in together) == [f"Bearer key-{i}" for i in range(4)]
    assert len(set(gateway.ports()[3:])) == 4  # one was idle, three were opened
    gateway.gather = 0
    await policy.achat(ASK)
    assert len(set(gateway.ports())) == 4  # and all four are kept for the next calls


async def test_many_achat_calls_are_in_flight_at_once(gateway: Gateway) -> None:
    # Not limited by a thread pool: a rollout's concurrent calls all reach the gateway together.
    # each answer waits until all sixteen have arrived (a fixed delay could end first on a busy machine)
    gateway.gather = 16
    replies = await asyncio.gather(*(Policy(gateway.base_url, "key").achat(ASK) for _ in range(16)))
    assert [Policy.content(r) for r in replies] == ["seen 1"] * 16
    assert gateway.most_in_flight == 16


async def test_achat_reopens_a_connection_the_server_closed_once(gateway: Gateway) -> None:
    policy = Policy(gateway.base_url, "key")
    gateway.drop_after_reply = True
    for _ in range(3):
        assert Policy.content(await policy.achat(ASK)) == "seen 1"
        await asyncio.sleep(0.05 if _ == 0 else 0)  # once noticed while idle, once only when asking
    assert len(gateway.requests) == 3 and len(set(gateway.ports())) == 3


async def test_achat_errors_are_policy_errors(gateway: Gateway) -> None:
    policy = Policy(gateway.base_url, "key")
    gateway.status = 400
    with pytest.raises(PolicyError, match="answered 400: .*max_tokens: must be positive"):
        await policy.achat(ASK, max_tokens=-1)
    gateway.status, gateway.delay_s = 200, 4.0  # far past the 0.2 s timeout (a loaded machine's margin)
    started = time.monotonic()
    with pytest.raises(PolicyError, match="did not answer within 0.2 s"):
        await Policy(gateway.base_url, "key", timeout_s=0.2).achat(ASK)
    assert time.monotonic() - started < 3.0  # not the gateway's 4 s
    gateway.delay_s = 0.0
    assert Policy.content(await policy.achat(ASK)) == "seen 1"  # the late call's connection was closed
    with pytest.raises(PolicyError, match="cannot reach the policy gateway at http://127.0.0.1:9/v1"):
        await Policy("http://127.0.0.1:9/v1", "key", timeout_s=2).achat(ASK)
    with pytest.raises(PolicyError, match="must start with http"):
        await Policy("ftp://127.0.0.1:9/v1", "key").achat(ASK)
    gateway.framing = "garbage"
    with pytest.raises(PolicyError, match="cannot reach the policy gateway.*SMTP ready"):
        await Policy(gateway.base_url, "key").achat(ASK)


async def test_a_cancelled_achat_leaves_no_half_read_reply_behind(gateway: Gateway) -> None:
    policy = Policy(gateway.base_url, "key")
    gateway.delay_s = 0.3
    call = asyncio.ensure_future(policy.achat(ASK * 2))
    await asyncio.sleep(0.1)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    gateway.delay_s = 0.0
    assert Policy.content(await policy.achat(ASK)) == "seen 1"  # not the cancelled call's "seen 2"


@pytest.mark.parametrize("framing", ["chunked", "eof"])
@pytest.mark.parametrize("calls", ["chat", "achat"])
def test_replies_in_chunks_or_to_the_end_of_the_connection_are_read_whole(
    gateway: Gateway, framing: str, calls: str
) -> None:
    gateway.framing = framing
    policy = Policy(gateway.base_url, "key")

    async def twice() -> list[dict[str, Any]]:
        return [await policy.achat(ASK * 3) for _ in range(2)]

    # the second call reuses the connection (chunked) or opens a new one (eof)
    replies = [policy.chat(ASK * 3) for _ in range(2)] if calls == "chat" else asyncio.run(twice())
    for reply in replies:
        assert Policy.content(reply) == "seen 3" and reply["auth"] == "Bearer key"
    assert len(set(gateway.ports())) == (1 if framing == "chunked" else 2)


def test_a_reply_that_is_not_http_is_a_policy_error(gateway: Gateway) -> None:
    gateway.framing = "garbage"
    with pytest.raises(PolicyError, match="cannot reach the policy gateway.*SMTP ready"):
        Policy(gateway.base_url, "key").chat(ASK)


def test_openai_clients_of_trajectories_share_a_connection_and_send_their_own_keys(
    gateway: Gateway,
) -> None:
    replies = []
    for key in ("key-1", "key-2", "key-3"):
        policy = Policy(gateway.base_url, key)
        replies.append(policy.openai().chat.completions.create(model=policy.model, messages=ASK))
    assert [r.model_extra["auth"] for r in replies] == ["Bearer key-1", "Bearer key-2", "Bearer key-3"]
    assert len(set(gateway.ports())) == 1  # one kept-alive connection, not one per trajectory


def test_async_openai_clients_share_a_connection_per_event_loop(gateway: Gateway) -> None:
    async def rollouts() -> list[str]:
        auths = []
        for key in ("key-1", "key-2"):
            policy = Policy(gateway.base_url, key)
            reply = await policy.async_openai().chat.completions.create(model=policy.model, messages=ASK)
            auths.append(reply.model_extra["auth"])
        return auths

    assert asyncio.run(rollouts()) == ["Bearer key-1", "Bearer key-2"]
    assert len(set(gateway.ports())) == 1
    assert asyncio.run(rollouts()) == ["Bearer key-1", "Bearer key-2"]  # a new loop: a new client
    assert len(set(gateway.ports())) == 2
