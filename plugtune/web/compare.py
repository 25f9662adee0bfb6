"""Comparing 2-5 jobs side by side: curves overlaid, failed plugin calls by cause, step time, and
the keys of their stored specs that differ. ``GET /api/compare?ids=1,2`` and the /compare page."""

from __future__ import annotations

import json
import statistics
from typing import Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from plugtune.jobs import plugin_metrics
from plugtune.store import Store
from plugtune.store.records import Job, SeriesPoint
from plugtune.trainer.tasks import split_task_metric, task_metric
from plugtune.web import charts, service
from plugtune.web.charts import _newest_per_step
from plugtune.web.models import ChartOut, SeriesOut
from plugtune.web.params import MAX_ID, BadParameter

router = APIRouter(prefix="/api", tags=["api"])

MIN_JOBS, MAX_JOBS = 2, 5
MAX_IDS_READ = 50  # ids parsed from one request (repeats allowed); more is an error
STEP_TIME = "time/step_s"
MAX_STEP_TIMES = 100_000  # steps read for the mean and median (beyond: bucket averages)
MAX_VALUE_CHARS = 300  # a config value longer than this is cut in the diff
# (chart key, title, unit, the metric each job contributes one series of)
CURVES = (
    ("reward", "Reward (mean)", "", "reward/mean"),
    ("loss", "Loss", "", "loss"),
    ("kl", "KL", "", "kl"),
    ("response_length", "Response length", "tokens", "response_length"),
    # the reward signal's health (plugtune.trainer.health): whether each job's steps trained on anything
    ("no_gradient", "Groups with no gradient (zero reward variance)", "share", "groups/zero_variance_share"),
    ("truncated", "Replies cut at max_new_tokens", "share", "response/truncated_share"),
)
# The charts' palette (static/chart.js), so a cause keeps one color across the jobs' bars.
COLORS = ("#2f5bd3", "#c0352b", "#1a7f4b", "#a15c00", "#8a2be2", "#0b6e99", "#b3306f", "#5b6b00")
# where the spec was read from, and the record of its files kept at submission (their paths and hashes):
# they differ with every project folder and say nothing about the settings compared here
HIDDEN_KEYS = ("job_file", "submitted")


class ComparedJobOut(BaseModel):
    id: int
    name: str
    label: str = Field(description="how the charts' legends name the job: #id name")
    status: str
    steps_done: int
    total_steps: int
    error_type: str | None = None
    error_cause: str | None = None


class CauseShareOut(BaseModel):
    cause: str
    calls: float = Field(description="failed plugin calls of this cause, retried ones included")
    share: float = Field(description="calls / the job's failed calls (0..1)")


class JobCausesOut(BaseModel):
    job_id: int
    failed_calls: float
    causes: list[CauseShareOut]


class StepTimeOut(BaseModel):
    job_id: int
    steps: int = Field(description="steps with a recorded time")
    mean_s: float | None = None
    median_s: float | None = None


class ConfigDiffRow(BaseModel):
    key: str = Field(description="a dotted path into the stored spec, e.g. hyperparameters.lr")
    values: list[str | None] = Field(description="one per job, in the order of ids; null: not set")


class CompareOut(BaseModel):
    jobs: list[ComparedJobOut]
    charts: list[ChartOut]
    causes: list[JobCausesOut]
    step_times: list[StepTimeOut]
    config_diff: list[ConfigDiffRow] = Field(description="only the keys whose values differ")
    same_keys: int = Field(description="spec keys every job sets to the same value")


def parse_ids(raw: str | None) -> list[int]:
    """``ids=3,7,9`` -> [3, 7, 9] (repeats dropped); 2 to 5 ids or a BadParameter that says so."""
    parts = [p.strip() for p in (raw or "").split(",") if p.strip()]
    ids: list[int] = []
    for part in parts[:MAX_IDS_READ]:
        if not (part.isascii() and part.isdigit()) or len(part) > 19 or not 1 <= int(part) <= MAX_ID:
            raise BadParameter(
                f"ids: {part[:40]!r} is not a job id; give job ids separated by commas, e.g. ids=3,7"
            )
        if int(part) not in ids:
            ids.append(int(part))
    if not MIN_JOBS <= len(ids) <= MAX_JOBS:
        got = (
            f"{len(ids)} job{'s' if len(ids) != 1 else ''}"
            if len(parts) <= MAX_IDS_READ
            else f"{len(parts)} ids"
        )
        raise BadParameter(
            f"ids: compare needs {MIN_JOBS} to {MAX_JOBS} different jobs, got {got}; "
            "pick them with the checkboxes of the jobs list, or give e.g. ids=3,7"
        )
    return ids


def compare(store: Store, ids: list[int]) -> CompareOut:
    """The comparison of the jobs ``ids``; Missing names every id that is no job."""
    found = [store.get_job(i) for i in ids]
    jobs = [j for j in found if j is not None]
    if len(jobs) < len(ids):
        unknown = ", ".join(str(i) for i, j in zip(ids, found, strict=True) if j is None)
        raise service.Missing(
            f"cannot compare: no job has id {unknown} (it was never created or was deleted); "
            "the jobs list shows the ids that exist"
        )
    series = [store.metrics(j.id, "", max_points=charts.MAX_POINTS) for j in jobs]
    labels = [f"#{j.id} {j.name}" for j in jobs]
    return CompareOut(
        jobs=[_job_out(j, label) for j, label in zip(jobs, labels, strict=True)],
        charts=[_curve(key, title, unit, name, labels, series) for key, title, unit, name in CURVES]
        + _task_curves(labels, series)
        + _plugin_curves(store, jobs, labels, series),
        causes=[_causes(j.id, s) for j, s in zip(jobs, series, strict=True)],
        step_times=[_step_time(store, j.id) for j in jobs],
        **_config_diff([j.spec for j in jobs]),
    )


@router.get("/compare", response_model=CompareOut)
def compare_jobs(
    request: Request,
    ids: str | None = Query(default=None, description="2 to 5 job ids separated by commas, e.g. 3,7"),
) -> CompareOut:
    """2-5 jobs side by side: reward, loss, KL, response length and the mean of each plugin's
    ctx.metric by step (one series per job), failed plugin calls by cause as shares per job, mean
    and median step time, and the keys of their stored specs that differ."""
    return compare(request.app.state.store, parse_ids(ids))


def cause_colors(view: CompareOut) -> dict[str, str]:
    """One color per cause over every job's failed calls (most calls first)."""
    totals: dict[str, float] = {}
    for row in view.causes:
        for c in row.causes:
            totals[c.cause] = totals.get(c.cause, 0.0) + c.calls
    ordered = sorted(totals, key=lambda cause: (-totals[cause], cause))
    return {cause: COLORS[i % len(COLORS)] for i, cause in enumerate(ordered)}


def _job_out(job: Job, label: str) -> ComparedJobOut:
    error = job.error
    return ComparedJobOut(
        id=job.id,
        name=job.name,
        label=label,
        status=job.status,
        steps_done=job.steps_done,
        total_steps=job.steps_total,
        error_type=error.type if error else None,
        error_cause=(error.cause or None) if error else None,
    )


def _curve(
    key: str, title: str, unit: str, name: str, labels: list[str], series: list[dict[str, list[SeriesPoint]]]
) -> ChartOut:
    out = []
    for label, by_name in zip(labels, series, strict=True):
        points = _newest_per_step(by_name.get(name, []))
        if points:
            out.append(SeriesOut(name=label, points=[(float(p.step or 0), p.value) for p in points]))
    return ChartOut(key=key, title=title, unit=unit, x="step", empty="No job recorded it.", series=out)


# A multi-task job's per-task curves (job.yaml's tasks:): one series per job and task, so a math + code
# mix is compared task by task, not as one averaged number.
TASK_CURVES = (
    ("task_reward", "Reward per task (mean)", "", "reward/mean"),
    ("task_failed", "Failed trajectories per task", "count", "trajectories/failed"),
    ("task_no_gradient", "Groups with no gradient per task", "share", "groups/zero_variance_share"),
)


def _task_curves(labels: list[str], series: list[dict[str, list[SeriesPoint]]]) -> list[ChartOut]:
    """Per-task curves, one series per job and task (``#3 mix · math``); none when no job has tasks."""
    tasks = sorted({t[0] for by_name in series for n in by_name if (t := split_task_metric(n)) is not None})
    if not tasks:
        return []
    out = []
    for key, title, unit, metric in TASK_CURVES:
        drawn: list[SeriesOut] = []
        for task in tasks:
            name = task_metric(task, metric)
            chart = _curve(key, title, unit, name, [f"{label} · {task}" for label in labels], series)
            drawn += chart.series
        out.append(
            ChartOut(key=key, title=title, unit=unit, x="step", empty="No job recorded it.", series=drawn)
        )
    return out


def _plugin_curves(
    store: Store, jobs: list[Job], labels: list[str], series: list[dict[str, list[SeriesPoint]]]
) -> list[ChartOut]:
    """The mean of each plugin's ``ctx.metric`` per step, one series per job that has it, under a
    section per plugin."""
    found: set[tuple[str, str]] = set()
    for job, by_name in zip(jobs, series, strict=True):
        plugins = [p.name for p in store.list_plugins(job.id)]
        for name in by_name:
            parsed = plugin_metrics.parse(name, plugins)
            if parsed is not None and not parsed[0] and parsed[3] == "mean":
                found.add((parsed[1], parsed[2]))
    out = []
    for plugin, name in sorted(found)[: charts.MAX_PLUGIN_CHARTS]:
        metric = plugin_metrics.metric_name(plugin, name, "mean")
        chart = _curve(f"metric:{plugin}:{name}", f"{name} (mean)", "", metric, labels, series)
        chart.section = f"Plugin {plugin}"
        out.append(chart)
    return out


def _causes(job_id: int, series: dict[str, list[SeriesPoint]]) -> JobCausesOut:
    counts = {
        name[len(charts.CALL_ERRORS) :]: sum(p.value * p.count for p in points)
        for name, points in series.items()
        if name.startswith(charts.CALL_ERRORS)
    }
    total = sum(counts.values())
    shares = [
        CauseShareOut(cause=cause, calls=calls, share=calls / total if total else 0.0)
        for cause, calls in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        if calls > 0
    ]
    return JobCausesOut(job_id=job_id, failed_calls=total, causes=shares)


def _step_time(store: Store, job_id: int) -> StepTimeOut:
    points = _newest_per_step(
        store.metrics(job_id, "", names=[STEP_TIME], max_points=MAX_STEP_TIMES).get(STEP_TIME, [])
    )
    values = [p.value for p in points]
    if not values:
        return StepTimeOut(job_id=job_id, steps=0)
    weights = sum(p.count for p in points)
    mean = sum(p.value * p.count for p in points) / weights
    return StepTimeOut(job_id=job_id, steps=weights, mean_s=mean, median_s=statistics.median(values))


def _config_diff(specs: list[dict[str, Any]]) -> dict[str, Any]:
    flat = [_flatten({k: v for k, v in spec.items() if k not in HIDDEN_KEYS}) for spec in specs]
    keys = sorted({k for f in flat for k in f})
    rows, same = [], 0
    for key in keys:
        values = [f.get(key) for f in flat]
        if all(v == values[0] for v in values) and values[0] is not None:
            same += 1
            continue
        rows.append(ConfigDiffRow(key=key, values=values))
    return {"config_diff": rows, "same_keys": same}


def _flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """Leaves of a spec as dotted paths (``plugins.graders[0].entry``) -> their value as text."""
    if isinstance(value, dict) and value:
        out: dict[str, str] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, list) and value:
        out = {}
        for i, v in enumerate(value):
            out.update(_flatten(v, f"{prefix}[{i}]"))
        return out
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return {prefix or "(spec)": text[:MAX_VALUE_CHARS] + ("…" if len(text) > MAX_VALUE_CHARS else "")}
