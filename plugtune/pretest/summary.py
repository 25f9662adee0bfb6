"""The numbers of a test run, as plain dicts (the ``summary`` of ``--json``): pure functions.

Demand (what the trainer will ask of the rollout): every step starts ``batch_size × group_size``
rollouts at once and waits for all of them, so a step should take about as long as its slowest
rollouts (the p95 time a rollout spends in its function), with none waiting for a free slot. The
runtime keeps up when (1) its capacity, ``max_instances × max_concurrency`` of the rollout, covers
that demand, and (2) the measured throughput (finished rollouts per second of the run) reaches 80%
of ``demand / (p95 service time + 0.1 s of scheduling slack)``. A test that drives fewer rollouts
at once than the demand measures (2) at its own concurrency.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from plugtune.jobs.plugin_metrics import PluginMetrics
from plugtune.pretest.calls import CallRecord
from plugtune.pretest.trial import FunctionSnapshot

BLOCKING_MARK = "blocked its event loop"
KEEP_UP_SHARE = 0.8  # measured / needed throughput below this is "does not keep up"
SLACK_S = 0.1  # scheduling slack per step: millisecond rollouts are never the trainer's bottleneck


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def latency(calls: Sequence[CallRecord]) -> dict[str, float]:
    values = [c.latency_ms for c in calls]
    return {
        "p50_ms": round(percentile(values, 0.50), 3),
        "p95_ms": round(percentile(values, 0.95), 3),
        "p99_ms": round(percentile(values, 0.99), 3),
        "max_ms": round(max(values, default=0.0), 3),
    }


def errors_by_cause(calls: Sequence[CallRecord]) -> dict[str, dict[str, Any]]:
    """``cause -> {count, type, plugin, message, traceback, hint}`` of the first call with that cause."""
    out: dict[str, dict[str, Any]] = {}
    for call in sorted(calls, key=lambda c: c.started):
        if call.error is None:
            continue
        seen = out.get(call.error.cause)
        if seen is not None:
            seen["count"] += 1
            continue
        out[call.error.cause] = {
            "count": 1,
            "type": call.error.type,
            "plugin": call.plugin,
            "sample_index": call.sample_index,
            "message": call.error.message,
            "traceback": call.error.traceback,
            "hint": call.error.hint,
        }
    return out


#: The name a Dependency error of an undeclared service is counted under.
UNDECLARED = "(undeclared)"


def dependency_errors(calls: Sequence[CallRecord]) -> dict[str, Any]:
    """The calls that failed on a service the plugins call (owner ``dependency``), apart from the
    plugins' own errors: ``{"calls", "plugin_errors", "by_dependency": {name: {cause: {count,
    plugin, message, hint}}}}`` (the first call's plugin, message and hint per dependency and
    cause; an undeclared service's name is ``(undeclared)``)."""
    failed = sorted((c for c in calls if c.error is not None), key=lambda c: c.started)
    by: dict[str, dict[str, dict[str, Any]]] = {}
    for call in failed:
        error = call.error
        if error is None or error.owner != "dependency":
            continue
        causes = by.setdefault(error.dependency or UNDECLARED, {})
        seen = causes.get(error.cause)
        if seen is not None:
            seen["count"] += 1
            continue
        causes[error.cause] = {
            "count": 1,
            "plugin": call.plugin,
            "message": error.message,
            "hint": error.hint,
        }
    on_dependencies = sum(n["count"] for causes in by.values() for n in causes.values())
    return {"calls": on_dependencies, "plugin_errors": len(failed) - on_dependencies, "by_dependency": by}


def plugin_metrics(calls: Sequence[CallRecord]) -> dict[str, dict[str, dict[str, float]]]:
    """Every call's ``ctx.metric`` values as a job's step aggregates them: plugin -> name ->
    {mean, min, max, count}."""
    found = PluginMetrics()
    for call in calls:
        if call.metrics:
            found.add(call.name, call.metrics)
    return found.stats()


def statuses(calls: Sequence[CallRecord]) -> dict[str, int]:
    """How many calls ended with each plugin status (and ``error`` for failed calls)."""
    return dict(Counter(c.status for c in calls))


def peak_memory(fn: FunctionSnapshot, calls: Sequence[CallRecord]) -> dict[str, float | None]:
    """The highest memory seen (sampled gauge or an error's peak), against the limit."""
    limit = float(fn.runtime.memory_mb)
    percents = [p.value for p in fn.metrics if p.name == "memory_percent"]
    sampled = max(percents) * limit / 100.0 if percents else None
    from_errors = [c.error.peak_memory_mb for c in calls if c.error and c.error.peak_memory_mb]
    candidates = [v for v in (sampled, *from_errors) if v is not None]
    peak = max(candidates) if candidates else None
    return {
        "peak_mb": None if peak is None else round(peak, 1),
        "limit_mb": limit,
        "peak_percent": None if peak is None else round(100.0 * peak / limit, 1),
    }


def blocking_warnings(fn: FunctionSnapshot) -> list[str]:
    """The runtime's warnings that this async plugin blocked its event loop."""
    return [line.message for line in fn.logs if line.level == "WARNING" and BLOCKING_MARK in line.message]


def plugin_summary(fn: FunctionSnapshot, calls: Sequence[CallRecord], wall_s: float) -> dict[str, Any]:
    """One row of the per-plugin table. Calls belong to a plugin by its name (unique in a job):
    one ``file.py:function`` listed twice under different ``name:``s is two plugins."""
    mine = [c for c in calls if c.name == fn.name]
    instances = [p.value for p in fn.metrics if p.name == "instances"]
    blocked = blocking_warnings(fn)
    return {
        "plugin": fn.entry,
        "name": fn.name,
        "kind": fn.kind,
        "code_hash": fn.code_hash,
        "runtime": fn.runtime.to_dict(),
        "calls": len(mine),
        "failed": sum(1 for c in mine if c.error is not None),
        "statuses": statuses(mine),
        "qps": round(len(mine) / wall_s, 3) if wall_s > 0 else 0.0,
        "latency": latency(mine),
        "errors_by_cause": errors_by_cause(mine),
        "memory": peak_memory(fn, mine),
        "instances_used": int(max(instances, default=0)),
        "event_loop_blocking": {"count": len(blocked), "first": blocked[0] if blocked else ""},
    }


def demand(
    batch_size: int,
    group_size: int,
    rollout: FunctionSnapshot,
    calls: Sequence[CallRecord],
    wall_s: float,
    driven_concurrency: int,
) -> dict[str, Any]:
    """Whether the rollout's runtime keeps up with the trainer (see the module docstring)."""
    wanted = batch_size * group_size
    rt = rollout.runtime
    capacity = rt.max_instances * rt.max_concurrency
    mine = [c for c in calls if c.name == rollout.name]
    done = [c for c in mine if c.error is None]
    service_s = percentile([c.service_ms or c.latency_ms for c in done], 0.95) / 1000.0
    waits = [max(0.0, c.latency_ms - c.service_ms) for c in done if c.service_ms]
    window_s = active_window_s(mine) or wall_s
    measured_qps = len(done) / window_s if window_s > 0 else 0.0
    at = min(wanted, max(1, driven_concurrency))
    needed_qps = at / (service_s + SLACK_S) if done else 0.0
    keeps_up = capacity >= wanted and (not done or measured_qps >= KEEP_UP_SHARE * needed_qps)
    out: dict[str, Any] = {
        "definition": "batch_size × group_size rollouts start at once each step; capacity = "
        "max_instances × max_concurrency must cover them, and the measured rollout throughput must "
        f"reach {KEEP_UP_SHARE:.0%} of (rollouts at once) / (p95 time in the function + {SLACK_S:g} s)",
        "rollouts_per_step": wanted,
        "capacity": capacity,
        "driven_concurrency": driven_concurrency,
        "service_time_p95_ms": round(service_s * 1000, 3),
        "queue_wait_p95_ms": round(percentile(waits, 0.95), 3),
        "measured_qps": round(measured_qps, 3),
        "needed_qps": round(needed_qps, 3),
        "keeps_up": keeps_up,
        "suggestion": "" if keeps_up else suggestion(wanted, rt.max_concurrency, rt.max_instances, capacity),
    }
    if driven_concurrency < wanted:
        out["note"] = (
            f"only {driven_concurrency} rollouts ran at once; drive the full demand with "
            f"--concurrency {wanted} and --samples >= {wanted}"
        )
    return out


def dependency_demand(
    usage: dict[str, dict[str, Any]], rollouts: int, needed_qps: float
) -> list[dict[str, Any]]:
    """Per declared dependency, its budget against the trainer's demand: the requests one rollout
    made of it in this run (the connections its budget opened per rollout, graders' included),
    what the trainer's pace (``needed_qps`` rollouts/s) needs of it per minute, the rollouts/s its
    ``rpm`` allows, and whether all of its ``concurrency`` was in use (calls then waited for it)."""
    out = []
    for name, u in sorted(usage.items()):
        per_rollout = u["opened"] / rollouts if rollouts else 0.0
        needed_rpm = needed_qps * 60.0 * per_rollout
        rpm, concurrency = u["rpm"], u["concurrency"]
        allowed_qps = rpm / 60.0 / per_rollout if rpm and per_rollout else None
        out.append(
            {
                "name": name,
                "requests_per_rollout": round(per_rollout, 3),
                "needed_rpm": round(needed_rpm, 1),
                "rpm": rpm,
                "allowed_qps": None if allowed_qps is None else round(allowed_qps, 3),
                "rpm_sets_pace": rpm is not None and needed_rpm > rpm,
                "concurrency": concurrency,
                "peak": u["peak"],
                "concurrency_full": concurrency is not None and u["peak"] >= concurrency,
                "rate_limited": u["decreases"],
            }
        )
    return out


def active_window_s(calls: Sequence[CallRecord]) -> float:
    """From the first call's start to the last call's end (0 for no calls)."""
    if not calls:
        return 0.0
    return max(c.started + c.latency_ms / 1000.0 for c in calls) - min(c.started for c in calls)


def suggestion(wanted: int, max_concurrency: int, max_instances: int, capacity: int) -> str:
    if capacity < wanted:
        instances = math.ceil(wanted / max_concurrency)
        if instances <= 1000:
            return (
                f"capacity {capacity} < {wanted} rollouts per step: set the rollout's "
                f"max_instances: {instances} (with max_concurrency: {max_concurrency}), or raise "
                f"max_concurrency to {math.ceil(wanted / max_instances)} if one instance can run that many"
            )
        return f"raise max_concurrency to {math.ceil(wanted / 1000)} and max_instances to 1000"
    return (
        "the capacity covers the demand but calls queue or wait: look for blocking calls in async code "
        "(plugtune lint), a slow policy or tool, or too little CPU per instance (runtime.cpu)"
    )
