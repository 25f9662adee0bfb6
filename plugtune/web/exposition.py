"""``/metrics``: jobs, plugins and their newest resource metrics in the Prometheus text format."""

from __future__ import annotations

import math
from collections.abc import Iterable

from plugtune.store import Store
from plugtune.store.records import JobStatus

ACTIVE = (JobStatus.QUEUED.value, JobStatus.VALIDATING.value, JobStatus.RUNNING.value)
MAX_ACTIVE_JOBS = 200  # per-job series are exported for at most this many queued/running jobs


def render(store: Store) -> str:
    """The whole exposition: small and bounded however many jobs the store holds."""
    out: list[str] = []
    _family(out, "plugtune_jobs", "gauge", "Jobs by status.")
    for state in JobStatus:
        out.append(_sample("plugtune_jobs", {"status": state.value}, store.count_jobs(state.value)))
    active = [j for s in ACTIVE for j in store.list_jobs(s, limit=MAX_ACTIVE_JOBS)][:MAX_ACTIVE_JOBS]
    _family(out, "plugtune_job_steps_done", "gauge", "Training steps done by queued or running jobs.")
    for job in active:
        out.append(_sample("plugtune_job_steps_done", {"job": job.id, "name": job.name}, job.steps_done))
    _family(out, "plugtune_job_auto_retries", "gauge", "Automatic retries so far of queued or running jobs.")
    for job in active:
        out.append(_sample("plugtune_job_auto_retries", {"job": job.id}, job.auto_retries))
    _family(out, "plugtune_plugin_up", "gauge", "1 for the status each plugin of a running job is in.")
    for job in active:
        for plugin in store.list_plugins(job.id):
            labels = {"job": job.id, "plugin": plugin.name, "role": plugin.role, "status": plugin.status}
            out.append(_sample("plugtune_plugin_up", labels, 1))
    _family(out, "plugtune_trajectories", "gauge", "Trajectories of running jobs by status.")
    for job in active:
        for status, count in sorted(store.trajectory_status_counts(job.id).items()):
            out.append(_sample("plugtune_trajectories", {"job": job.id, "status": status}, count))
    values = [(m.job_id, m.plugin, m.name, m.value) for m in store.latest_metrics([j.id for j in active])]
    _family(out, "plugtune_plugin_metric", "gauge", "Newest value of each plugin resource metric.")
    out.extend(_metric_samples("plugtune_plugin_metric", ((j, p, n, v) for j, p, n, v in values if p)))
    _family(out, "plugtune_training_metric", "gauge", "Newest value of each training metric.")
    out.extend(_metric_samples("plugtune_training_metric", ((j, p, n, v) for j, p, n, v in values if not p)))
    return "\n".join(out) + "\n"


def _metric_samples(family: str, rows: Iterable[tuple[int, str, str, float]]) -> list[str]:
    lines = []
    for job_id, plugin, name, value in rows:
        labels: dict[str, object] = {"job": job_id, "metric": name}
        if plugin:
            labels["plugin"] = plugin
        lines.append(_sample(family, labels, value))
    return lines


def _family(out: list[str], name: str, kind: str, help_text: str) -> None:
    out.append(f"# HELP {name} {help_text}")
    out.append(f"# TYPE {name} {kind}")


def _sample(name: str, labels: dict[str, object], value: float) -> str:
    inner = ",".join(f'{key}="{_escape(str(v))}"' for key, v in labels.items())
    return f"{name}{{{inner}}} {_number(float(value))}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value) if not value.is_integer() else str(int(value))
