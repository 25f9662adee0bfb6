"""How a job's caller handles a call that failed on a declared dependency (issue 26.3): retried on the
same instance after a backoff that honours the judge's ``Retry-After``, apart from the plugin's own
``max_attempts``, never tripping the circuit breaker, and bounded by ``failure_policy.dependency``.

A real judge (tests/judge_server.py) on 127.0.0.1, a real grader calling it with httpx, the real
LocalRuntime and the job's real ``PolicyCaller``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Iterator
from http.server import ThreadingHTTPServer

import pytest

from plugtune.errors import DependencyCallError, DependencyCause
from plugtune.jobs.caller import JobStop, PolicyCaller
from plugtune.runtime import LocalRuntime
from plugtune.runtime.function import Function
from plugtune.sdk import Context
from plugtune.spec.models import CircuitBreaker, DependencyRetry, FailurePolicy
from tests.judge_server import dead_port, judge, url_of
from tests.runtime.helpers import entry, sample, trajectory


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    with judge() as running:
        yield running


@pytest.fixture
async def rt() -> AsyncIterator[LocalRuntime]:
    async with LocalRuntime() as runtime:
        yield runtime


async def _deploy(rt: LocalRuntime, server: ThreadingHTTPServer, **runtime: int) -> Function:
    return await rt.deploy(
        entry("judge.py", "asks_judge_logged"),
        runtime=runtime,
        dependencies={"judge": f"http://127.0.0.1:{server.server_address[1]}"},
    )


def _tries(fn: Function, tid: str) -> list[str]:
    """The instance of each try of trajectory ``tid``, in order (the grader logs one line a try)."""
    return [x.instance_id for x in fn.logs() if x.trajectory_id == tid and "asking the judge" in x.message]


async def test_a_call_rate_limited_by_its_judge_is_retried_after_retry_after_on_the_same_instance(
    rt: LocalRuntime, server: ThreadingHTTPServer
) -> None:
    fn = await _deploy(rt, server, max_concurrency=1, min_instances=2, max_instances=2)
    caller = PolicyCaller(FailurePolicy())
    # the busy call takes the first instance; the flaky one runs on the other, gets a 429 with
    # Retry-After: 1, and when it is retried both are idle (the first would be picked by default)
    busy = caller(
        fn, Context(job_id="j", trajectory_id="busy"), sample(url=url_of(server, "wait/0.3")), trajectory()
    )
    flaky = caller(
        fn, Context(job_id="j", trajectory_id="flaky"), sample(url=url_of(server, "flaky/f/1")), trajectory()
    )
    started = time.monotonic()
    outcomes = await asyncio.wait_for(asyncio.gather(busy, flaky), 60)
    assert [o.value for o in outcomes] == [0.75, 0.75]
    await asyncio.sleep(0.2)  # the log lines travel on the instances' channels
    arrivals = [t for t, path in server.log if path == "/flaky/f/1"]  # type: ignore[attr-defined]
    assert len(arrivals) == 2, server.log  # type: ignore[attr-defined]
    assert arrivals[1] - arrivals[0] >= 1.0, arrivals  # waited at least the judge's Retry-After
    assert time.monotonic() - started < 30
    flaky_tries, busy_tries = _tries(fn, "flaky"), _tries(fn, "busy")
    assert len(flaky_tries) == 2 and len(busy_tries) == 1, (flaky_tries, busy_tries)
    assert flaky_tries[0] != busy_tries[0]  # the two calls ran side by side on the two instances
    assert flaky_tries[1] == flaky_tries[0]  # the retry went back to the healthy instance it ran on
    assert outcomes[1].instance_id == flaky_tries[0]
    assert caller.retries == 1 and caller.dependency_waited_s >= 1.0
    assert caller.outages == {}  # the judge answered again: no outage to wait for


async def test_a_short_429_storm_does_not_trip_the_circuit_breaker(
    rt: LocalRuntime, server: ThreadingHTTPServer
) -> None:
    """16 calls, each rate limited twice (Retry-After: 1) before the judge answers: all succeed,
    after 48 tries of which 32 failed on the judge, and the breaker (trips above 50%) holds."""
    fn = await _deploy(rt, server, max_concurrency=16, max_instances=1)
    caller = PolicyCaller(FailurePolicy())
    calls = [
        caller(
            fn,
            Context(job_id="j", trajectory_id=f"t{i}"),
            sample(url=url_of(server, f"flaky/k{i}/2")),
            trajectory(),
        )
        for i in range(16)
    ]
    outcomes = await asyncio.wait_for(asyncio.gather(*calls), 90)
    assert [o.value for o in outcomes] == [0.75] * 16
    counts = caller.take_counts(0)
    assert (counts.calls, dict(counts.errors), dict(counts.dependency_errors)) == (
        48,
        {"rate limited": 32},
        {"rate limited": 32},
    )
    assert counts.breaker_error(CircuitBreaker()) is None
    assert server.requests == 48  # type: ignore[attr-defined]


async def test_a_judge_that_stays_down_fails_the_job_as_the_dependencys_after_the_bound(
    rt: LocalRuntime, server: ThreadingHTTPServer
) -> None:
    dead = dead_port()
    fn = await rt.deploy(
        entry("judge.py", "asks_judge_logged"), dependencies={"judge": f"http://127.0.0.1:{dead}"}
    )
    policy = FailurePolicy(max_attempts=1, dependency=DependencyRetry(max_attempts=4, backoff_s=0.1))
    caller = PolicyCaller(policy)
    started = time.monotonic()
    with pytest.raises(JobStop) as info:
        await asyncio.wait_for(
            caller(
                fn,
                Context(job_id="j", trajectory_id="d"),
                sample(url=f"http://127.0.0.1:{dead}/ok"),
                trajectory(),
            ),
            60,
        )
    took = time.monotonic() - started
    error = info.value.error
    assert isinstance(error, DependencyCallError)
    assert (error.type, error.owner, error.cause, error.dependency) == (
        "Dependency error",
        "dependency",
        "unreachable",
        "judge",
    )
    assert info.value.reason.startswith("dependency judge: 4 tries in "), info.value.reason
    assert caller.retries == 3  # max_attempts=1 is the plugin's own: the dependency's retries are apart
    assert [(name, o.cause) for name, o in caller.outages.items()] == [("judge", "unreachable")]
    assert caller.waiting(now=caller.outages["judge"].since + 10) == caller.outages  # down_after_s 10
    assert 0.35 <= caller.dependency_waited_s <= took  # 0.05-0.1 + 0.1-0.2 + 0.2-0.4 s of backoff
    # the time bound: a Retry-After past max_wait_s ends the call at its first failure
    policy = FailurePolicy(dependency=DependencyRetry(max_wait_s=0.5))
    fn = await _deploy(rt, server)
    started = time.monotonic()
    with pytest.raises(JobStop) as info:
        await asyncio.wait_for(
            PolicyCaller(policy)(
                fn, Context(job_id="j", trajectory_id="r"), sample(url=url_of(server, "429")), trajectory()
            ),
            60,
        )
    assert info.value.error.cause == "rate limited"
    assert "max_wait_s 0.5" in info.value.reason
    assert time.monotonic() - started < 1.0  # it did not wait the Retry-After it could not use


def test_the_backoff_doubles_with_jitter_is_capped_and_never_shorter_than_retry_after() -> None:
    caller = PolicyCaller(
        FailurePolicy(
            dependency=DependencyRetry(max_attempts=10, backoff_s=1, max_backoff_s=4, max_wait_s=1000)
        ),
        rng=random.Random(7),
    )
    for tries, step in [(1, 1), (2, 2), (3, 4), (4, 4), (9, 4)]:
        delays = [caller.dependency_delay(None, tries, 0.0) for _ in range(200)]
        assert all(d is not None and step / 2 <= d <= step for d in delays), (tries, min(delays), max(delays))  # type: ignore[operator]
        assert max(delays) - min(delays) > step / 4  # type: ignore[operator]  # jittered, not fixed
    assert caller.dependency_delay(None, 10, 0.0) is None  # max_attempts used up
    assert caller.dependency_delay(None, 1, 999.8) is None  # max_wait_s used up
    limited = DependencyCallError(DependencyCause.RATE_LIMITED, "429", dependency="judge", retry_after_s=7.5)
    assert (
        caller.dependency_delay(limited.retry_after_s, 1, 0.0) == 7.5
    )  # longer than max_backoff_s: Retry-After wins


async def test_a_plugins_retry_on_its_judges_429_gets_the_dependency_backoff(
    rt: LocalRuntime, server: ThreadingHTTPServer
) -> None:
    fn = await rt.deploy(
        entry("judge.py", "retries_when_judge_fails"),
        dependencies={"judge": f"http://127.0.0.1:{server.server_address[1]}"},
    )
    caller = PolicyCaller(FailurePolicy())
    outcome = await asyncio.wait_for(
        caller(
            fn, Context(job_id="j", trajectory_id="r"), sample(url=url_of(server, "flaky/r/2")), trajectory()
        ),
        60,
    )
    assert (outcome.status, outcome.value) == ("success", 0.75)
    arrivals = [t for t, path in server.log if path == "/flaky/r/2"]  # type: ignore[attr-defined]
    assert len(arrivals) == 3
    assert all(b - a >= 1.0 for a, b in zip(arrivals, arrivals[1:], strict=False)), (
        arrivals
    )  # each waited Retry-After
    counts = caller.take_counts(0)
    assert dict(counts.dependency_errors) == {"Status retry": 2}
    assert counts.breaker_error(CircuitBreaker(min_calls=1)) is None  # 2 of 3 calls, yet not the plugin's
    await asyncio.sleep(0.2)
    tries = _tries(fn, "r")
    assert len(tries) == 3 and len(set(tries)) == 1
