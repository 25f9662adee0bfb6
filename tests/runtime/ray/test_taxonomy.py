"""Every cause of the failure taxonomy, produced by a real plugin running on a two-node Ray cluster,
is the same single cause, message and evidence as on the local backend."""

from __future__ import annotations

import asyncio

import pytest

from plugtune.errors import Cause, PluginCallError
from plugtune.runtime import Quota
from plugtune.runtime.ray import LocalCluster, RayRuntime
from tests.runtime.helpers import ctx, entry, sample, trajectory

pytestmark = pytest.mark.slow


async def call(fn, do: str, **extra: object):  # type: ignore[no-untyped-def]
    return await fn.invoke(ctx(), sample(do=do, **extra), trajectory())


async def failure(fn, do: str) -> PluginCallError:  # type: ignore[no-untyped-def]
    with pytest.raises(PluginCallError) as info:
        await call(fn, do)
    return info.value


async def test_each_failure_has_its_one_cause_with_logs_and_the_function_recovers(
    cluster: LocalCluster,
) -> None:
    async with RayRuntime(cluster.address, metrics_period_s=0.5) as rt:
        fn = await rt.deploy(entry("ray_faults.py", "misbehaves"))
        assert (await call(fn, "ok")).value == 1.0

        raised = await failure(fn, "raise")
        assert raised.cause == Cause.ERROR_500.value
        assert "ValueError: grader bug" in raised.message
        assert raised.traceback.splitlines()[0].startswith("ray_faults.py:"), raised.traceback
        assert "Traceback" not in raised.message and "ray" not in raised.message.lower()
        assert any("about to raise" in line.message for line in raised.logs)  # type: ignore[attr-defined]

        timed_out = await failure(fn, "hang")
        assert timed_out.cause == Cause.TIMEOUT.value and "timeout_s=4" in timed_out.message

        for how in ("exit", "segfault"):
            died = await failure(fn, how)
            assert died.cause == Cause.EOF.value, died
            assert died.instance_id.startswith("r"), died.instance_id  # the actor's tag, then its worker
            assert any(f"stdout before {how}" in line.message for line in died.logs)  # type: ignore[attr-defined]

        oom = await failure(fn, "oom")
        assert oom.cause == Cause.OOM.value and "memory_mb=200" in oom.message, oom

        assert (await call(fn, "ok")).value == 1.0  # the actor replaced its worker each time
        fn.flush_metrics()
        names = {point.name for point in fn.metrics()}
        assert any(name.endswith("instances") for name in names), names
        assert any(line.source == "stdout" and "stdout before ok" in line.message for line in fn.logs())


async def test_instances_that_cannot_be_created_are_create_faas_faults_with_the_reason(
    cluster: LocalCluster,
) -> None:
    async with RayRuntime(cluster.address, quota=Quota(max_instances=1)) as rt:
        with pytest.raises(PluginCallError) as imported:
            await rt.deploy(entry("import_error.py", "score"))
        assert imported.value.cause == Cause.CREATE_FAULT.value
        assert "ModuleNotFoundError" in imported.value.message or "No module" in imported.value.message

        with pytest.raises(PluginCallError) as infeasible:
            await rt.deploy(entry("ray_faults.py", "misbehaves"), runtime={"cpu": 8})
        assert infeasible.value.cause == Cause.CREATE_FAULT.value
        assert "infeasible" in infeasible.value.message and "cpu=8" in infeasible.value.message

        with pytest.raises(PluginCallError) as quota:
            await rt.deploy(entry("ray_faults.py", "misbehaves"), runtime={"min_instances": 2})
        assert quota.value.cause == Cause.CREATE_FAULT.value and "quota" in quota.value.message


async def test_a_runtime_env_no_node_can_set_up_is_a_create_faas_fault_with_rays_reason(
    cluster: LocalCluster,
) -> None:
    missing = "gcs://_ray_pkg_0123456789abcdef.zip"  # a py_modules package the cluster does not hold
    env = {"py_modules": [missing]}
    async with RayRuntime(cluster.address, runtime_env=env, start_timeout_s=60) as rt:
        with pytest.raises(PluginCallError) as info:
            await rt.deploy(entry("ray_faults.py", "misbehaves"))
    error = info.value
    assert error.cause == Cause.CREATE_FAULT.value, error
    assert "could not set up the plugin's runtime_env" in error.message, error
    assert "Failed to download" in error.message and missing in error.message, error
    assert "Traceback" not in error.message and len(error.message) < 1000, error.message


async def test_calls_in_flight_on_one_actor_each_get_their_own_answer_and_log_lines(
    cluster: LocalCluster,
) -> None:
    async with RayRuntime(cluster.address) as rt:
        fn = await rt.deploy(entry("ray_faults.py", "misbehaves"), runtime={"max_instances": 1})
        calls = [
            fn.invoke(ctx(f"traj-{i}"), sample(do="sleep", seconds=(i % 8) / 20), trajectory())
            for i in range(16)  # the instance's max_concurrency: all out on one actor at once
        ]
        outcomes = await asyncio.wait_for(asyncio.gather(*calls), 30)
        assert [o.value for o in outcomes] == [1.0] * 16
        assert len({o.call_id for o in outcomes}) == 16
        said = {line.trajectory_id for line in fn.logs() if "about to sleep" in line.message}
        assert said == {f"traj-{i}" for i in range(16)}  # with the answers, not a report later
