"""A function's metrics see what a short or failing life did: a point a second while it is young
or failing, its instances' CPU from their first sample, an instance's peak memory when it died."""

from __future__ import annotations

import asyncio

import pytest

from plugtune.errors import Cause, PluginCallError
from plugtune.runtime import LocalRuntime
from plugtune.runtime import metrics as metrics_module
from plugtune.runtime.metrics import MetricsRecorder
from tests.runtime.helpers import ctx, entry, eventually, sample, trajectory

JOB_PERIOD_S = 5.0  # what a job's runtime samples at once a plugin is past its first minute


def values(fn: object, name: str) -> list[float]:
    return [p.value for p in fn.metrics() if p.name == name]  # type: ignore[attr-defined]


async def test_a_young_function_is_sampled_every_second_and_its_first_cpu_sample_is_real() -> None:
    """A plugin that lives 3 s has a point a second, not none; its instance's first CPU sample is
    what it used since it started (0.3 s of setup() here), not 0."""
    async with LocalRuntime(metrics_period_s=JOB_PERIOD_S) as rt:
        fn = await rt.deploy(entry("busy_setup.py", "loaded"))
        assert (await fn.invoke(ctx(), sample(), trajectory())).value == 1.0
        # a point a second: two or more within about 3 s (a busy machine's sampler may tick late)
        await asyncio.sleep(3.2)
        await eventually(lambda: len(values(fn, "instances")) >= 2)
        instances = values(fn, "instances")
        assert len(instances) >= 2, instances
        cpu = [c for c, n in zip(values(fn, "cpu_percent"), instances, strict=True) if n >= 1]
        assert cpu and cpu[0] > 0, (cpu, instances)


async def test_an_oom_leaves_its_peak_memory_as_a_point() -> None:
    """The instance went over memory_mb=96 between two samples: its peak (the cgroup's, or the
    watchdog's reading) is a memory point near or over 100 %, not the last sample's few percent."""
    async with LocalRuntime(metrics_period_s=JOB_PERIOD_S) as rt:
        fn = await rt.deploy(entry("faults.py", "memory_bomb"))
        with pytest.raises(PluginCallError) as info:
            await fn.invoke(ctx(), sample(fail=True), trajectory())
        assert info.value.cause == Cause.OOM.value
        peak = info.value.peak_memory_mb
        assert peak is not None and peak >= 90
        assert max(values(fn, "memory_percent")) >= 100.0 * peak / 96 - 0.01


def test_a_failing_function_is_sampled_every_second_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past its first minute a function is sampled at its period; a failed call brings the
    one-second period back for FAILING_S."""
    monkeypatch.setattr(metrics_module, "YOUNG_S", 0.0)
    recorder = MetricsRecorder("plugins/g.py:g", JOB_PERIOD_S, dict)
    assert recorder.period() == JOB_PERIOD_S
    recorder.record(12.0)
    assert recorder.period() == JOB_PERIOD_S
    recorder.record(30.0, Cause.TIMEOUT.value)
    assert recorder.period() == metrics_module.FINE_PERIOD_S
