"""Resource gauges of a function's instances, the memory watchdog and the process watch used
without cgroups, and the size watch of temp folders that are plain folders (no tmpfs of their own)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import psutil

from plugtune.runtime import protocol as p
from plugtune.runtime.fate import Overrun
from plugtune.runtime.instance import Instance
from plugtune.runtime.limits import pids_max
from plugtune.sdk import Runtime


class ResourceMonitor:
    """Samples CPU (% of the quota), memory (% of the limit), instances, in-flight calls, traffic."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._cpu: dict[int, tuple[float, float]] = {}

    def sample(self, instances: list[Instance]) -> dict[str, float]:
        live = [i for i in instances if not i.fate.ended and i.pid]
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
            else:  # its first sample: the average since it started, not a made-up 0
                cpu_total += cpu_s / max(process_age_s(instance.pid), 0.05)
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
            if not instance.pid or instance.fate.ended:
                continue
            rss = rss_mb(instance.pid)
            instance.peak_rss_mb = max(instance.peak_rss_mb, rss)
            if instance.limits.watchdog and rss > instance.limits.memory_mb and not instance.fate.over_memory:
                what = f"the memory watchdog killed it at {rss:.0f} MiB resident (limits: rlimit+watchdog)"
                instance.kill_over(Overrun.MEMORY, what, "over its memory limit")

    def watch_pids(self, instances: list[Instance], table: ProcessTable) -> None:
        """Kill an instance running more processes and threads than its pids limit (the rlimit
        fallback's pids.max: RLIMIT_NPROC counts the function's whole uid, so it is only a backstop)."""
        limit = pids_max(self.runtime.max_pids, self.runtime.max_concurrency)
        live = [i for i in instances if i.pid and not i.fate.ended and not i.fate.over_pids]
        if not live:
            return
        table.refresh()
        for instance in live:
            tasks = table.tasks_of(instance.pid)
            if tasks > limit:
                what = (
                    f"the process watch counted {tasks} processes and threads in it, more than its "
                    f"limit of {limit} (max_pids={self.runtime.max_pids} plus the runtime's own)"
                )
                instance.kill_over(Overrun.PIDS, what, "over its pids limit")

    def watch_disk(self, instances: list[Instance]) -> None:
        """Kill an instance whose temp folder holds more than ``tmp_mb`` (the tmpfs's job, where the
        runtime may not mount one)."""
        for instance in instances:
            if instance.fate.ended or instance.tmp_dir is None or instance.fate.over_disk:
                continue
            used = folder_mb(instance.tmp_dir)
            if used > self.runtime.tmp_mb:
                what = (
                    f"the temp folder's size watch killed it: {instance.tmp_dir} held {used:.1f} MiB, "
                    f"more than tmp_mb={self.runtime.tmp_mb}"
                )
                instance.kill_over(Overrun.DISK, what, "its temp space is over tmp_mb")


def folder_mb(path: Path, max_entries: int = 100_000) -> float:
    """Disk space used by the files below ``path`` (allocated blocks; links not followed), MiB."""
    total, seen, stack = 0, 0, [str(path)]
    while stack and seen < max_entries:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += st.st_blocks * 512
            if stat.S_ISDIR(st.st_mode):
                stack.append(entry.path)
    return total / (1 << 20)


def rss_mb(pid: int) -> float:
    try:
        return float(psutil.Process(pid).memory_info().rss) / (1 << 20)
    except psutil.Error:
        return 0.0


def process_age_s(pid: int) -> float:
    try:
        return max(0.0, time.time() - psutil.Process(pid).create_time())
    except psutil.Error:
        return 0.0


def cpu_seconds(pid: int) -> float:
    try:
        times = psutil.Process(pid).cpu_times()
        return float(times.user + times.system + times.children_user + times.children_system)
    except psutil.Error:
        return 0.0


class ProcessTable:
    """Who runs under each instance: one read of /proc, shared by a backend's functions, read again
    when the host's task count (``/proc/loadavg``) grew by ``growth`` or ``max_age_s`` passed."""

    def __init__(self, max_age_s: float = 1.0, growth: int = 4) -> None:
        self.max_age_s = max_age_s
        self.growth = growth
        self.taken = -max_age_s
        self.low = 0  # the fewest host tasks seen since the last read
        self.threads: dict[int, int] = {}
        self.children: dict[int, list[int]] = {}
        self.sessions: dict[int, list[int]] = {}

    def refresh(self) -> None:
        now, tasks = time.monotonic(), host_tasks()
        self.low = min(self.low, tasks)
        if now - self.taken < self.max_age_s and tasks < self.low + self.growth:
            return
        self.taken, self.low = now, tasks
        self.threads, self.children, self.sessions = {}, {}, {}
        for pid, (parent, session, threads) in read_processes().items():
            self.threads[pid] = threads
            self.children.setdefault(parent, []).append(pid)
            self.sessions.setdefault(session, []).append(pid)

    def tasks_of(self, pid: int) -> int:
        """Threads of ``pid``, of its descendants and of anything left in its session."""
        found: set[int] = set()
        stack = [pid, *self.sessions.get(pid, [])]
        while stack:
            current = stack.pop()
            if current not in found:
                found.add(current)
                stack.extend(self.children.get(current, []))
        return sum(self.threads.get(p, 0) for p in found)


def host_tasks() -> int:
    """Tasks (threads) on this host, from /proc/loadavg's ``running/total`` field."""
    try:
        return int(Path("/proc/loadavg").read_text().split()[3].split("/")[1])
    except (OSError, IndexError, ValueError):
        return 0


def read_processes() -> dict[int, tuple[int, int, int]]:
    """pid -> (parent pid, session id, thread count) for every process in /proc."""
    rows: dict[int, tuple[int, int, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
            fields = data[data.rindex(b")") + 2 :].split()
            rows[int(name)] = (int(fields[1]), int(fields[3]), int(fields[17]))
        except (OSError, ValueError, IndexError):
            continue  # it ended meanwhile
    return rows
