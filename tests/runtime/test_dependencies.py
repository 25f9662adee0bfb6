"""Declared dependencies under ``network: policy-only``, and a judge's failures classified to the judge.

A real judge (tests/judge_server.py) on this host's 127.0.0.1, real graders calling it with httpx
(sync and async), the openai client and urllib, through the real LocalRuntime.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator, Iterator
from http.server import ThreadingHTTPServer

import pytest

from plugtune.errors import HINTS, POLICY_REFUSED_HINT, DependencyCause, PluginCallError
from plugtune.runtime import LocalRuntime
from plugtune.runtime.function import Function
from plugtune.sdk import Policy, Runtime
from tests.judge_server import dead_port, judge
from tests.runtime.helpers import FIXTURES, ctx, entry, eventually, sample, trajectory

GRADERS = [
    "asks_judge",
    "asks_judge_async",
    "asks_judge_openai",
    "asks_judge_urllib",
    "asks_judge_requests",
    "asks_judge_aiohttp",
]


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadingHTTPServer]:
    with judge() as running:
        yield running


@pytest.fixture
async def rt() -> AsyncIterator[LocalRuntime]:
    async with LocalRuntime() as runtime:
        yield runtime


def _port(server: ThreadingHTTPServer) -> int:
    return int(server.server_address[1])


async def _fails(fn: Function, url: str) -> PluginCallError:
    with pytest.raises(PluginCallError) as info:
        await asyncio.wait_for(fn.invoke(ctx(), sample(url=url), trajectory()), 30)
    return info.value


@pytest.mark.parametrize("grader", GRADERS)
async def test_a_declared_judge_is_reached_at_its_own_url_under_policy_only(
    rt: LocalRuntime, server: ThreadingHTTPServer, grader: str
) -> None:
    port = _port(server)
    fn = await rt.deploy(entry("judge.py", grader), dependencies={"judge": f"http://127.0.0.1:{port}"})
    assert fn.runtime.network == "policy-only"
    for _ in range(2):  # a second call too (a kept-alive or a new connection)
        out = await asyncio.wait_for(
            fn.invoke(ctx(), sample(url=f"http://127.0.0.1:{port}/ok"), trajectory()), 30
        )
        assert (out.status, out.value) == ("success", 0.75)


async def test_a_plugins_decorator_declares_the_judge_it_calls(
    rt: LocalRuntime, server: ThreadingHTTPServer
) -> None:
    port = _port(server)
    fn = await rt.deploy(
        entry("judge.py", "declares_its_judge"), env={"JUDGE_URL": f"http://127.0.0.1:{port}"}
    )
    assert fn.runtime.dependencies == {"judge": f"http://127.0.0.1:{port}"}
    out = await asyncio.wait_for(
        fn.invoke(ctx(), sample(url=f"http://127.0.0.1:{port}/ok"), trajectory()), 30
    )
    assert out.value == 0.75
    error = await _fails(fn, f"http://127.0.0.1:{port}/429")
    assert (error.cause, error.to_dict()["dependency"]) == ("rate limited", "judge")


async def test_a_declared_host_name_resolves_inside_the_instance(
    rt: LocalRuntime, server: ThreadingHTTPServer
) -> None:
    """DNS for a declared name: the instance has no resolver of its own, yet the URL is unchanged."""
    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError:
        pytest.skip(f"this host's own name {name!r} does not resolve")
    if not address.startswith("127."):
        pytest.skip(f"this host's name resolves to {address}, where the test judge does not listen")
    port = _port(server)
    for grader in ("asks_judge", "asks_judge_async"):
        fn = await rt.deploy(entry("judge.py", grader), dependencies={"judge": f"http://{name}:{port}"})
        out = await asyncio.wait_for(
            fn.invoke(ctx(), sample(url=f"http://{name}:{port}/ok"), trajectory()), 30
        )
        assert out.value == 0.75


# (mode, the declared dependency it reaches, cause, what the message says)
MODES = [
    ("429", "judge", DependencyCause.RATE_LIMITED, "answered HTTP 429 (rate limited), Retry-After: 1"),
    ("500", "judge", DependencyCause.SERVER_ERROR, "answered HTTP 500 (server error)"),
    ("malformed", "judge", DependencyCause.BAD_REPLY, "sent a reply that does not parse (bad reply)"),
    ("down", "down", DependencyCause.UNREACHABLE, "could not be reached (unreachable)"),
    ("unknown host", "ghost", DependencyCause.UNREACHABLE, "could not be reached (unreachable)"),
]


@pytest.mark.parametrize("grader", GRADERS)
async def test_a_judges_failure_is_a_dependency_error_naming_it_and_the_plugins_line(
    rt: LocalRuntime, server: ThreadingHTTPServer, grader: str
) -> None:
    port, dead = _port(server), dead_port()
    addresses = {"judge": f"127.0.0.1:{port}", "down": f"127.0.0.1:{dead}", "ghost": f"judge.invalid:{port}"}
    fn = await rt.deploy(
        entry("judge.py", grader), dependencies={k: f"http://{v}" for k, v in addresses.items()}
    )
    request_line = _line_of(grader)
    for mode, dependency, cause, said in MODES:
        path = "ok" if dependency != "judge" else mode
        error = await _fails(fn, f"http://{addresses[dependency]}/{path}")
        if grader == "asks_judge_urllib" and mode == "malformed":
            # json.loads on bytes urllib returned: nothing ties the parse error to the judge
            assert (error.type, error.owner, error.cause) == ("Call plugin error", "plugin", "500")
            continue
        assert (error.type, error.owner, error.cause) == ("Dependency error", "dependency", cause.value), (
            mode,
            error.message,
        )
        assert error.message.startswith(f"the dependency {dependency} ({addresses[dependency]}) {said}"), (
            error.message
        )
        lines = "|".join(str(request_line + i) for i in range(3))  # the request, raise_for_status, .json()
        assert re.search(rf"at judge\.py:({lines})\b", error.message), error.message
        assert error.hint == HINTS[cause]
        assert error.to_dict()["dependency"] == dependency


def _line_of(grader: str) -> int:
    """The line of the fixture's grader that sends the judge its request."""
    lines = (FIXTURES / "judge.py").read_text().splitlines()
    start = next(i for i, text in enumerate(lines) if re.match(rf"(async )?def {grader}\(", text))
    markers = ("httpx.post", "client.post", "completions.create", "urlopen", "requests.post", "session.post")
    return next(i + 1 for i in range(start, len(lines)) if any(m in lines[i] for m in markers))


async def test_a_slow_judge_past_the_clients_timeout_is_a_dependency_timeout(
    rt: LocalRuntime, server: ThreadingHTTPServer
) -> None:
    port = _port(server)
    fn = await rt.deploy(entry("judge.py", "asks_judge_briefly"), dependencies={"judge": f"127.0.0.1:{port}"})
    error = await _fails(fn, f"http://127.0.0.1:{port}/slow")
    assert (error.type, error.owner, error.cause) == ("Dependency error", "dependency", "timeout")
    assert error.message.startswith(
        f"the dependency judge (127.0.0.1:{port}) did not answer in time (timeout: the client's own)"
    ), error.message
    assert "ReadTimeout" in error.message


@pytest.mark.parametrize("rollout", ["asks_policy_sdk", "asks_policy_openai"])
async def test_a_policy_that_fails_is_never_read_as_a_dependency(rt: LocalRuntime, rollout: str) -> None:
    """The policy gateway is the platform's: the same client errors on it are not a Dependency error."""
    policy = Policy(base_url=f"http://127.0.0.1:{dead_port()}/v1", api_key="k", timeout_s=3)
    fn = await rt.deploy(entry("judge.py", rollout), dependencies={"judge": "http://127.0.0.1:9"})
    with pytest.raises(PluginCallError) as info:
        await asyncio.wait_for(fn.invoke(ctx(), policy, sample()), 30)
    assert (info.value.type, info.value.owner) == ("Call plugin error", "plugin"), info.value.message


async def test_a_grader_that_catches_the_judges_failure_and_returns_none_stays_unscorable(
    rt: LocalRuntime, server: ThreadingHTTPServer
) -> None:
    port = _port(server)
    fn = await rt.deploy(entry("judge.py", "asks_judge_or_none"), dependencies={"judge": f"127.0.0.1:{port}"})
    for mode in ("429", "500"):
        out = await asyncio.wait_for(
            fn.invoke(ctx(), sample(url=f"http://127.0.0.1:{port}/{mode}"), trajectory()), 30
        )
        assert (out.status, out.value) == ("success", None)  # unscorable, never 0


async def test_an_undeclared_judge_is_refused_with_a_log_line_naming_it_and_how_to_declare_it(
    rt: LocalRuntime, server: ThreadingHTTPServer
) -> None:
    port = _port(server)
    before = server.requests  # type: ignore[attr-defined]
    for grader in ("asks_judge", "asks_judge_async", "asks_judge_openai"):
        fn = await rt.deploy(entry("judge.py", grader))
        error = await _fails(fn, f"http://127.0.0.1:{port}/ok")
        assert (error.type, error.owner, error.cause) == ("Call plugin error", "plugin", "500")
        assert f"network policy-only refused the connection to 127.0.0.1:{port}" in error.message or (
            f"network policy-only: refused a connection to 127.0.0.1:{port}" in error.message
        ), error.message
        assert error.hint == POLICY_REFUSED_HINT
        # the log line travels on the instance's channel: it may come after the reply
        await eventually(lambda: any("refused a connection" in x.message for x in fn.logs()))  # noqa: B023
        refused = [x.message for x in fn.logs() if "refused a connection" in x.message]
        assert refused and refused[0].startswith(
            f"network policy-only: refused a connection to 127.0.0.1:{port}: it is neither the policy "
            "nor a declared dependency of this function. Declare the service in job.yaml `dependencies:`"
        ), refused
        assert f"judge: http://127.0.0.1:{port}" in refused[0]
    unknown = await rt.deploy(entry("judge.py", "asks_judge"))
    error = await _fails(unknown, f"http://judge.invalid:{port}/ok")
    assert f"refused a connection to judge.invalid:{port}" in error.message
    assert server.requests == before  # type: ignore[attr-defined]  # nothing reached the judge
    own = await rt.deploy(entry("judge.py", "asks_own_server"))  # what is refused: not its own server
    assert (await asyncio.wait_for(own.invoke(ctx(), sample(), trajectory()), 30)).value == 1.0


def test_runtime_dependencies_are_checked_at_the_decorator() -> None:
    assert Runtime(dependencies={"judge": "http://127.0.0.1:8000"}).dependencies == {
        "judge": "http://127.0.0.1:8000"
    }
    with pytest.raises(
        ValueError, match=r"Runtime.dependencies=\['judge'\] must map names to a URL or host:port"
    ):
        Runtime(dependencies=["judge"])  # type: ignore[arg-type]


@pytest.mark.parametrize("grader", GRADERS)
async def test_a_judge_past_its_declared_timeout_is_a_dependency_timeout_whatever_the_client_waits(
    rt: LocalRuntime, server: ThreadingHTTPServer, grader: str
) -> None:
    """Each client waits 3 s; the judge answers after 2 s; the job declared timeout_s 0.4: the
    runtime ends the wait at 0.4 s, and the call is the dependency's timeout naming that bound."""
    port = _port(server)
    fn = await rt.deploy(
        entry("judge.py", grader),
        dependencies={"judge": {"url": f"http://127.0.0.1:{port}", "timeout_s": 0.4}},
    )
    started = asyncio.get_running_loop().time()
    error = await _fails(fn, f"http://127.0.0.1:{port}/wait/2")
    waited = asyncio.get_running_loop().time() - started
    assert (error.type, error.owner, error.cause) == ("Dependency error", "dependency", "timeout"), (
        error.message
    )
    assert error.message.startswith(
        f"the dependency judge (127.0.0.1:{port}) did not answer within its declared timeout_s (0.4 s)"
    ), error.message
    # not the judge's 2 s, nor the client's 3: the judge answers 2 s after the request arrived, so a
    # call that waited for it took 2 s or more; anything less is the declared bound ending the wait
    assert waited < 2.0, waited
    said = [x.message for x in fn.logs() if "did not begin its reply" in x.message]
    assert (
        said
        and f"the dependency judge at 127.0.0.1:{port} did not begin its reply within its declared "
        in said[0]
    )


async def test_a_judge_that_answers_within_its_declared_timeout_is_not_cut(
    rt: LocalRuntime, server: ThreadingHTTPServer
) -> None:
    port = _port(server)
    fn = await rt.deploy(
        entry("judge.py", "asks_judge"),
        dependencies={"judge": {"url": f"http://127.0.0.1:{port}", "timeout_s": 1.5}},
    )
    for path in ("wait/0.3", "ok"):  # a second request on the same instance re-arms the bound
        url = f"http://127.0.0.1:{port}/{path}"
        result = await asyncio.wait_for(fn.invoke(ctx(), sample(url=url), trajectory()), 30)
        assert result.status == "success", result
