"""Resource gauges of a function's instances, and the memory watchdog used without cgroups."""

from __future__ import annotations

import time

import psutil

from plugtune.runtime import protocol as p
from plugtune.runtime.instance import Instance
from plugtune.sdk import Runtime


class ResourceMonitor:
    """Samples CPU (% of the quota), memory (% of the limit), instances, in-flight calls, traffic."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._cpu: dict[int, tuple[float, float]] = {}

    def sample(self, instances: list[Instance]) -> dict[str, float]:
        live = [i for i in instances if not i.ended and i.pid]
        cpu_total = 0.0
        mem_percent = 0.0
        now = time.monotonic()
        for instance in live:
            instance.send([p.STATS])  # the answer (outbound bytes) is used by the next sample
            used = instance.limits.usage_mb()
            if used is None:
                used = rss_mb(instance.pid)
            mem_percent = max(mem_percent, 100.0 * used / instance.limits.memory_mb)
            cpu_s = cpu_seconds(instance.pid)
            before = self._cpu.get(instance.pid)
            self._cpu[instance.pid] = (now, cpu_s)
            if before is not None and now > before[0]:
                cpu_total += (cpu_s - before[1]) / (now - before[0])
        n = len(live)
        in_flight = sum(i.in_flight for i in live)
        return {
            "instances": float(n),
            "cpu_percent": 100.0 * cpu_total / (self.runtime.cpu * n) if n else 0.0,
            "memory_percent": mem_percent,
            "outbound_bytes": float(sum(i.outbound_bytes for i in instances)),
            "concurrency_per_instance": in_flight / n if n else 0.0,
        }

    def watch_memory(self, instances: list[Instance]) -> None:
        """Kill an instance whose resident memory is over its limit (the rlimit fallback's OOM)."""
        for instance in instances:
            if not instance.pid or instance.ended:
                continue
            rss = rss_mb(instance.pid)
            instance.peak_rss_mb = max(instance.peak_rss_mb, rss)
            if instance.limits.watchdog and rss > instance.limits.memory_mb and not instance.watchdog_oom:
                instance.watchdog_oom = (
                    f"the memory watchdog killed it at {rss:.0f} MiB resident (limits: rlimit+watchdog)"
                )
                instance.kill("over its memory limit")


def rss_mb(pid: int) -> float:
    try:
        return float(psutil.Process(pid).memory_info().rss) / (1 << 20)
    except psutil.Error:
        return 0.0


def cpu_seconds(pid: int) -> float:
    try:
        times = psutil.Process(pid).cpu_times()
        return float(times.user + times.system + times.children_user + times.children_system)
    except psutil.Error:
        return 0.0
