"""Shared inputs for the runtime tests."""

from __future__ import annotations

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
