"""Per-function metrics, sampled every ``period_s`` (names as in the console, DESIGN §6).

A function is sampled every second (at most) while it is young (its first minute) or failing (for
half a minute after a failed call), so a plugin that lived 10–30 s, or the moments before a
failure, have a point a second; the peak memory of an instance that died is a point of its own."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

from plugtune.errors import Cause
from plugtune.types import MetricPoint

MIB = 1 << 20
MAX_POINTS = 50_000
FINE_PERIOD_S = 1.0  # the period while a function is young or failing
YOUNG_S = 60.0
FAILING_S = 30.0


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


class MetricsRecorder:
    """Counts calls as they finish; every period turns the window into :class:`MetricPoint` s."""

    def __init__(self, plugin: str, period_s: float, gauges: Callable[[], dict[str, float]]) -> None:
        if not 0 < period_s <= 10:
            raise ValueError(f"metrics_period_s={period_s} must be in (0, 10]")
        self.plugin = plugin
        self.period_s = period_s
        self.gauges = gauges
        self.points: collections.deque[MetricPoint] = collections.deque(maxlen=MAX_POINTS)
        self._latencies: list[float] = []
        self._errors: collections.Counter[str] = collections.Counter()
        self._since = time.monotonic()
        self._fine_until = self._since + YOUNG_S
        self._outbound: float | None = None
        self._task: asyncio.Task[None] | None = None

    def record(self, latency_ms: float, cause: str | None = None) -> None:
        self._latencies.append(latency_ms)
        if cause is not None:
            self._errors[cause] += 1
            self._fine_until = max(self._fine_until, time.monotonic() + FAILING_S)

    def record_point(self, name: str, value: float) -> None:
        """A value measured now, outside the sampling (an instance's peak memory when it died)."""
        self.points.append(MetricPoint(time.time(), self.plugin, name, float(value)))

    def period(self) -> float:
        """The sampling period now: ``FINE_PERIOD_S`` (or less) while young or failing."""
        if time.monotonic() < self._fine_until:
            return min(self.period_s, FINE_PERIOD_S)
        return self.period_s

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.flush()

    async def _run(self) -> None:
        tick = min(self.period_s, FINE_PERIOD_S)  # a failure switches to the fine period within a tick
        while True:
            await asyncio.sleep(tick)
            if time.monotonic() - self._since >= self.period() - tick / 2:
                self.flush()

    def flush(self) -> None:
        now_mono = time.monotonic()
        dt = max(1e-6, now_mono - self._since)
        self._since = now_mono
        now = time.time()
        latencies = sorted(self._latencies)
        errors = self._errors
        self._latencies, self._errors = [], collections.Counter()
        values: dict[str, float] = {"exec_qps": len(latencies) / dt}
        if latencies:
            values["latency_ms_avg"] = sum(latencies) / len(latencies)
            values["latency_ms_p50"] = percentile(latencies, 0.5)
            values["latency_ms_p99"] = percentile(latencies, 0.99)
        for cause in Cause:
            values[f"error_qps/{cause.value}"] = errors.get(cause.value, 0) / dt
        gauges = self.gauges()
        outbound = gauges.pop("outbound_bytes", 0.0)
        previous, self._outbound = self._outbound, outbound
        values["outbound_mib_s"] = max(0.0, outbound - previous) / MIB / dt if previous is not None else 0.0
        values.update(gauges)
        self.points.extend(MetricPoint(now, self.plugin, name, float(v)) for name, v in values.items())
