"""``Context``: who and where a call is, its deadline, its logger and its metrics."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Context:
    """Given to every plugin call as its first argument.

    ``logger`` is a standard ``logging.Logger``; every line is tagged with the plugin, the call
    and the trajectory and shows up in the job's plugin logs. ``metric(name, value)`` records a
    number: each training step's values are aggregated per plugin and name (mean, min, max,
    count) into the job's curves, and each call's are kept on its trajectory (a rollout's by
    name, a grader's as ``<grader>/<name>``).
    """

    job_id: str = ""
    step: int = 0
    phase: str = "train"
    sample_id: int = 0
    rollout_index: int = 0
    attempt: int = 1
    trajectory_id: str = ""
    call_id: str = ""
    plugin: str = ""
    deadline: float = float("inf")
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("plugtune.plugin"))
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def remaining_s(self) -> float:
        """Seconds left before the call's timeout (wall clock)."""
        return max(0.0, self.deadline - time.time())

    def metric(self, name: str, value: float) -> None:
        """Record a number for this call (the last value per name wins)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"ctx.metric({name!r}, ...) needs a number, got {type(value).__name__}")
        self.metrics[str(name)] = float(value)

    def info(self) -> dict[str, Any]:
        """The identifying fields, for tagging logs."""
        return {
            "job_id": self.job_id,
            "step": self.step,
            "phase": self.phase,
            "sample_id": self.sample_id,
            "rollout_index": self.rollout_index,
            "attempt": self.attempt,
            "trajectory_id": self.trajectory_id,
            "call_id": self.call_id,
            "plugin": self.plugin,
        }
