"""Where sync calls run: with max_concurrency 1 always on the instance's main thread (signal-based
timeouts work), with more always on pool threads (they fail, with a hint); the runtime's own
timeout holds in both."""

from __future__ import annotations

import asyncio

import pytest

from plugtune.errors import Cause, PluginCallError
from plugtune.runtime import LocalRuntime
from plugtune.sdk import Runtime
from tests.runtime.helpers import ctx, entry, eventually, sample, trajectory

SIGNALS = entry("signals.py", "verify")


async def _sixteen(fn: object, **extra: float) -> list[object]:
    return await asyncio.gather(
        *(fn.invoke(ctx(), sample(**extra), trajectory()) for _ in range(16)),  # type: ignore[attr-defined]
        return_exceptions=True,
    )


async def test_signal_timeouts_work_in_every_call_with_max_concurrency_1() -> None:
    async with LocalRuntime() as rt:
        fn = await rt.deploy(SIGNALS)  # max_concurrency=1, max_instances=4
        for _ in range(2):  # sixteen at once (queued behind each other), then one by one
            outs = await _sixteen(fn)
            assert [getattr(o, "value", o) for o in outs] == [1.0] * 16
            assert all(o.metrics["main_thread"] == 1.0 for o in outs)  # type: ignore[attr-defined]
        lone = [await fn.invoke(ctx(), sample(), trajectory()) for _ in range(4)]
        assert [o.value for o in lone] == [1.0] * 4
        timed_out = await fn.invoke(ctx(), sample(work_s=3.0, within_s=0.05), trajectory())
        assert timed_out.value == 0.0  # the alarm fired and stopped the work


async def test_with_max_concurrency_above_1_signals_fail_in_every_call_with_a_hint() -> None:
    async with LocalRuntime() as rt:
        fn = await rt.deploy(SIGNALS, runtime=Runtime(max_concurrency=4, max_instances=1))
        outs = [*await _sixteen(fn), *[await _one(fn) for _ in range(4)]]  # together, and alone
        assert all(isinstance(o, PluginCallError) for o in outs), outs
        for error in outs:
            assert error.cause == Cause.ERROR_500.value  # type: ignore[attr-defined]
            assert "signal only works in main thread" in str(error)
            assert "set max_concurrency: 1" in str(error) and "max_instances" in str(error)


async def test_a_signal_error_wrapped_by_the_library_still_gets_the_hint() -> None:
    """math-verify-like: the plugin's error is the library's own, the signal error its cause."""
    async with LocalRuntime() as rt:
        fn = await rt.deploy(entry("signals.py", "verify_wrapped"), runtime=Runtime(max_concurrency=4))
        error = await _one(fn)
    assert isinstance(error, PluginCallError) and error.cause == Cause.ERROR_500.value
    assert "VerificationError: could not verify the answer" in str(error)
    assert "set max_concurrency: 1" in str(error) and "signal only works in main thread" in str(error)


async def _one(fn: object) -> object:
    try:
        return await fn.invoke(ctx(), sample(), trajectory())  # type: ignore[attr-defined]
    except PluginCallError as exc:
        return exc


@pytest.mark.parametrize("concurrency", [1, 4])
async def test_a_sync_call_past_timeout_s_is_a_timeout_and_the_plugin_keeps_serving(concurrency: int) -> None:
    limits = Runtime(timeout_s=0.3, max_concurrency=concurrency, max_instances=1)
    async with LocalRuntime() as rt:
        fn = await rt.deploy(entry("basic.py", "slow_sync"), runtime=limits)
        assert (await fn.invoke(ctx(), sample(sleep=0.0), trajectory())).status == "success"
        with pytest.raises(PluginCallError) as info:
            await fn.invoke(ctx(), sample(sleep=30.0), trajectory())
        assert info.value.cause == Cause.TIMEOUT.value
        out = await asyncio.wait_for(fn.invoke(ctx(), sample(sleep=0.0), trajectory()), 10)
        assert out.status == "success" and out.instance_id != info.value.instance_id  # recycled


async def test_a_main_thread_instance_answers_stats_while_its_call_runs() -> None:
    server = await asyncio.start_server(_drain, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, LocalRuntime(metrics_period_s=0.2) as rt:
        # max_concurrency=1; the test's port is on the host: network any
        fn = await rt.deploy(entry("signals.py", "uploads_then_sleeps"), runtime={"network": "any"})
        call = asyncio.ensure_future(
            fn.invoke(ctx(), sample(port=port, size=2 << 20, sleep=4.0), trajectory())
        )
        # until counted, or until the call (sleeping 4 s) ends: then `not call.done()` below fails
        await eventually(
            lambda: call.done() or sum(p.value for p in fn.metrics() if p.name == "outbound_mib_s") > 0
        )
        assert sum(p.value for p in fn.metrics() if p.name == "outbound_mib_s") > 0
        assert not call.done()  # counted while the call still ran on the main thread
        assert (await call).value == 1.0


async def _drain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while await reader.read(1 << 16):
        pass
    writer.close()
