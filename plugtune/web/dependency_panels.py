"""The Plugin tab's panel per declared dependency: the service, its declared budget and its charts.

A plugin's dependencies are the job's ``dependencies:`` and those its decorator's ``Runtime`` adds
(the job's win on a name), as the runtime deployed it. Their series (``dependency/<name>/...``,
plugtune.runtime.meter) are measured in the policy-only relay (on Ray, each actor's, summed by the
driver); a plugin deployed with another network has none, and its panels say why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plugtune.runtime.dependencies import Dependency, parse_dependencies
from plugtune.runtime.meter import PREFIX
from plugtune.store.records import Plugin, SeriesPoint
from plugtune.web.charts import PluginChart, _chart
from plugtune.web.models import DependencyPanelOut

POLICY_ONLY = "policy-only"
METRICS: dict[str, str] = {  # the meter's names -> legend labels
    "requests_per_s": "requests/s",
    "latency_p50_ms": "p50",
    "latency_p99_ms": "p99",
    "open": "open",
    "limit": "limit in use (AIMD)",
    "waiting": "waiting",
    "rate_limited_share": "429 share",
}
ERRORS = "errors/"


def declared(job_spec: Mapping[str, Any], plugin: Plugin) -> tuple[Dependency, ...]:
    """The plugin's dependencies: the job's, then its decorator's by other names; entries that do
    not parse (the runtime would have refused them) are left out."""
    out: list[Dependency] = []
    for raw in (job_spec.get("dependencies"), (plugin.runtime or {}).get("dependencies")):
        try:
            found = parse_dependencies({k: _clean(v) for k, v in (raw or {}).items()})
        except (ValueError, AttributeError):
            continue
        names = {d.name for d in out}
        out += [d for d in found if d.name not in names]
    return tuple(out)


def _clean(value: Any) -> Any:
    """A stored entry: ``{url, rpm: None, ...}`` as job.yaml would give it (None is not given)."""
    if isinstance(value, Mapping):
        return {k: v for k, v in value.items() if v is not None}
    return value


def panels(
    job_spec: Mapping[str, Any],
    plugin: Plugin,
    series: dict[str, list[SeriesPoint]],
    start: float,
    end: float,
) -> list[DependencyPanelOut]:
    network = (plugin.runtime or {}).get("network")
    note = ""
    if network is not None and network != POLICY_ONLY:
        note = (
            f"Not measured: this plugin runs with network: {network}, so its connections do not go "
            "through the policy-only relay where each dependency is measured."
        )
    out = []
    for dep in declared(job_spec, plugin):
        own = f"{PREFIX}{dep.name}/"
        mine = {n[len(own) :]: points for n, points in series.items() if n.startswith(own)}
        out.append(
            DependencyPanelOut(
                name=dep.name,
                url=dep.url,
                rpm=dep.rpm,
                concurrency=dep.concurrency,
                timeout_s=dep.timeout_s,
                note=note,
                summary=_summary(mine),
                charts=[_chart(spec, mine, x="time", x_min=start, x_max=end) for spec in _specs(dep.name)],
            )
        )
    return out


def _summary(mine: dict[str, list[SeriesPoint]]) -> dict[str, float]:
    """Over the range: the most requests per second, the share of requests rate limited (each
    period's share weighted by its count of requests) and the highest p99 latency."""
    rates = [p.value for p in mine.get("requests_per_s", [])]
    if not rates:
        return {}
    out = {"peak_requests_per_s": max(rates)}
    counts = {p.time: p.value for p in mine.get("requests", [])}
    weighted = [(counts[p.time], p.value) for p in mine.get("rate_limited_share", []) if p.time in counts]
    total = sum(r for r, _ in weighted)
    out["rate_limited_share"] = sum(r * share for r, share in weighted) / total if total > 0 else 0.0
    p99 = [p.value for p in mine.get("latency_p99_ms", [])]
    if p99:
        out["peak_latency_p99_ms"] = max(p99)
    return out


def _specs(name: str) -> list[PluginChart]:
    def only(*names: str) -> Any:
        return lambda n: n in names

    return [
        PluginChart(
            f"dep:{name}:requests", "Requests/s", "requests/s", only("requests_per_s"), METRICS.__getitem__
        ),
        PluginChart(
            f"dep:{name}:latency",
            "Latency p50/p99",
            "ms",
            only("latency_p50_ms", "latency_p99_ms"),
            METRICS.__getitem__,
        ),
        PluginChart(
            f"dep:{name}:errors",
            "Errors by cause",
            "errors/s",
            lambda n: n.startswith(ERRORS),
            lambda n: n[len(ERRORS) :],
        ),
        PluginChart(
            f"dep:{name}:budget",
            "Budget in use",
            "connections",
            only("open", "limit", "waiting"),
            METRICS.__getitem__,
        ),
        PluginChart(
            f"dep:{name}:rate_limited",
            "429 share (calls rate limited / requests)",
            "share",
            only("rate_limited_share"),
            METRICS.__getitem__,
        ),
    ]
