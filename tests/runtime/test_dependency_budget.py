"""Budgets of declared dependencies (issue 26.4): ``concurrency`` and ``rpm`` are shared by every
instance and plugin deployed on a runtime and hold under a burst; a 429 halves the concurrency in
use until calls succeed again (AIMD).

A real judge (tests/judge_server.py, which counts its requests in progress) on 127.0.0.1, real
graders calling it with httpx, through the real LocalRuntime (the supervisor's bridge enforces it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from http.server import ThreadingHTTPServer

import pytest

from plugtune.errors import PluginCallError
from plugtune.runtime import LocalRuntime
from plugtune.runtime.budget import MARGIN_S, WINDOW_S, DependencyBudget
from plugtune.sdk import Context
from tests.judge_server import judge, url_of
from tests.runtime.helpers import entry, sample, trajectory


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    with judge() as running:
        yield running


@pytest.fixture
async def rt() -> AsyncIterator[LocalRuntime]:
    async with LocalRuntime() as runtime:
        yield runtime


async def test_a_burst_of_64_calls_from_two_plugins_never_exceeds_the_declared_concurrency(
    rt: LocalRuntime, server: ThreadingHTTPServer
) -> None:
    judge_dep = {"judge": {"url": url_of(server, ""), "concurrency": 4}}
    plugins = [
        await rt.deploy(
            entry("judge.py", "asks_judge_logged"),
            runtime={"max_concurrency": 16, "max_instances": 2},
            dependencies=judge_dep,
        )
        for _ in range(2)
    ]
    calls = [
        plugins[i % 2].invoke(
            Context(job_id="j", trajectory_id=f"t{i}"), sample(url=url_of(server, "wait/0.2")), trajectory()
        )
        for i in range(64)
    ]
    started = time.monotonic()
    outcomes = await asyncio.wait_for(asyncio.gather(*calls), 120)
    took = time.monotonic() - started
    assert [o.value for o in outcomes] == [0.75] * 64
    assert server.requests == 64  # type: ignore[attr-defined]
    assert server.peak == 4, server.peak  # type: ignore[attr-defined]  # never more, and used in full
    assert took >= 64 * 0.2 / 4 * 0.9  # they really queued
    instances = {x.instance_id for fn in plugins for x in fn.logs() if "asking the judge" in x.message}
    assert len(instances) >= 2  # the budget held across instances (and the two plugins)


async def test_rpm_bounds_the_connections_opened_in_a_minute(
    rt: LocalRuntime, server: ThreadingHTTPServer
) -> None:
    """rpm 4 and 6 calls at once: 4 reach the judge, the other 2 wait in the bridge until their
    client's own 3 s timeout (the window frees a slot only 60 s after the first)."""
    fn = await rt.deploy(
        entry("judge.py", "asks_judge"),
        runtime={"max_concurrency": 8, "max_instances": 1},
        dependencies={"judge": {"url": url_of(server, ""), "rpm": 4}},
    )
    calls = [
        fn.invoke(Context(job_id="j", trajectory_id=f"t{i}"), sample(url=url_of(server, "ok")), trajectory())
        for i in range(6)
    ]
    results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 60)
    values = [r.value for r in results if not isinstance(r, BaseException)]
    errors = [r for r in results if isinstance(r, BaseException)]
    assert values == [0.75] * 4
    assert len(errors) == 2 and all(isinstance(e, PluginCallError) for e in errors)
    assert {(e.type, e.cause) for e in errors} == {("Dependency error", "timeout")}, errors  # type: ignore[attr-defined]
    assert server.requests == 4  # type: ignore[attr-defined]


async def test_a_429_halves_the_concurrency_in_use_until_calls_succeed_again(
    rt: LocalRuntime, server: ThreadingHTTPServer
) -> None:
    fn = await rt.deploy(
        entry("judge.py", "asks_judge_logged"),
        runtime={"max_concurrency": 16, "max_instances": 1},
        dependencies={"judge": {"url": url_of(server, ""), "concurrency": 8}},
    )
    budget = rt.backend.budgets.get(("127.0.0.1", server.server_address[1]))  # type: ignore[union-attr]
    assert budget is not None and budget.limit == 8
    with pytest.raises(PluginCallError) as info:
        await asyncio.wait_for(
            fn.invoke(Context(job_id="j"), sample(url=url_of(server, "429")), trajectory()), 30
        )
    assert info.value.cause == "rate limited"
    assert budget.limit == 4 and budget.decreases == 1  # multiplicative decrease
    before = server.peak  # type: ignore[attr-defined]
    calls = [
        fn.invoke(
            Context(job_id="j", trajectory_id=f"t{i}"), sample(url=url_of(server, "wait/0.3")), trajectory()
        )
        for i in range(4)
    ]
    # 8 calls: the first 4 run alone (the lowered limit), the next ones only as successes raise it
    calls += [
        fn.invoke(
            Context(job_id="j", trajectory_id=f"u{i}"), sample(url=url_of(server, "wait/0.3")), trajectory()
        )
        for i in range(4)
    ]
    outcomes = await asyncio.wait_for(asyncio.gather(*calls), 60)
    assert [o.value for o in outcomes] == [0.75] * 8
    assert max(before, 1) <= server.peak <= 5, server.peak  # type: ignore[attr-defined]  # not the declared 8
    for _ in range(40):  # additive increase: about one more per round of successes, up to 8
        await asyncio.wait_for(
            fn.invoke(Context(job_id="j"), sample(url=url_of(server, "ok")), trajectory()), 30
        )
    assert budget.limit == 8


async def test_a_budget_grants_in_order_and_gives_back_the_slot_of_a_cancelled_waiter() -> None:
    budget = DependencyBudget("judge", concurrency=2, rpm=None)
    await budget.acquire()
    await budget.acquire()
    third = asyncio.ensure_future(budget.acquire())
    fourth = asyncio.ensure_future(budget.acquire())
    await asyncio.sleep(0.01)
    assert (third.done(), fourth.done(), budget.waiting) == (False, False, 2)
    third.cancel()  # its plugin gave up
    await asyncio.sleep(0)
    budget.release()
    await asyncio.wait_for(fourth, 5)
    assert (budget.open, budget.peak, budget.waiting) == (2, 2, 0)


async def test_an_openai_client_per_call_never_closed_does_not_starve_on_its_idle_connections(
    rt: LocalRuntime, server: ThreadingHTTPServer
) -> None:
    """concurrency 1 and a grader that makes a new openai client per call and leaves its kept-alive
    connection open: the bridge closes an idle held connection when another waits, so each call
    gets the slot (they timed out at the client's 3 s before)."""
    fn = await rt.deploy(
        entry("judge.py", "asks_judge_openai"),
        runtime={"max_concurrency": 4, "max_instances": 1},
        dependencies={"judge": {"url": url_of(server, ""), "concurrency": 1}},
    )
    started = time.monotonic()
    for i in range(4):
        out = await asyncio.wait_for(
            fn.invoke(
                Context(job_id="j", trajectory_id=f"t{i}"), sample(url=url_of(server, "v1")), trajectory()
            ),
            30,
        )
        assert out.value == 0.75
    assert time.monotonic() - started < 4 * 2.5  # each waited at most about IDLE_S for the slot
    assert server.peak == 1  # type: ignore[attr-defined]
    budget = rt.backend.budgets.get(("127.0.0.1", server.server_address[1]))  # type: ignore[union-attr]
    assert budget is not None and budget.reaped >= 1


async def test_an_rpm_slot_frees_a_margin_after_its_minute_so_a_judge_counting_on_arrival_agrees() -> None:
    """The service starts its 60 s when the request arrives, a little after the bridge let the
    connection open: a slot freed at exactly 60 s on the bridge's clock was answered 429 by a judge
    holding the same rpm (benchmarks/judge_budget.py saw 6 of 40), so it frees MARGIN_S later."""
    now = [0.0]
    budget = DependencyBudget("judge", concurrency=None, rpm=2, clock=lambda: now[0])
    await budget.acquire()
    await budget.acquire()
    third = asyncio.ensure_future(budget.acquire())
    await asyncio.sleep(0)
    now[0] = WINDOW_S + MARGIN_S / 2
    budget.release()  # looks again: the minute is over, the margin is not
    await asyncio.sleep(0)
    assert not third.done() and MARGIN_S >= 0.5
    now[0] = WINDOW_S + MARGIN_S
    budget.release()
    await asyncio.wait_for(third, 5)
    assert budget.opened == 3
    if budget.timer is not None:
        budget.timer.cancel()
