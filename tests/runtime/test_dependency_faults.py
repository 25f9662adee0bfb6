"""``--inject`` dependency faults (issue 26.6): a connection to a declared dependency meets a 429, a
503, a refused connection or no answer in the ``policy-only`` relay, as from the service: the
plugin's own client sees it, and the call is classified as that dependency's, with its cause."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from http.server import ThreadingHTTPServer

import pytest

from plugtune.errors import PluginCallError
from plugtune.runtime import FaultInjection, LocalRuntime
from plugtune.runtime.bridge import request_complete
from tests.judge_server import judge, url_of
from tests.runtime.helpers import ctx, entry, sample, trajectory


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    with judge() as running:
        yield running


@pytest.fixture
async def rt() -> AsyncIterator[LocalRuntime]:
    async with LocalRuntime() as runtime:
        yield runtime


@pytest.mark.parametrize(
    ("fault", "cause", "said"),
    [
        ("dependency-429", "rate limited", "answered HTTP 429 (rate limited), Retry-After: 1"),
        ("dependency-5xx", "server error", "answered HTTP 503 (server error)"),
        ("dependency-unreachable", "unreachable", "(unreachable)"),
        ("dependency-hang", "timeout", "did not answer in time"),
    ],
)
async def test_an_injected_dependency_fault_is_met_by_the_plugins_client_and_classified_as_the_services(
    rt: LocalRuntime, server: ThreadingHTTPServer, fault: str, cause: str, said: str
) -> None:
    fn = await rt.deploy(
        entry("judge.py", "asks_judge"),
        dependencies={"judge": url_of(server, "")},
        inject=FaultInjection({fault: 1.0}),
    )
    with pytest.raises(PluginCallError) as info:
        await asyncio.wait_for(fn.invoke(ctx(), sample(url=url_of(server, "ok")), trajectory()), 30)
    error = info.value
    assert (error.type, error.owner, error.cause, error.dependency) == (
        "Dependency error",
        "dependency",
        cause,
        "judge",
    ), error.message
    assert said in error.message, error.message
    assert server.requests == 0  # type: ignore[attr-defined]  # the service itself was never asked
    said_injected = [x.message for x in fn.logs() if "injected fault" in x.message]
    assert said_injected and said_injected[0].startswith(f"injected fault {fault} (plugtune test --inject)")


async def test_dependency_faults_go_at_their_rate_and_call_faults_keep_theirs(
    rt: LocalRuntime, server: ThreadingHTTPServer
) -> None:
    """Half the connections meet a 429 (seeded), the rest reach the judge; no call fault is drawn."""
    fn = await rt.deploy(
        entry("judge.py", "asks_judge"),
        dependencies={"judge": url_of(server, "")},
        inject=FaultInjection({"dependency-429": 0.5}, seed=3),
    )
    results = [
        await asyncio.wait_for(
            asyncio.gather(
                fn.invoke(ctx(f"t{i}"), sample(url=url_of(server, "ok")), trajectory()),
                return_exceptions=True,
            ),
            30,
        )
        for i in range(20)
    ]
    failed = [r[0] for r in results if isinstance(r[0], BaseException)]
    assert all(isinstance(e, PluginCallError) and e.cause == "rate limited" for e in failed)
    assert 3 <= len(failed) <= 17 and server.requests == 20 - len(failed)  # type: ignore[attr-defined]


async def test_dependency_faults_need_the_policy_only_relay(
    rt: LocalRuntime, server: ThreadingHTTPServer
) -> None:
    with pytest.raises(
        ValueError, match="dependency faults are injected in the relay of `network: policy-only`"
    ):
        await rt.deploy(
            entry("judge.py", "asks_judge"),
            runtime={"network": "any"},
            dependencies={"judge": url_of(server, "")},
            inject=FaultInjection({"dependency-hang": 0.1}),
        )
    assert [f for f in rt.functions if f.status == "running"] == []


def test_an_injected_reply_waits_for_the_whole_request() -> None:
    head = b"POST /v1 HTTP/1.1\r\nHost: judge\r\nContent-Length: 5\r\n\r\n"
    assert not request_complete(head[:-2]) and not request_complete(head + b"{}")
    assert request_complete(head + b'{"a"}')
    chunked = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n"
    assert not request_complete(chunked) and request_complete(chunked + b"0\r\n\r\n")
    assert request_complete(b"x" * ((1 << 20) + 1))  # bounded: answered anyway


def test_fault_injection_checks_each_kind_of_rate_apart() -> None:
    FaultInjection({"timeout": 0.6, "dependency-429": 0.6})  # per call and per connection: both fine
    with pytest.raises(ValueError, match="the dependency fault rates add up to more than 1"):
        FaultInjection({"dependency-429": 0.6, "dependency-hang": 0.6})
    with pytest.raises(ValueError, match="dependency-unreachable"):
        FaultInjection({"dependency-down": 0.1})
