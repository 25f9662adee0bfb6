"""Shared inputs for the runtime tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from plugtune.sdk import Context, Sample, Trajectory

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "plugins"


def entry(file: str, function: str) -> str:
    return f"{FIXTURES / file}:{function}"


def sample(**extra: object) -> Sample:
    return Sample(messages=[{"role": "user", "content": "6*7?"}], extra={"answer": "42", **extra})


def trajectory(text: str = "42", tid: str = "traj-1") -> Trajectory:
    return Trajectory(trajectory_id=tid, messages=[{"role": "assistant", "content": text}])


def ctx(tid: str = "traj-1") -> Context:
    return Context(job_id="job-1", trajectory_id=tid)


async def turns_until(predicate: Callable[[], bool], within_s: float = 20.0) -> bool:
    """Look again on every loop turn (sleep(0)), so a state that lasts one turn is seen."""
    deadline = time.monotonic() + within_s
    for _ in range(10_000_000):
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0)
    return False


async def eventually(predicate: Callable[[], bool], within_s: float = 30.0, every_s: float = 0.02) -> bool:
    """Poll until ``predicate()`` holds, for up to ``within_s`` seconds of wall time (not a count of
    sleeps: a loaded CI machine stretches each one), so a slow but correct outcome is still seen."""
    deadline = time.monotonic() + within_s
    while not predicate():
        if time.monotonic() > deadline:
            return predicate()
        await asyncio.sleep(every_s)
    return True
