"""A declared dependency used carelessly or hostilely through the policy-only relay (its timeout_s
and concurrency budget): real plugins (tests/fixtures/plugins/hostile_deps.py) in the real
LocalRuntime against real servers on 127.0.0.1.

Defects these found: a request waiting for the concurrency budget was timed out (the wait counted
against timeout_s); a streamed reply that paused a second was cut while another request waited; a
connection opened and left silent held its slot forever (and a second one starved every later
request, whose client then timed out)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from plugtune.runtime import LocalRuntime
from plugtune.runtime.function import Function
from plugtune.runtime.reply_end import ReplyEnd
from tests.judge_server import judge
from tests.runtime.helpers import ctx, entry, sample, trajectory


@pytest.fixture
async def rt() -> AsyncIterator[LocalRuntime]:
    async with LocalRuntime() as runtime:
        yield runtime


@pytest.fixture
def judge_port() -> Iterator[int]:
    with judge() as running:
        yield int(running.server_address[1])


@pytest.fixture
def streamer() -> Iterator[int]:
    """GET: a chunked reply of three 'tick' chunks, 1.6 s apart; POST: {} at once."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.2)
    stop = threading.Event()

    def one(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            request = conn.recv(65536)
            if request.startswith(b"POST"):
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
                return
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
            for _ in range(3):
                if stop.wait(1.6):
                    return
                conn.sendall(b"4\r\ntick\r\n")
            conn.sendall(b"0\r\n\r\n")

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        thread.join(5)
        server.close()


def deps(port: int, **declared: Any) -> dict[str, Any]:
    return {"judge": {"url": f"http://127.0.0.1:{port}", **declared}}


async def call(fn: Function, **extra: Any) -> Any:
    return await asyncio.wait_for(fn.invoke(ctx(), sample(**extra), trajectory()), 40)


async def test_requests_waiting_for_the_budget_are_not_timed_out(rt: LocalRuntime, judge_port: int) -> None:
    """Four requests at once on concurrency 1, each answered in 0.6 s, timeout_s 1: the last
    waits 1.8 s for its slot, which is not the dependency's time (it was a 504 before)."""
    fn = await rt.deploy(
        entry("hostile_deps.py", "asks_at_once"), dependencies=deps(judge_port, timeout_s=1.0, concurrency=1)
    )
    result = await call(fn, url=f"http://127.0.0.1:{judge_port}/wait/0.6", n=4)
    assert result.status == "success", result


async def test_a_streamed_reply_that_pauses_is_not_cut_while_another_request_waits(
    rt: LocalRuntime, streamer: int
) -> None:
    """The stream's chunks come 1.6 s apart (longer than the budget's idle 1 s) on concurrency 1
    while a second request waits: the stream is read to its end, then the other is answered."""
    fn = await rt.deploy(
        entry("hostile_deps.py", "stream_while_another_waits"),
        dependencies=deps(streamer, timeout_s=3.0, concurrency=1),
    )
    base = f"http://127.0.0.1:{streamer}"
    result = await call(fn, url=f"{base}/s", other=f"{base}/p")
    assert result.status == "success", result


async def test_connections_left_silent_do_not_starve_the_budget(rt: LocalRuntime, judge_port: int) -> None:
    """A plugin opens two connections to the dependency (concurrency 1) and never sends a byte: a
    later request is answered within seconds (it waited until its client's 10 s timeout)."""
    declared = deps(judge_port, timeout_s=0.5, concurrency=1)
    leaves = await rt.deploy(entry("hostile_deps.py", "opens_and_leaves"), dependencies=declared)
    for _ in range(2):
        assert (await call(leaves, url=f"http://127.0.0.1:{judge_port}/ok")).status == "success"
    asks = await rt.deploy(entry("hostile_deps.py", "asks_at_once"), dependencies=declared)
    # n=0 asks nothing: its instance is started (a cold start on a busy machine takes seconds), so
    # the time below is the request's own wait for the slot
    assert (await call(asks, url=f"http://127.0.0.1:{judge_port}/ok", n=0)).status == "success"
    started = time.monotonic()
    result = await call(asks, url=f"http://127.0.0.1:{judge_port}/ok", n=1)
    assert result.status == "success", result
    # short of its client's 10 s timeout (the silent connections held the slot until then before)
    assert time.monotonic() - started < 8, "the silent connections held the slot"


async def test_held_keep_alive_after_an_idle_gap_a_slow_stream_and_a_late_first_request(
    rt: LocalRuntime, judge_port: int, streamer: int
) -> None:
    """What held: a kept-alive client's second request 1.5 s after its first (timeout_s 0.5) is not
    timed out; a reply that began and streams for 4.8 s (timeout_s 1) is read whole; a connection
    silent 1.5 s before its request (timeout_s 0.5) is answered."""
    declared = deps(judge_port, timeout_s=0.5)
    keep = await rt.deploy(entry("hostile_deps.py", "keep_alive_after_a_gap"), dependencies=declared)
    result = await call(keep, url=f"http://127.0.0.1:{judge_port}/ok", gap=1.5)
    assert result.status == "success", result
    stream = await rt.deploy(
        entry("hostile_deps.py", "reads_a_slow_stream"), dependencies=deps(streamer, timeout_s=1.0)
    )
    result = await call(stream, url=f"http://127.0.0.1:{streamer}/s")
    assert (result.status, result.value) == ("success", 3.0), result
    silent = await rt.deploy(entry("hostile_deps.py", "silent_then_asks"), dependencies=declared)
    result = await call(silent, url=f"http://127.0.0.1:{judge_port}/ok", gap=1.5)
    assert (result.status, result.value) == ("success", 1.0), result


def _fed(reply: bytes, request: bytes = b"POST / HTTP/1.1\r\n\r\n", step: int = 1) -> ReplyEnd:
    turns = ReplyEnd()
    turns.request(request)
    for at in range(0, len(reply), step):
        assert not turns.done or not reply[at:].strip(), (reply, at)
        turns.reply(reply[at : at + step])
    return turns


@pytest.mark.parametrize("step", [1, 3, 1 << 20])
def test_where_a_reply_ends(step: int) -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;x=1\r\ntick\r\n0\r\nX-T: 1\r\n\r\n"
    assert _fed(chunked, step=step).done
    assert not _fed(chunked[:-1], step=step).done
    assert _fed(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc", step=step).done
    assert not _fed(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nab", step=step).done
    continued = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n"
    assert _fed(continued, step=step).done
    bodiless = b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n"
    assert _fed(bodiless, request=b"HEAD / HTTP/1.1\r\n\r\n", step=step).done
    assert _fed(b"HTTP/1.1 200 OK\r\n\r\nto the close", step=step).unknown
    assert _fed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", step=step).unknown
    assert _fed(b"\x16\x03\x01 not http\r\n\r\n", step=step).unknown
