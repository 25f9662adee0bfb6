"""Calls: results and statuses, logs, concurrency, autoscaling, metrics, fault injection."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from plugtune.errors import Cause, PluginCallError
from plugtune.runtime import FaultInjection, LocalRuntime
from plugtune.sdk import Policy, Runtime
from plugtune.types import MetricPoint
from tests.runtime.helpers import ctx, entry, eventually, sample, trajectory


async def test_results_and_statuses() -> None:
    async with LocalRuntime() as rt:
        exact = await rt.deploy(entry("basic.py", "exact"))
        out = await exact.invoke(ctx(), sample(), trajectory("42"))
        assert (out.status, out.value, out.metrics) == ("success", 1.0, {"length": 2.0})
        assert out.call_id and out.instance_id and out.latency_ms > 0
        assert [line.message for line in out.logs] == ["grading traj-1"]
        assert out.logs[0].call_id == out.call_id and out.logs[0].trajectory_id == "traj-1"
        assert (await exact.invoke(ctx(), sample(), trajectory("41"))).value == 0.0
        cases = {
            "unscorable": ("success", None, ""),
            "with_status": ("failure", None, "judge unavailable"),
            "asks_retry": ("retry", None, "flaky tool"),
            "asks_discard": ("discard", None, "bad prompt"),
        }
        for name, expected in cases.items():
            fn = await rt.deploy(entry("basic.py", name))
            out = await fn.invoke(ctx(), sample(), trajectory())
            assert (out.status, out.value, out.reason) == expected, name
            await fn.close()


async def test_group_grader_and_rollout() -> None:
    async with LocalRuntime() as rt:
        ranks = await rt.deploy(entry("basic.py", "ranks"))
        group = [trajectory(tid=f"t{i}") for i in range(3)]
        assert (await ranks.invoke(ctx(), sample(), group)).value == [0.0, 1.0, 2.0]
        short = await rt.deploy(entry("basic.py", "short_list"))
        with pytest.raises(PluginCallError, match="returned 1 rewards for 3 trajectories") as info:
            await short.invoke(ctx(), sample(), group)
        assert info.value.cause == Cause.INVALID_REWARD.value
        roll = await rt.deploy(entry("basic.py", "echo_rollout"))
        out = await roll.invoke(ctx(), Policy(base_url="http://127.0.0.1:9/v1", api_key="k"), sample())
        assert out.status == "success" and out.value["messages"][-1]["content"] == "42"
        assert out.value["metrics"] == {"turns": 1}
        assert "via policy" in out.logs[0].message
        with pytest.raises(TypeError, match="policy must be a Policy"):
            await roll.invoke(ctx(), sample(), trajectory())


async def test_print_module_logger_and_raw_fd_are_captured() -> None:
    async with LocalRuntime() as rt:
        fn = await rt.deploy(entry("basic.py", "prints"))
        out = await fn.invoke(ctx(), sample(), trajectory())
        by_source = {(line.source, line.message) for line in out.logs}
        assert ("stdout", "hello from print") in by_source
        assert ("logger", "module logger line") in by_source
        # fd-level output comes through a pipe, maybe after the reply
        assert await eventually(lambda: any(line.message == "raw fd line" for line in fn.logs()))
        raw = [line for line in fn.logs() if line.message == "raw fd line"]
        assert raw and raw[0].source == "stderr" and raw[0].plugin == fn.entry


async def test_async_plugin_runs_max_concurrency_calls_at_once_on_one_instance() -> None:
    async with LocalRuntime() as rt:
        fn = await rt.deploy(
            entry("basic.py", "counts_running_async"), runtime=Runtime(max_concurrency=50, max_instances=1)
        )
        outs = await asyncio.gather(*(fn.invoke(ctx(), sample(sleep=0.3), trajectory()) for _ in range(120)))
        assert {o.instance_id for o in outs} == {outs[0].instance_id}
        assert max(o.metrics["running"] for o in outs) == 50  # all 50 slots used, never more


async def test_sync_plugin_autoscales_and_scales_down_when_idle() -> None:
    async with LocalRuntime(idle_timeout_s=0.3, metrics_period_s=0.2) as rt:
        fn = await rt.deploy(entry("basic.py", "slow_sync"))  # max_concurrency=1, max_instances=3
        outs = await asyncio.gather(*(fn.invoke(ctx(), sample(sleep=0.3), trajectory()) for _ in range(6)))
        pids = {o.value for o in outs}
        assert len(pids) == 3, pids  # scaled out to max_instances, not beyond
        gauges = [p.value for p in fn.metrics() if p.name == "instances"]
        assert max(gauges) == 3
        assert await eventually(lambda: fn.deployment.sample()["instances"] == 0)  # type: ignore[attr-defined]
        assert (await fn.invoke(ctx(), sample(sleep=0.0), trajectory())).status == "success"


async def test_dead_instance_is_replaced_and_other_calls_keep_going() -> None:
    async with LocalRuntime() as rt:
        fn = await rt.deploy(
            entry("faults.py", "exits_hard"), runtime=Runtime(max_concurrency=1, max_instances=2)
        )
        results = await asyncio.gather(
            fn.invoke(ctx(), sample(fail=True), trajectory()),
            *(fn.invoke(ctx(), sample(fail=False), trajectory()) for _ in range(5)),
            return_exceptions=True,
        )
        assert isinstance(results[0], PluginCallError) and results[0].cause == Cause.EOF.value
        assert all(not isinstance(r, BaseException) for r in results[1:]), results
        await fn.deployment.kill()  # type: ignore[attr-defined]
        assert (await fn.invoke(ctx(), sample(fail=False), trajectory())).status == "success"


async def test_metrics_series() -> None:
    async with LocalRuntime(metrics_period_s=0.2) as rt:
        fn = await rt.deploy(entry("faults.py", "raises"))
        fn.flush_metrics()  # a window ends here: the six calls below fall in the windows after it
        opened = max(p.time for p in fn.metrics())
        for _ in range(5):
            await fn.invoke(ctx(), sample(fail=False), trajectory())
        with pytest.raises(PluginCallError):
            await fn.invoke(ctx(), sample(fail=True), trajectory())
        await asyncio.sleep(0.5)  # windows of the sampler's own
        fn.flush_metrics()
        points = fn.metrics()
        names = {p.name for p in points}
        for name in (
            "exec_qps",
            "latency_ms_avg",
            "latency_ms_p50",
            "latency_ms_p99",
            "error_qps/500",
            "cpu_percent",
            "memory_percent",
            "instances",
            "outbound_mib_s",
            "concurrency_per_instance",
        ):
            assert name in names, name
        # exec_qps is calls / window length: weighted by each window's own length (~0.2 s, longer on a
        # busy machine), the windows since `opened` add up to the six calls
        assert _amount(points, "exec_qps", opened) == pytest.approx(6, abs=0.5)
        assert sum(p.value for p in points if p.name == "error_qps/500") > 0
        assert all(p.plugin == fn.entry for p in points)
        assert 0 < max(p.value for p in points if p.name == "memory_percent") < 100


@pytest.mark.parametrize("function", ["uploads", "uploads_async"])
async def test_outbound_traffic_is_counted(function: str) -> None:
    # uploads_async writes through the instance's event loop (uvloop: transports written in C)
    server = await asyncio.start_server(_drain, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, LocalRuntime(metrics_period_s=0.2) as rt:
        fn = await rt.deploy(entry("network.py", function), runtime={"network": "any"})  # a host port
        fn.flush_metrics()  # a window ends here: the upload falls in the windows after it
        opened = max(p.time for p in fn.metrics())
        await fn.invoke(ctx(), sample(port=port, size=3 << 20), trajectory())
        # the instance's count reaches a window a sample or so after the call: wait for it by amount
        await eventually(lambda: _amount(fn.metrics(), "outbound_mib_s", opened) >= 3.0 * 0.8)
        await asyncio.sleep(0.5)  # and a few windows more: an overcount would show too
        sent = _amount(fn.metrics(), "outbound_mib_s", opened)
        assert sent == pytest.approx(3.0, rel=0.2), sent


def _amount(points: list[MetricPoint], name: str, since: float) -> float:
    """A rate series turned back into an amount: each point's value times its window's length (the
    time since the point before it), from the window that ended at `since` on."""
    series = sorted((p.time, p.value) for p in points if p.name == name and p.time >= since)
    return sum(value * (end - start) for (start, _), (end, value) in itertools.pairwise(series))


async def _drain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while await reader.read(1 << 16):
        pass
    writer.close()


async def test_fault_injection_really_fails_the_worker() -> None:
    inject = FaultInjection({"500": 0.25, "nan": 0.25, "eof": 0.25}, seed=7)
    async with LocalRuntime() as rt:
        fn = await rt.deploy(entry("basic.py", "noop"), inject=inject)
        causes: list[str] = []
        for _ in range(16):
            try:
                await fn.invoke(ctx(), sample(), trajectory())
                causes.append("ok")
            except PluginCallError as exc:
                causes.append(exc.cause)
                assert any("injecting fault" in line.message for line in exc.logs)  # type: ignore[attr-defined]
        assert {"ok", "500", "Invalid reward", "EOF"} <= set(causes), causes
    with pytest.raises(ValueError, match="unknown fault"):
        FaultInjection({"boom": 0.1})
    with pytest.raises(ValueError, match="add up to more than 1"):
        FaultInjection({"eof": 0.7, "500": 0.7})


async def test_injected_faults_at_concurrency_each_fail_only_their_own_call() -> None:
    """An injected OOM or exit ends its instance: it waits until its instance runs no other call
    (and gets no new one), so the calls that shared the instance keep their own outcome; an async
    plugin's injected OOM does not block its event loop (no warning blaming plugtune's frames)."""
    rates = {"oom": 0.2, "eof": 0.2, "500": 0.2}
    draws = FaultInjection(rates, seed=6)
    expected = [draws.draw() for _ in range(12)]  # the same draws, in the order the calls start
    assert {"oom", "eof", "500", None} <= set(expected)
    limits = Runtime(memory_mb=128, timeout_s=30, max_concurrency=4, max_instances=2)
    async with LocalRuntime() as rt:
        fn = await rt.deploy(
            entry("basic.py", "sleepy"), runtime=limits, inject=FaultInjection(rates, seed=6)
        )
        outs = await asyncio.gather(
            *(fn.invoke(ctx(), sample(sleep=0.5), trajectory()) for _ in range(12)), return_exceptions=True
        )
        logs = fn.logs()
    want = {None: "success", "oom": "FaaS OOM", "eof": "EOF", "500": "500"}
    got = [o.cause if isinstance(o, PluginCallError) else getattr(o, "status", o) for o in outs]
    assert got == [want[f] for f in expected]
    assert not [line.message for line in logs if "blocked its event loop" in line.message]


async def test_injected_timeout_and_oom() -> None:
    inject = FaultInjection({"timeout": 0.5, "oom": 0.5}, seed=3)
    async with LocalRuntime() as rt:
        fn = await rt.deploy(
            entry("basic.py", "noop"), runtime=Runtime(memory_mb=96, timeout_s=0.5), inject=inject
        )
        causes = set()
        for _ in range(6):
            with pytest.raises(PluginCallError) as info:
                await fn.invoke(ctx(), sample(), trajectory())
            causes.add(info.value.cause)
        assert causes == {"Timeout", "FaaS OOM"}


async def test_spare_instance_serves_a_scale_up_at_once() -> None:
    async with LocalRuntime() as rt:
        fn = await rt.deploy(entry("basic.py", "slow_sync"))  # max_concurrency=1, max_instances=3
        deployment = fn.deployment
        assert await eventually(lambda: deployment.spare is not None)  # type: ignore[attr-defined]
        spare = deployment.spare  # type: ignore[attr-defined]
        assert spare is not None and fn.deployment.sample()["instances"] == 1
        (first,) = deployment.instances  # type: ignore[attr-defined]
        busy = asyncio.ensure_future(fn.invoke(ctx(), sample(sleep=2.0), trajectory()))
        assert await eventually(lambda: first.in_flight == 1)  # the only instance is taken
        out = await fn.invoke(ctx(), sample(sleep=0.0), trajectory())
        assert out.instance_id == spare.id
        assert (await busy).instance_id != spare.id


async def test_fresh_spawn_fallback_when_the_zygote_is_gone() -> None:
    roomy = Runtime(timeout_s=10, max_concurrency=1)  # a fresh spawn takes 0.1-0.3 s of CPU here
    async with LocalRuntime(use_zygote=False) as rt:
        fn = await rt.deploy(entry("faults.py", "exits_hard"), runtime=roomy)
        error = await _fail_then_ok(fn)
        assert error.cause == Cause.EOF.value and "exited with status 3" in error.message
    async with LocalRuntime(spare_instances=False) as rt:
        fn = await rt.deploy(entry("faults.py", "exits_hard"), runtime=roomy)
        fn.deployment.launcher.zygote.proc.kill()  # type: ignore[attr-defined]
        await asyncio.sleep(0.2)
        error = await _fail_then_ok(fn)
        assert error.cause == Cause.EOF.value
        assert any("fresh spawn" in line.message for line in fn.logs())


async def _fail_then_ok(fn: object) -> PluginCallError:
    with pytest.raises(PluginCallError) as info:
        await fn.invoke(ctx(), sample(fail=True), trajectory())  # type: ignore[attr-defined]
    assert (await fn.invoke(ctx(), sample(fail=False), trajectory())).status == "success"  # type: ignore[attr-defined]
    return info.value


async def test_sync_plugin_runs_max_concurrency_threads_on_one_instance() -> None:
    async with LocalRuntime() as rt:
        fn = await rt.deploy(
            entry("basic.py", "counts_running"), runtime=Runtime(max_concurrency=4, max_instances=1)
        )
        outs = await asyncio.gather(*(fn.invoke(ctx(), sample(sleep=0.3), trajectory()) for _ in range(10)))
        assert {o.instance_id for o in outs} == {outs[0].instance_id}
        assert max(o.metrics["running"] for o in outs) == 4  # four threads at once, never more


async def test_sync_call_that_arrives_during_a_long_inline_call_starts_at_once() -> None:
    # A call that arrives alone runs on the instance's reading thread; a call arriving while it runs
    # must still be read and started at once (the ticker takes the reading role over).
    async with LocalRuntime() as rt:
        fn = await rt.deploy(
            entry("basic.py", "counts_running"), runtime=Runtime(max_concurrency=2, max_instances=1)
        )
        for _ in range(3):
            await fn.invoke(ctx(), sample(sleep=0.0), trajectory())
        (instance,) = fn.deployment.instances  # type: ignore[attr-defined]
        long = asyncio.ensure_future(fn.invoke(ctx(), sample(sleep=5.0), trajectory()))
        assert await eventually(lambda: instance.in_flight == 1)
        await asyncio.sleep(0.2)  # read, and running inline
        started = time.perf_counter()
        short = await fn.invoke(ctx(), sample(sleep=0.0), trajectory())
        # not queued behind the long call (a 5 s call: a loaded machine's slowness stays well short)
        assert time.perf_counter() - started < 3.0
        assert not long.done() and short.metrics["running"] == 2
        assert (await long).instance_id == short.instance_id
        for _ in range(3):  # alone again, one after another
            assert (await fn.invoke(ctx(), sample(sleep=0.01), trajectory())).metrics["running"] == 1


async def test_a_batch_read_at_once_whose_first_call_is_long_runs_the_rest_beside_it() -> None:
    # Calls sent in one loop turn reach the instance in one write; the reader runs them itself one
    # after another, and once it has for TICK_S the ticker hands the rest to pool threads: a long
    # first call must not hold up the batch's others.
    async with LocalRuntime() as rt:
        fn = await rt.deploy(
            entry("basic.py", "counts_running"), runtime=Runtime(max_concurrency=4, max_instances=1)
        )
        for _ in range(3):
            await fn.invoke(ctx(), sample(sleep=0.0), trajectory())
        for _ in range(2):  # and the instance serves the next batch the same way
            # the first frame goes out alone (nothing in flight); the next three in one write,
            # which the reader takes up once the short first call has ended
            first = asyncio.ensure_future(fn.invoke(ctx(), sample(sleep=0.0), trajectory()))
            # the long call lasts 5 s so that a loaded machine's slowness cannot stretch the rest past it
            long = asyncio.ensure_future(fn.invoke(ctx(), sample(sleep=5.0), trajectory()))
            rest = [asyncio.ensure_future(fn.invoke(ctx(), sample(sleep=0.3), trajectory())) for _ in "ab"]
            outs = await asyncio.wait_for(asyncio.gather(first, *rest), 4.5)
            assert not long.done()  # the two ran beside the long one, not after it
            assert max(o.metrics["running"] for o in outs[1:]) >= 2
            assert {o.instance_id for o in outs} == {(await long).instance_id}


async def test_a_cancelled_call_frees_its_slot_when_the_instance_answers() -> None:
    """A caller that stops waiting (its task cancelled) must not leave the next caller waiting for
    a slot until its deadline: the slot is free once the abandoned sync call ends."""
    one = Runtime(timeout_s=10, max_concurrency=1, max_instances=1)  # a slot held to the deadline: 10 s
    async with LocalRuntime(spare_instances=False) as rt:
        fn = await rt.deploy(entry("basic.py", "slow_sync"), runtime=one)
        abandoned = asyncio.ensure_future(fn.invoke(ctx(), sample(sleep=0.3), trajectory()))
        await asyncio.sleep(0.1)  # it runs on the only slot
        waiting = asyncio.ensure_future(fn.invoke(ctx(), sample(sleep=0.0), trajectory()))
        await asyncio.sleep(0.05)
        abandoned.cancel()
        started = time.monotonic()
        out = await asyncio.wait_for(waiting, 8.0)
        assert out.status == "success" and time.monotonic() - started < 5.0  # half the deadline: not held
        assert abandoned.cancelled()
