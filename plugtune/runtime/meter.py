"""What a function's ``PolicyBridge`` measures of each declared dependency, per sampling period.

One :class:`DependencyMeter` per declared dependency per function (so per plugin): the connections
the bridge let through to it (``requests_per_s``, and the period's count ``requests``: a
per-request client opens one per request), how
long each lasted until its reply's last bytes (``latency_p50_ms``/``latency_p99_ms``, from a bounded
reservoir of the period's durations; a kept-alive connection counts once, for its whole life until
its last reply), the calls that failed on it by cause (``errors/<cause>``, from the classified call
outcomes) and the share of the period's requests answered 429 that failed a call
(``rate_limited_share``). ``open``, ``limit`` (the concurrency in use under AIMD, only with a
declared ``concurrency``) and ``waiting`` are the budget's now, shared by the job's plugins.

Series are named ``dependency/<name>/<metric>``: at most :data:`SERIES_PER_DEPENDENCY` per declared
dependency (causes outside :class:`~plugtune.errors.DependencyCause` are not counted), so a plugin
cannot create series of its own choosing.
"""

from __future__ import annotations

import collections
import random
import time

from plugtune.errors import DependencyCause
from plugtune.runtime.budget import DependencyBudget
from plugtune.runtime.metrics import percentile

PREFIX = "dependency/"
RESERVOIR = 1024  # durations kept per period (uniformly drawn past that), for p50/p99
CAUSES = tuple(c.value for c in DependencyCause)
SERIES_PER_DEPENDENCY = 8 + len(CAUSES)


def series_name(dependency: str, metric: str) -> str:
    return f"{PREFIX}{dependency}/{metric}"


class DependencyMeter:
    def __init__(self, name: str, budget: DependencyBudget, seed: int = 0) -> None:
        self.name = name
        self.budget = budget
        self.opened = 0  # connections let through this period
        self.seen = 0  # durations offered to the reservoir this period
        self.durations_ms: list[float] = []
        self.errors: collections.Counter[str] = collections.Counter()
        self.since = time.monotonic()
        self.rng = random.Random(seed)

    def opening(self) -> None:
        """A connection to the dependency was let through (the budget granted it)."""
        self.opened += 1

    def closed(self, duration_s: float) -> None:
        """A connection ended: its duration to its reply's last bytes (or to its end without one)."""
        self.seen += 1
        value = max(0.0, duration_s) * 1000
        if len(self.durations_ms) < RESERVOIR:
            self.durations_ms.append(value)
            return
        slot = self.rng.randrange(self.seen)  # reservoir sampling: each duration kept with equal odds
        if slot < RESERVOIR:
            self.durations_ms[slot] = value

    def failed(self, cause: str) -> None:
        """A call failed on the dependency with ``cause`` (a DependencyCause value; others ignored)."""
        if cause in CAUSES:
            self.errors[cause] += 1

    def sample(self) -> dict[str, float]:
        """The period's values by series name, and a new period."""
        now = time.monotonic()
        dt = max(1e-6, now - self.since)
        durations = sorted(self.durations_ms)
        opened, errors = self.opened, self.errors
        self.since, self.opened, self.seen, self.durations_ms = now, 0, 0, []
        self.errors = collections.Counter()
        limited = errors.get(DependencyCause.RATE_LIMITED.value, 0)
        values = {
            "requests": float(opened),  # the period's count: weighs its share over a longer range
            "requests_per_s": opened / dt,
            "open": float(self.budget.open),
            "waiting": float(self.budget.waiting),
            "rate_limited_share": limited / max(opened, limited) if limited else 0.0,
        }
        if durations:
            values["latency_p50_ms"] = percentile(durations, 0.5)
            values["latency_p99_ms"] = percentile(durations, 0.99)
        if self.budget.limit is not None:
            values["limit"] = float(max(1, int(self.budget.limit)))
        for cause in CAUSES:
            values[f"errors/{cause}"] = errors.get(cause, 0) / dt
        return {series_name(self.name, k): v for k, v in values.items()}
