"""InProcessRuntime: the same surface and taxonomy, without processes."""

from __future__ import annotations

import pytest

from plugtune.errors import Cause, PluginCallError
from plugtune.runtime import FaultInjection, InProcessRuntime
from plugtune.runtime.demo import run_demo
from tests.runtime.helpers import ctx, entry, sample, trajectory


async def test_same_results_statuses_and_logs() -> None:
    async with InProcessRuntime() as rt:
        fn = await rt.deploy(entry("basic.py", "exact"))
        out = await fn.invoke(ctx(), sample(), trajectory("42"))
        assert (out.status, out.value, out.metrics) == ("success", 1.0, {"length": 2.0})
        assert [line.message for line in out.logs] == ["grading traj-1"]
        assert out.logs[0].call_id == out.call_id and fn.code_hash and "basic.py" in fn.code()
        retry = await rt.deploy(entry("basic.py", "asks_retry"))
        assert (await retry.invoke(ctx(), sample(), trajectory())).status == "retry"
        ranks = await rt.deploy(entry("basic.py", "ranks"))
        assert (await ranks.invoke(ctx(), sample(), [trajectory(), trajectory()])).value == [0.0, 1.0]


@pytest.mark.parametrize(
    ("function", "cause"),
    [
        ("raises", Cause.ERROR_500),
        ("raises_async", Cause.ERROR_500),
        ("returns_nan", Cause.INVALID_REWARD),
        ("returns_bool", Cause.INVALID_REWARD),
        ("awaits_forever", Cause.TIMEOUT),
        ("calls_sys_exit", Cause.EOF),
        ("exits_hard", Cause.EOF),  # in the call's own process: this one goes on
        ("segfaults", Cause.EOF),
        ("raises_memory_error", Cause.OOM),
    ],
)
async def test_failures_have_the_same_causes(function: str, cause: Cause) -> None:
    async with InProcessRuntime() as rt:
        fn = await rt.deploy(entry("faults.py", function))
        with pytest.raises(PluginCallError) as info:
            await fn.invoke(ctx(), sample(fail=True), trajectory())
        assert info.value.cause == cause.value
        assert any(line.message.startswith("about to") for line in info.value.logs)  # type: ignore[attr-defined]
        assert (await fn.invoke(ctx(), sample(fail=False), trajectory())).status == "success"


async def test_user_traceback_and_bad_plugins() -> None:
    async with InProcessRuntime() as rt:
        fn = await rt.deploy(entry("faults.py", "raises"))
        with pytest.raises(PluginCallError) as info:
            await fn.invoke(ctx(), sample(fail=True), trajectory())
        assert info.value.traceback.splitlines()[0].startswith("faults.py:")
        for bad in ("syntax_error.py", "setup_fails.py", "bad_signature.py"):
            with pytest.raises(PluginCallError) as info:
                await rt.deploy(entry(bad, "score"))
            assert info.value.cause == Cause.CREATE_FAULT.value and bad in info.value.message


async def test_injected_faults_are_classified() -> None:
    async with InProcessRuntime() as rt:
        fn = await rt.deploy(entry("basic.py", "noop"), inject=FaultInjection({"nan": 1.0}))
        with pytest.raises(PluginCallError, match="NaN"):
            await fn.invoke(ctx(), sample(), trajectory())


async def test_runtime_demo_runs() -> None:
    lines: list[str] = []
    await run_demo(lines.append)
    text = "\n".join(lines)
    assert "per-instance limits:" in text and "16 episodes, all graded" in text
    assert "Invalid reward" in text and "EOF" in text and "metrics exact_match" in text


@pytest.mark.parametrize(
    ("function", "says", "never_says"),
    [
        ("sleeps", "This plugin is sync", "`async def` plugin"),
        ("sleeps_async", "In an `async def` plugin a blocking call", "This plugin is sync"),
    ],
)
async def test_a_timeouts_hint_fits_a_sync_or_an_async_plugin(
    function: str, says: str, never_says: str
) -> None:
    async with InProcessRuntime() as rt:
        fn = await rt.deploy(entry("timeouts.py", function))
        with pytest.raises(PluginCallError) as info:
            await fn.invoke(ctx(), sample(), trajectory())
    error = info.value
    assert error.cause == Cause.TIMEOUT.value and "timeout_s=0.3" in error.message
    assert says in error.hint and never_says not in error.hint
    assert error.record().hint == error.hint and error.to_dict()["hint"] == error.hint  # what the job keeps


async def test_signal_handlers_work_with_max_concurrency_1_as_in_the_function_runtime() -> None:
    """A sync grader that times itself out with signals (as math-verify does) runs on the main
    thread of its call's process with max_concurrency: 1, as an instance runs it: it works."""
    async with InProcessRuntime() as rt:
        fn = await rt.deploy(entry("signals.py", "verify"))
        out = await fn.invoke(ctx(), sample(), trajectory())
        assert (out.status, out.value, out.metrics) == ("success", 1.0, {"main_thread": 1.0})
        timed_out = await fn.invoke(ctx(), sample(work_s=2.0, within_s=0.2), trajectory())
        assert timed_out.value == 0.0  # its own SIGALRM ended the slow work


async def test_signal_handlers_with_max_concurrency_2_fail_as_in_the_function_runtime() -> None:
    async with InProcessRuntime() as rt:
        fn = await rt.deploy(entry("signals.py", "verify"), runtime={"max_concurrency": 2})
        with pytest.raises(PluginCallError) as info:
            await fn.invoke(ctx(), sample(), trajectory())
    message = info.value.message
    assert info.value.cause == Cause.ERROR_500.value and "signal only works in main thread" in message
    assert "max_concurrency: 2, so its calls run on pool threads" in message
    assert "set max_concurrency: 1 in its Runtime" in message


async def test_a_signal_error_in_the_cause_chain_gets_the_same_hint() -> None:
    async with InProcessRuntime() as rt:
        fn = await rt.deploy(entry("signals.py", "verify_wrapped"), runtime={"max_concurrency": 2})
        with pytest.raises(PluginCallError) as info:
            await fn.invoke(ctx(), sample(), trajectory())
    message = info.value.message
    assert message.startswith("VerificationError: could not verify the answer")
    assert "set max_concurrency: 1 in its Runtime" in message
    assert "the error's cause: ValueError: signal only works in main thread" in message


async def test_loader_variables_in_env_are_refused_as_in_the_function_runtime() -> None:
    async with InProcessRuntime() as rt:
        with pytest.raises(PluginCallError) as info:
            await rt.deploy(entry("basic.py", "exact"), env={"LD_PRELOAD": "/tmp/evil.so"})
    assert info.value.cause == Cause.CREATE_FAULT.value and "LD_PRELOAD refused" in info.value.message


async def test_what_a_sync_call_writes_to_stderr_is_its_own_log_lines(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A library's stderr (Python's or a raw write to fd 2) is the call's log lines, attributed to the
    plugin and the trajectory, not unattributed text on the test's terminal."""
    async with InProcessRuntime() as rt:
        fn = await rt.deploy(entry("basic.py", "writes_stderr"))
        out = await fn.invoke(ctx(), sample(), trajectory())
    lines = [(line.source, line.level, line.message, line.trajectory_id) for line in out.logs]
    assert ("stderr", "WARNING", "from python's stderr", "traj-1") in lines, lines
    assert ("stderr", "WARNING", "from fd 2, as C writes", "traj-1") in lines, lines
    assert "from fd 2" not in capfd.readouterr().err
