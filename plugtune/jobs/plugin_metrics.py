"""Plugin metrics: every ``ctx.metric(name, value)`` of a step, aggregated per plugin and name.

A step's values are kept as training metrics (plugin ``""``, by step) named
``metric/<plugin>/<name>/<stat>``, stat one of mean, min, max, count (``eval/metric/...`` for
data.validation's calls), so the store, the curves, compare, TensorBoard/W&B and ``jobs show``
read them as they read ``reward/mean``. Only finite values count; a plugin's names beyond
``MAX_NAMES`` in one step are left out (and counted), so a plugin that makes up a name per call
cannot flood the store.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from plugtune.types import MetricPoint

PREFIX = "metric/"
STATS = ("mean", "min", "max", "count")
MAX_NAMES = 64  # per plugin and step
MAX_NAME_CHARS = 120
#: The longest metric name the store keeps: a name is cut further so that the whole
#: ``eval/metric/<plugin>/<name>/count`` fits.
STORED_NAME_MAX = 200


@dataclass
class Aggregate:
    """One name's values in one step: count, sum, min and max."""

    count: int = 0
    total: float = 0.0
    low: float = math.inf
    high: float = -math.inf

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.low, self.high = min(self.low, value), max(self.high, value)

    def merge(self, other: Aggregate) -> None:
        self.count += other.count
        self.total += other.total
        self.low, self.high = min(self.low, other.low), max(self.high, other.high)

    def stats(self) -> dict[str, float]:
        return {
            "mean": self.total / self.count,
            "min": self.low,
            "max": self.high,
            "count": float(self.count),
        }


class PluginMetrics:
    """The ``ctx.metric`` values of one step's calls, by plugin and name."""

    def __init__(self) -> None:
        self.by_plugin: dict[str, dict[str, Aggregate]] = {}
        self.dropped: Counter[str] = Counter()  # per plugin: values of names past MAX_NAMES

    def add(self, plugin: str, metrics: Mapping[str, float]) -> None:
        """One call's metrics (its ``ctx.metrics``)."""
        names = self.by_plugin.setdefault(plugin, {})
        for name, value in metrics.items():
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            key = str(name)[:MAX_NAME_CHARS]
            if key not in names and len(names) >= MAX_NAMES:
                self.dropped[plugin] += 1
                continue
            names.setdefault(key, Aggregate()).add(float(value))

    def merge(self, other: PluginMetrics) -> None:
        for plugin, names in other.by_plugin.items():
            mine = self.by_plugin.setdefault(plugin, {})
            for name, agg in names.items():
                mine.setdefault(name, Aggregate()).merge(agg)
        self.dropped.update(other.dropped)

    def stats(self) -> dict[str, dict[str, dict[str, float]]]:
        """plugin -> name -> {mean, min, max, count}."""
        return {
            plugin: {name: agg.stats() for name, agg in sorted(names.items()) if agg.count}
            for plugin, names in sorted(self.by_plugin.items())
            if any(agg.count for agg in names.values())
        }

    def flat(self, prefix: str = "") -> dict[str, float]:
        """``{prefix}metric/<plugin>/<name>/<stat>`` -> value."""
        return {
            prefix + metric_name(plugin, name, stat): value
            for plugin, names in self.stats().items()
            for name, values in names.items()
            for stat, value in values.items()
        }

    def points(self, step: int, prefix: str = "") -> list[MetricPoint]:
        now = time.time()
        return [MetricPoint(now, "", name, value, step=step) for name, value in self.flat(prefix).items()]


def metric_name(plugin: str, name: str, stat: str) -> str:
    """``metric/<plugin>/<name>/<stat>``, ``name`` cut so that it fits the store's
    :data:`STORED_NAME_MAX` with any phase prefix (``eval/``) and stat."""
    room = STORED_NAME_MAX - len(f"eval/{PREFIX}{plugin}//count")
    return f"{PREFIX}{plugin}/{name[: max(room, 1)]}/{stat}"


def parse(metric: str, plugins: Iterable[str] = ()) -> tuple[str, str, str, str] | None:
    """``(phase prefix, plugin, name, stat)`` of a stored plugin metric's name, None for any other
    metric. ``plugins``: the job's plugin names, so a name with a ``/`` in it is still split right."""
    phase = "eval/" if metric.startswith("eval/" + PREFIX) else ""
    if not metric.startswith(phase + PREFIX):
        return None
    rest, _, stat = metric[len(phase + PREFIX) :].rpartition("/")
    if stat not in STATS or "/" not in rest:
        return None
    known = sorted((p for p in plugins if rest.startswith(p + "/") and len(rest) > len(p) + 1), key=len)
    plugin = known[-1] if known else rest.partition("/")[0]
    return phase, plugin, rest[len(plugin) + 1 :], stat


def latest_stats(
    latest: Mapping[str, float], steps: Mapping[str, int | None], plugins: Iterable[str] = ()
) -> dict[str, dict[str, dict[str, float]]]:
    """plugin -> name -> {mean, min, max, count, step} of the newest training step that has them
    (from the newest point of each stored series: ``latest`` values, ``steps`` their steps)."""
    known = list(plugins)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for metric, value in latest.items():
        found = parse(metric, known)
        if found is None or found[0]:
            continue
        _, plugin, name, stat = found
        entry = out.setdefault(plugin, {}).setdefault(name, {})
        entry[stat] = value
        step = steps.get(metric)
        if step is not None:
            entry["step"] = float(max(step, int(entry.get("step", step))))
    return {p: dict(sorted(names.items())) for p, names in sorted(out.items())}
