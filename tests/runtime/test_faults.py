"""The fault suite: one plugin per failure kind; each failure gets exactly its cause, keeps the
logs written before it, and the next call on the same function succeeds."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator

import pytest

from plugtune.errors import Cause, PluginCallError
from plugtune.runtime import LocalRuntime
from plugtune.runtime.function import Function
from tests.runtime.helpers import ctx, entry, eventually, sample, trajectory, turns_until


@pytest.fixture
async def rt() -> AsyncIterator[LocalRuntime]:
    async with LocalRuntime(metrics_period_s=0.2) as runtime:
        yield runtime


async def fail_then_recover(fn: Function) -> PluginCallError:
    with pytest.raises(PluginCallError) as info:
        await fn.invoke(ctx(), sample(fail=True), trajectory())
    outcome = await fn.invoke(ctx(), sample(fail=False), trajectory())
    assert outcome.status == "success"
    return info.value


CASES = [
    ("raises", Cause.ERROR_500, "about to raise"),
    ("raises_async", Cause.ERROR_500, "about to raise"),
    ("returns_nan", Cause.INVALID_REWARD, "about to return nan"),
    ("returns_inf_async", Cause.INVALID_REWARD, "about to return inf"),
    ("returns_string", Cause.INVALID_REWARD, "about to return a string"),
    ("returns_bool", Cause.INVALID_REWARD, "about to return a bool"),
    ("exits_hard", Cause.EOF, "about to os._exit"),
    ("exits_hard_async", Cause.EOF, "about to os._exit"),
    ("calls_sys_exit", Cause.EOF, "about to sys.exit"),
    ("segfaults", Cause.EOF, "about to segfault"),
    ("raises_memory_error", Cause.OOM, "about to raise MemoryError"),
    ("awaits_forever", Cause.TIMEOUT, "about to await forever"),
]


@pytest.mark.parametrize(("function", "cause", "logged"), CASES, ids=[c[0] for c in CASES])
async def test_fault_has_its_cause_keeps_logs_and_recovers(
    rt: LocalRuntime, function: str, cause: Cause, logged: str
) -> None:
    fn = await rt.deploy(entry("faults.py", function))
    error = await fail_then_recover(fn)
    assert error.cause == cause.value, error
    assert error.plugin == fn.entry and error.call_id and error.trajectory_id == "traj-1"
    assert error.code_hash == fn.code_hash
    assert any(logged in line.message for line in error.logs), error.logs  # type: ignore[attr-defined]
    assert all(line.call_id == error.call_id for line in error.logs)  # type: ignore[attr-defined]


async def test_raise_carries_user_traceback_first(rt: LocalRuntime) -> None:
    fn = await rt.deploy(entry("faults.py", "raises"))
    error = await fail_then_recover(fn)
    first = error.traceback.splitlines()[0]
    assert first.startswith("faults.py:") and first.endswith("in raises"), error.traceback
    assert "ValueError: grader bug" in error.message and error.instance_id


async def test_segfault_shows_native_stack(rt: LocalRuntime) -> None:
    fn = await rt.deploy(entry("faults.py", "segfaults"))
    error = await fail_then_recover(fn)
    assert "SIGSEGV" in error.message
    assert "Segmentation fault" in error.traceback and "faults.py" in error.traceback


async def test_os_exit_keeps_print_and_reports_status(rt: LocalRuntime) -> None:
    fn = await rt.deploy(entry("faults.py", "exits_hard"))
    error = await fail_then_recover(fn)
    assert "exited with status 3" in error.message
    assert any(line.message == "printed before exit" and line.source == "stdout" for line in error.logs)  # type: ignore[attr-defined]


async def test_blocking_call_in_async_def_times_out_and_warns(rt: LocalRuntime) -> None:
    fn = await rt.deploy(entry("faults.py", "blocks_loop"))
    error = await fail_then_recover(fn)
    assert error.cause == Cause.TIMEOUT.value
    warnings = [
        line for line in error.logs if line.level == "WARNING" and "blocked its event loop" in line.message
    ]  # type: ignore[attr-defined]
    assert warnings, error.logs  # type: ignore[attr-defined]
    assert "blocks_loop" in warnings[0].message and "time.sleep(1.2)" in warnings[0].message
    assert 'faults.py", line' in warnings[0].message


async def test_infinite_sync_loop_times_out_and_recycles_instance(rt: LocalRuntime) -> None:
    fn = await rt.deploy(entry("faults.py", "spins"))
    error = await fail_then_recover(fn)
    assert error.cause == Cause.TIMEOUT.value
    pid = int(next(line.message.split()[1] for line in error.logs if line.message.startswith("pid ")))  # type: ignore[attr-defined]
    assert error.instance_id
    assert await eventually(lambda: not _alive(pid)), "the stuck instance was not killed"
    assert any("recycling instance" in line.message for line in fn.logs())


@pytest.mark.parametrize("function", ["memory_bomb", "memory_bomb_async"])
async def test_memory_bomb_is_faas_oom(rt: LocalRuntime, function: str) -> None:
    fn = await rt.deploy(entry("faults.py", function))
    error = await fail_then_recover(fn)
    assert error.cause == Cause.OOM.value, error
    assert "memory_mb=96" in error.message
    assert error.peak_memory_mb is not None and error.peak_memory_mb >= 90
    assert any("about to allocate" in line.message for line in error.logs)  # type: ignore[attr-defined]


async def test_memory_bomb_under_rlimit_fallback() -> None:
    async with LocalRuntime(limits="rlimit", metrics_period_s=0.2) as rt:
        assert rt.limits_mechanism == "rlimit+watchdog"
        fn = await rt.deploy(entry("faults.py", "memory_bomb"))
        error = await fail_then_recover(fn)
        assert error.cause == Cause.OOM.value, error
        outcome = await fn.invoke(ctx(), sample(fail=False), trajectory())
        assert outcome.value == 0.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


async def test_recycle_kills_the_whole_tree_even_a_child_in_its_own_session(rt: LocalRuntime) -> None:

    fn = await rt.deploy(entry("faults.py", "spawns_then_spins"))
    error = await fail_then_recover(fn)
    assert error.cause == Cause.TIMEOUT.value
    child = int(next(line.message.split()[1] for line in error.logs if line.message.startswith("child ")))  # type: ignore[attr-defined]
    assert await eventually(lambda: not _alive(child)), "the plugin's child process outlived its instance"


async def test_recycle_kills_children_under_rlimit_fallback_too() -> None:

    async with LocalRuntime(limits="rlimit") as rt:
        fn = await rt.deploy(entry("faults.py", "spawns_then_spins"))
        error = await fail_then_recover(fn)
        child = int(next(line.message.split()[1] for line in error.logs if line.message.startswith("child ")))  # type: ignore[attr-defined]
        assert await eventually(lambda: not _alive(child))


async def test_timeout_fires_close_to_timeout_s(rt: LocalRuntime) -> None:
    fn = await rt.deploy(entry("faults.py", "awaits_forever"))  # timeout_s=0.5
    took = []
    for _ in range(3):
        started = time.perf_counter()
        with pytest.raises(PluginCallError) as info:
            await fn.invoke(ctx(), sample(fail=True), trajectory())
        took.append(time.perf_counter() - started)
        assert info.value.cause == Cause.TIMEOUT.value
    # deadlines share timers in 5 ms slots: never early, soon after. Every try is at least 0.5 s;
    # the quickest of three is held to "soon after", so that a loaded machine's one slow wake-up
    # does not fail it, while a timer that fires late every time (a coarse tick) still does
    assert min(took) >= 0.5 and min(took) < 0.9, took


async def test_a_call_arriving_as_an_instance_dies_is_not_sent_to_it(rt: LocalRuntime) -> None:
    """max_concurrency=4: between the instance's connection closing and its end being read, it still
    had free slots, so a new call went to it and was answered EOF with the call that killed it."""
    fn = await rt.deploy(entry("faults.py", "exits_hard"))
    (dying,) = fn.deployment.instances  # type: ignore[attr-defined]
    crash = asyncio.create_task(fn.invoke(ctx("crash"), sample(fail=True), trajectory(tid="crash")))
    assert await turns_until(lambda: dying.end_task is not None), "the instance did not end"
    assert not dying.fate.ended  # its end is not read yet: the window
    after = await fn.invoke(ctx("after"), sample(fail=False), trajectory(tid="after"))
    with pytest.raises(PluginCallError) as info:
        await crash
    assert info.value.cause == Cause.EOF.value
    assert after.status == "success" and after.instance_id != dying.id
