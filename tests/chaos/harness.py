"""The chaos harness: a seeded plan of calls with faults decided per sample, a driver that sends
them through a real runtime, the confusion matrix of injected vs classified cause, and the leak
probes (processes, cgroups, temp dirs, fds, memory)."""

from __future__ import annotations

import asyncio
import collections
import os
import random
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from plugtune.errors import Cause, PluginCallError
from plugtune.runtime.function import Function
from plugtune.sdk import Context, Sample, Trajectory
from plugtune.types import CallOutcome

PLUGINS = Path(__file__).resolve().parent / "plugins"
OK = "ok"
NO_ANSWER = "no answer"

#: What each injected fault must be classified as.
EXPECTED: dict[str, str] = {
    "exception": Cause.ERROR_500.value,
    "timeout": Cause.TIMEOUT.value,
    "os_exit": Cause.EOF.value,
    "segfault": Cause.EOF.value,
    "sigkill": Cause.EOF.value,
    "memory_bomb": Cause.OOM.value,
    "nan": Cause.INVALID_REWARD.value,
    "fd_exhaustion": Cause.ERROR_500.value,
}
PIDS_CAUSE = getattr(Cause, "PIDS", None)
DISK_CAUSE = getattr(Cause, "DISK", None)
if PIDS_CAUSE is not None:
    EXPECTED["fork_bomb"] = PIDS_CAUSE.value
if DISK_CAUSE is not None:
    EXPECTED["disk_fill"] = DISK_CAUSE.value


def entry(function: str) -> str:
    return f"{PLUGINS / 'chaos.py'}:{function}"


@dataclass(frozen=True)
class Call:
    index: int
    fault: str  # "" for a call that must return its reward
    function: int  # which deployed function gets it

    @property
    def expected(self) -> str:
        return EXPECTED[self.fault] if self.fault else OK


def plan(calls: int, fault_share: float, seed: int, kinds: list[str], functions: int) -> list[Call]:
    """``calls`` calls, ``fault_share`` of them faults spread evenly over ``kinds``, in seeded order."""
    faults = round(calls * fault_share)
    names = [kinds[i % len(kinds)] for i in range(faults)] + [""] * (calls - faults)
    rng = random.Random(seed)
    rng.shuffle(names)
    return [Call(i, name, rng.randrange(functions)) for i, name in enumerate(names)]


@dataclass
class Result:
    call: Call
    got: str
    detail: str = ""


async def drive(
    functions: list[Function], calls: list[Call], in_flight: int, answer_s: float
) -> list[Result]:
    """Send every call, at most ``in_flight`` at once per function; each gets an answer or NO_ANSWER
    after ``answer_s``."""
    gates = [asyncio.Semaphore(in_flight) for _ in functions]

    async def one(call: Call) -> Result:
        async with gates[call.function]:
            try:
                outcome = await asyncio.wait_for(_invoke(functions[call.function], call), answer_s)
            except PluginCallError as exc:
                return Result(call, exc.cause, exc.message[:200])
            except TimeoutError:
                return Result(call, NO_ANSWER, f"no answer in {answer_s} s")
            except Exception as exc:  # noqa: BLE001 - anything but a classified error is a bug the matrix shows
                return Result(call, f"raised {type(exc).__name__}", str(exc)[:200])
            if outcome.status != "success" or outcome.value != float(call.index):
                return Result(call, "wrong answer", f"{outcome.status} {outcome.value!r}")
            return Result(call, OK)

    return list(await asyncio.gather(*(one(c) for c in calls)))


def _invoke(fn: Function, call: Call) -> Coroutine[Any, Any, CallOutcome]:
    tid = f"chaos-{call.index}"
    sample = Sample(
        messages=[{"role": "user", "content": "chaos"}], extra={"fault": call.fault, "reward": call.index}
    )
    trajectory = Trajectory(trajectory_id=tid, messages=[{"role": "assistant", "content": "x"}])
    return fn.invoke(Context(job_id="chaos", trajectory_id=tid), sample, trajectory)


def confusion(results: list[Result]) -> dict[tuple[str, str], int]:
    """(injected fault or ok, classified cause or ok) -> count."""
    return dict(collections.Counter((r.call.fault or OK, r.got) for r in results))


def misclassified(results: list[Result]) -> list[Result]:
    return [r for r in results if r.got != r.call.expected]


def format_matrix(results: list[Result]) -> str:
    matrix = confusion(results)
    rows = sorted({k[0] for k in matrix}, key=lambda f: (f != OK, f))
    cols = sorted({k[1] for k in matrix} | {r.call.expected for r in results})
    width = max(len(c) for c in cols + ["injected"]) + 2
    lines = ["injected".ljust(16) + "".join(c.rjust(width) for c in cols)]
    for row in rows:
        lines.append(row.ljust(16) + "".join(str(matrix.get((row, c), "")).rjust(width) for c in cols))
    return "\n".join(lines)


# ---- leak probes --------------------------------------------------------------------------------


@dataclass
class Snapshot:
    children: set[int]
    fds: int
    rss_mb: float
    temp: set[str] = field(default_factory=set)


def snapshot(temp_dir: Path) -> Snapshot:
    me = psutil.Process()
    children = {c.pid for c in me.children(recursive=True) if _alive(c)}
    fds = len(os.listdir("/proc/self/fd"))
    return Snapshot(children, fds, me.memory_info().rss / (1 << 20), set(os.listdir(temp_dir)))


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


async def settled(before: Snapshot, temp_dir: Path, within_s: float = 10.0) -> Snapshot:
    """The snapshot once leftover children and temp dirs are gone, or after ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        now = snapshot(temp_dir)
        clean = now.children <= before.children and now.temp <= before.temp and now.fds <= before.fds
        if clean or time.monotonic() > deadline:
            return now
        await asyncio.sleep(0.1)


def cgroup_dirs(limits: object) -> list[Path]:
    """The runtime's own cgroup folders (one per controller), or [] under rlimits."""
    roots = getattr(limits, "roots", None)
    if isinstance(roots, dict):
        return list(roots.values())
    root = getattr(limits, "root", None)
    return [root] if isinstance(root, Path) else []


def cgroup_children(limits: object) -> set[str]:
    return {d.name for root in cgroup_dirs(limits) if root.exists() for d in root.iterdir() if d.is_dir()}
