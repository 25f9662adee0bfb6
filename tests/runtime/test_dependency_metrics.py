"""A function's metrics measure each declared dependency in the policy-only relay (issue 26.6):
requests per second, latency p50/p99 of its connections, the budget in use (open, limit, waiting),
errors by cause and the share rate limited, as ``dependency/<name>/...`` series, at most a fixed
number per declared dependency.

A real judge (tests/judge_server.py) on 127.0.0.1, real graders calling it with httpx through the
real LocalRuntime."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from http.server import ThreadingHTTPServer

import pytest

from plugtune.errors import PluginCallError
from plugtune.runtime import LocalRuntime
from plugtune.runtime import metrics as metrics_module
from plugtune.runtime.budget import DependencyBudget
from plugtune.runtime.function import Function
from plugtune.runtime.meter import RESERVOIR, SERIES_PER_DEPENDENCY, DependencyMeter
from plugtune.sdk import Context
from tests.judge_server import judge, url_of
from tests.runtime.helpers import entry, sample, trajectory


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    with judge() as running:
        yield running


@pytest.fixture
async def rt(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LocalRuntime]:
    """Sampled every 10 s from the start (not each second while young or failing): the tests'
    calls fall in one period, closed by flush_metrics()."""
    monkeypatch.setattr(metrics_module, "YOUNG_S", 0.0)
    monkeypatch.setattr(metrics_module, "FAILING_S", 0.0)
    async with LocalRuntime(metrics_period_s=10.0) as runtime:
        yield runtime


def series(fn: Function) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for point in fn.metrics():
        out.setdefault(point.name, []).append(point.value)
    return out


async def call(fn: Function, url: str, i: int) -> bool:
    try:
        await fn.invoke(Context(job_id="j", trajectory_id=f"t{i}"), sample(url=url), trajectory())
    except PluginCallError:
        return False
    return True


async def test_requests_latency_errors_and_the_429_share_of_a_judge_are_sampled(
    rt: LocalRuntime, server: ThreadingHTTPServer
) -> None:
    """8 calls answered after 0.2 s and 4 answered 429 in one period: 12 requests, p50 near 200 ms,
    4 rate limited (a third of the requests); the budget's declared concurrency is the limit, halved
    by the 429s; nothing waits once the calls are done. The other declared dependency, never
    called, has its series at 0; nothing else is a dependency series."""
    fn = await rt.deploy(
        entry("judge.py", "asks_judge"),
        runtime={"max_concurrency": 8, "max_instances": 1},
        dependencies={
            "judge": {"url": url_of(server, ""), "concurrency": 8},
            "other": "http://127.0.0.1:9",
        },
    )
    fn.flush_metrics()  # the period starts now: only these calls are in it
    started = time.monotonic()
    ok = await asyncio.gather(*(call(fn, url_of(server, "wait/0.2"), i) for i in range(8)))
    limited = await asyncio.gather(*(call(fn, url_of(server, "429"), 10 + i) for i in range(4)))
    assert ok == [True] * 8 and limited == [False] * 4
    took = time.monotonic() - started
    fn.flush_metrics()
    got = series(fn)
    last = {name: values[-1] for name, values in got.items() if name.startswith("dependency/")}
    assert last["dependency/judge/requests_per_s"] * took == pytest.approx(12, rel=0.35), (last, took)
    assert 180 <= last["dependency/judge/latency_p50_ms"] < 1500, last
    assert last["dependency/judge/latency_p99_ms"] >= last["dependency/judge/latency_p50_ms"]
    assert last["dependency/judge/rate_limited_share"] == pytest.approx(4 / 12), last
    assert last["dependency/judge/errors/rate limited"] > 0
    assert last["dependency/judge/errors/server error"] == 0
    assert last["dependency/judge/limit"] < 8  # the 429s halved the concurrency in use
    assert last["dependency/judge/waiting"] == 0
    assert last["dependency/other/requests_per_s"] == 0
    assert "dependency/other/latency_p50_ms" not in last  # no connection: no latency to show
    assert "dependency/other/limit" not in last  # no declared concurrency: no AIMD limit
    names = {n for n in got if n.startswith("dependency/")}
    assert {n.split("/")[1] for n in names} == {"judge", "other"}
    assert len([n for n in names if n.startswith("dependency/judge/")]) == SERIES_PER_DEPENDENCY


async def test_a_retry_the_plugin_raised_on_a_429_counts_as_rate_limited(
    rt: LocalRuntime, server: ThreadingHTTPServer
) -> None:
    """The grader catches the judge's 429 and raises Retry: the call returns (status retry), yet it
    failed on the judge: counted under rate limited, and it halves the concurrency in use."""
    fn = await rt.deploy(
        entry("judge.py", "retries_when_judge_fails"),
        dependencies={"judge": {"url": url_of(server, ""), "concurrency": 4}},
    )
    fn.flush_metrics()
    outcome = await fn.invoke(
        Context(job_id="j", trajectory_id="t1"), sample(url=url_of(server, "429")), trajectory()
    )
    assert outcome.status == "retry"
    fn.flush_metrics()
    last = {p.name: p.value for p in fn.metrics()}
    assert last["dependency/judge/errors/rate limited"] > 0
    assert last["dependency/judge/rate_limited_share"] == 1.0
    assert last["dependency/judge/limit"] == 2  # halved from 4, not raised as a success


async def test_a_plugin_cannot_make_series_of_its_own_choosing(
    rt: LocalRuntime, server: ThreadingHTTPServer
) -> None:
    """Calls to an undeclared address (refused) and causes outside the taxonomy add no series."""
    fn = await rt.deploy(
        entry("judge.py", "asks_judge"),
        dependencies={"judge": url_of(server, "")},
    )
    assert not await call(fn, "http://127.0.0.1:9/undeclared", 1)
    bridge = fn.deployment.bridge  # type: ignore[attr-defined]
    bridge.meters["judge"].failed("made up cause")
    fn.flush_metrics()
    names = {p.name for p in fn.metrics() if p.name.startswith("dependency/")}
    assert {n.split("/")[1] for n in names} == {"judge"}
    assert len(names) == SERIES_PER_DEPENDENCY - 3  # no limit (none declared), no latency (no request)


def test_the_latency_reservoir_is_bounded_and_keeps_the_spread() -> None:
    """10 000 connections in one period: the reservoir keeps RESERVOIR durations, drawn uniformly,
    so p50 and p99 stay those of all of them."""
    meter = DependencyMeter("judge", DependencyBudget("judge", None, None), seed=7)
    for i in range(10_000):
        meter.closed(i / 1000)  # 0 to 10 s
    assert len(meter.durations_ms) == RESERVOIR
    values = meter.sample()
    assert values["dependency/judge/latency_p50_ms"] == pytest.approx(5000, rel=0.1)
    assert values["dependency/judge/latency_p99_ms"] == pytest.approx(9900, rel=0.02)
    assert meter.durations_ms == [] and meter.seen == 0
