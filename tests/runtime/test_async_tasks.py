"""Async plugins run inside a real asyncio task in the worker, from their first line: the libraries
real plugins use (the openai client, httpx, anyio/sniffio, asyncio.timeout) work there."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator

import pytest

from plugtune.errors import Cause, PluginCallError
from plugtune.runtime import LocalRuntime
from plugtune.sdk import Policy
from tests.runtime.helpers import ctx, entry, eventually, sample, trajectory
from tests.sdk.test_policy import Gateway

PLUGINS = "async_clients.py"


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


@pytest.fixture
async def rt() -> AsyncIterator[LocalRuntime]:
    async with LocalRuntime() as runtime:
        yield runtime


async def test_the_official_openai_client_works_in_a_rollout(rt: LocalRuntime, gateway: Gateway) -> None:
    fn = await rt.deploy(entry(PLUGINS, "openai_rollout"))
    for key in ("key-1", "key-2"):  # the second call starts as eagerly as the first one did
        out = await fn.invoke(ctx(), Policy(gateway.base_url, key), sample())
        assert out.status == "success" and out.value["messages"][-1]["content"] == "seen 1"
    assert [body["max_tokens"] for _, body in gateway.requests] == [4, 4]


async def test_httpx_async_client_works_in_an_async_grader(rt: LocalRuntime, gateway: Gateway) -> None:
    fn = await rt.deploy(entry(PLUGINS, "httpx_grader"), runtime={"network": "any"})  # a host URL
    url = gateway.base_url + "/chat/completions"
    assert (await fn.invoke(ctx(), sample(url=url), trajectory())).value == 1.0


async def test_asyncio_timeout_as_the_first_await_works_and_fires(rt: LocalRuntime) -> None:
    fn = await rt.deploy(entry(PLUGINS, "timeout_first"))
    assert (await fn.invoke(ctx(), sample(), trajectory())).value == 1.0
    with pytest.raises(PluginCallError, match="TimeoutError") as info:
        await fn.invoke(ctx(), sample(within=0.05, sleep=5.0), trajectory())
    assert info.value.cause == Cause.ERROR_500.value  # the plugin's own timeout, raised in the plugin


@pytest.mark.parametrize("function", ["where_awaiting", "where_never_awaiting"])
async def test_current_task_and_sniffio_see_asyncio_before_and_after_the_first_await(
    rt: LocalRuntime, function: str
) -> None:
    fn = await rt.deploy(entry(PLUGINS, function))
    lone = await fn.invoke(ctx(), sample(), trajectory())  # alone: started eagerly
    together = await asyncio.gather(*(fn.invoke(ctx(), sample(), trajectory()) for _ in range(8)))
    for out in (lone, *together):
        assert out.value == 1.0, [line.message for line in out.logs]


async def test_a_call_past_its_deadline_is_a_timeout_and_its_coroutine_is_cancelled(rt: LocalRuntime) -> None:
    fn = await rt.deploy(entry(PLUGINS, "waits_to_be_cancelled"))  # timeout_s=0.5
    with pytest.raises(PluginCallError) as info:
        await fn.invoke(ctx(), sample(), trajectory())
    assert info.value.cause == Cause.TIMEOUT.value
    assert await eventually(lambda: any(line.message == "cancelled at its first await" for line in fn.logs()))
