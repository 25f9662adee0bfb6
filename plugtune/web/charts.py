"""Chart specs the console's JS draws: training curves by step, plugin resource metrics by time."""

from __future__ import annotations

import time as _time
from collections.abc import Callable
from dataclasses import dataclass

from plugtune.jobs import plugin_metrics as effect
from plugtune.store import Store
from plugtune.store.records import Plugin, SeriesPoint
from plugtune.trainer.tasks import split_task_metric
from plugtune.web.models import ChartOut, PluginMetricsOut, SeriesOut

MAX_POINTS = 400  # per series and chart: a 7-day chart costs what a 1-hour one does
MAX_EXTRA_CHARTS = 12
MAX_PLUGIN_CHARTS = 48  # ctx.metric names drawn, over all plugins
CALL_ERRORS = "plugin/failed_calls/"  # + cause: a step's failed plugin calls of that cause
LIFETIME = "life"  # the plugin's lifetime: the default range of the Plugin tab
END_SLACK_S = 60.0
MIN_MARGIN_S = 10.0

RANGES: dict[str, float] = {
    "1h": 3600.0,
    "3h": 3 * 3600.0,
    "6h": 6 * 3600.0,
    "12h": 12 * 3600.0,
    "3d": 3 * 86400.0,
    "7d": 7 * 86400.0,
}
RANGE_NAMES = (LIFETIME, *RANGES, "custom")


@dataclass(frozen=True)
class PluginChart:
    key: str
    title: str
    unit: str
    matches: Callable[[str], bool]
    label: Callable[[str], str]


def _exact(name: str) -> Callable[[str], bool]:
    return lambda n: n == name


def _prefix(prefix: str) -> Callable[[str], bool]:
    return lambda n: n.startswith(prefix)


def _after(prefix: str) -> Callable[[str], str]:
    return lambda n: n[len(prefix) :] if n.startswith(prefix) else n


PLUGIN_CHARTS: list[PluginChart] = [
    PluginChart("exec_qps", "Exec QPS", "counts/s", _exact("exec_qps"), lambda n: "exec QPS"),
    PluginChart("latency", "Latency", "ms", _prefix("latency_ms_"), _after("latency_ms_")),
    PluginChart(
        "error_qps", "Error QPS", "counts/s", _prefix("error_qps"), lambda n: n.partition("/")[2] or n
    ),
    PluginChart("cpu_percent", "CPU", "%", _exact("cpu_percent"), lambda n: "CPU"),
    PluginChart("memory_percent", "Memory", "%", _exact("memory_percent"), lambda n: "memory"),
    PluginChart("instances", "Instance count", "instances", _exact("instances"), lambda n: "instances"),
    PluginChart(
        "outbound_mib_s", "Outbound traffic", "MiB/s", _exact("outbound_mib_s"), lambda n: "outbound"
    ),
    PluginChart(
        "concurrency_per_instance",
        "Concurrent requests per instance",
        "requests",
        _exact("concurrency_per_instance"),
        lambda n: "concurrency",
    ),
]


def is_signal_health(name: str) -> bool:
    """A reward-signal health metric (plugtune.trainer.health): a share between 0 and 1 per step."""
    return (
        name in ("groups/zero_variance_share", "response/truncated_share")
        or (name.startswith("reward/at_") and name.endswith("_share"))
        or (name.startswith("grader/") and name.endswith("/unscorable_share"))
        or (name.startswith("reward/") and name.endswith("/variance_share"))
    )


# Training curves: (key, title, unit, which metric names, legend label).
TRAINING_CHARTS: list[PluginChart] = [
    PluginChart(
        "reward",
        "Reward (mean and per grader)",
        "",
        lambda n: (
            n.startswith("reward/") and n not in ("reward/std", "reward/scored") and not is_signal_health(n)
        ),
        _after("reward/"),
    ),
    PluginChart(  # what the no_gradient, truncated, unscorable, saturated, dominant_component warnings read
        "signal",
        "Reward signal health (shares of groups, replies, trajectories, reward variance)",
        "share",
        is_signal_health,
        lambda n: n,
    ),
    PluginChart("loss", "Loss", "", lambda n: n == "loss" or n.startswith("loss/"), lambda n: n),
    PluginChart("kl", "KL", "", lambda n: n == "kl" or n.startswith("kl/"), lambda n: n),
    PluginChart(
        "response_length",
        "Response length",
        "tokens",
        lambda n: n == "response_length" or n.startswith("response_length/"),
        lambda n: n,
    ),
    PluginChart(  # every failed call, retried ones and those of the step that stopped the job too
        "plugin_errors",
        "Plugin errors by cause",
        "failed calls",
        _prefix(CALL_ERRORS),
        _after(CALL_ERRORS),
    ),
    PluginChart(
        "trajectories",
        "Trajectories per step",
        "count",
        lambda n: n.startswith(("trajectories/", "plugin/errors/")),
        lambda n: (
            f"failed: {n[len('plugin/errors/') :]}" if n.startswith("plugin/") else _after("trajectories/")(n)
        ),
    ),
    PluginChart("time", "Step time", "s", _prefix("time/"), _after("time/")),
    PluginChart(  # hyperparameters.dynamic_sampling: drawn only for a job that records it
        "dynamic_sampling",
        "Dynamic sampling (groups left out, extra groups and rollouts, groups trained)",
        "count",
        _prefix("dynamic_sampling/"),
        _after("dynamic_sampling/"),
    ),
]


def _of_task(matches: Callable[[str], bool]) -> Callable[[str], bool]:
    """A multi-task job's ``task/<name>/<metric>`` whose metric ``matches``."""
    return lambda n: (found := split_task_metric(n)) is not None and matches(found[1])


def _task_label(shown: str = "") -> Callable[[str], str]:
    """``math`` for the task's ``shown`` metric, ``math: <metric>`` for its others (a failed call's
    cause as ``math: failed: 500``, as the trajectories chart says it)."""

    def label(name: str) -> str:
        task, metric = split_task_metric(name) or ("", name)
        if metric == shown:
            return task
        metric = metric.replace("plugin/errors/", "failed: ").removeprefix("trajectories/")
        return f"{task}: {metric.removeprefix('reward/')}"

    return label


def _task_eval_label(name: str) -> str:
    task, metric = split_task_metric(name) or ("", name)
    return f"{task}: {metric.removeprefix('eval/')}"


# A multi-task job's tasks (job.yaml's tasks:), one series per task: drawn only for a job that has them.
TASK_CHARTS: list[PluginChart] = [
    PluginChart(
        "task_reward",
        "Reward per task (mean, and per grader)",
        "",
        _of_task(lambda m: m.startswith("reward/") and m != "reward/scored" and not is_signal_health(m)),
        _task_label("reward/mean"),
    ),
    PluginChart(
        "task_failures",
        "Trajectories per task (failed, and failed calls by cause)",
        "count",
        _of_task(lambda m: m.startswith(("trajectories/", "plugin/errors/")) or m == "reward/scored"),
        _task_label(),
    ),
    PluginChart(
        "task_signal",
        "Reward signal health per task (shares of groups, replies, trajectories, reward variance)",
        "share",
        _of_task(is_signal_health),
        _task_label(),
    ),
    PluginChart(
        "task_eval",
        "Eval per task: pass@1 (greedy), pass@k (sampled), reward, rows",
        "",
        _of_task(lambda m: m.startswith("eval/")),
        _task_eval_label,
    ),
    PluginChart(
        "task_response_length",
        "Response length per task",
        "tokens",
        _of_task("response_length".__eq__),
        _task_label("response_length"),
    ),
]
TRAINING_CHARTS += TASK_CHARTS
#: Charts left out of a job that recorded none of their metrics (no validation set, an option off).
OPTIONAL_CHARTS = ("eval_", "dynamic_sampling", "task_")
# Evaluation of data.validation (plugtune.trainer.evaluation): shown once a job has evaluated.
EVAL_CHARTS: list[PluginChart] = [
    PluginChart(
        "eval_pass",
        "Eval pass rate: pass@1 (greedy), pass@k (sampled)",
        "share of rows",
        lambda n: n in ("eval/pass@1", "eval/pass@k"),
        lambda n: "pass@1 (greedy)" if n == "eval/pass@1" else "pass@k (sampled)",
    ),
    PluginChart(
        "eval_reward",
        "Eval reward (greedy; mean and per grader)",
        "",
        _prefix("eval/reward/"),
        _after("eval/reward/"),
    ),
    PluginChart(
        "eval_response_length",
        "Eval response length (greedy)",
        "tokens",
        _exact("eval/response_length"),
        lambda n: "response_length",
    ),
    PluginChart(
        "eval_counts",
        "Eval rows, k, unscored trajectories and plugin calls",
        "count",
        lambda n: n in ("eval/rows", "eval/k", "eval/unscored") or n.startswith("eval/plugin/"),
        _after("eval/"),
    ),
]
TRAINING_CHARTS += EVAL_CHARTS
ACTIVE_EMPTY = {"plugin_errors": "No plugin error so far."}
ENDED_EMPTY = {"plugin_errors": "No plugin call failed."}
ACTIVE = ("queued", "validating", "running")


def training_charts(store: Store, job_id: int, job_status: str = "running") -> list[ChartOut]:
    """The job page's curves by step; metrics no chart claims get one chart each (a few at most).

    A step run again (a retry that restarted before it) is drawn once, with its newest value."""
    series = {
        n: _newest_per_step(points) for n, points in store.metrics(job_id, "", max_points=MAX_POINTS).items()
    }
    active = job_status in ACTIVE
    texts = ACTIVE_EMPTY if active else ENDED_EMPTY
    other = "Not recorded yet." if active else f"Not recorded: the job {job_status} without it."
    charts = [_chart(spec, series, x="step", empty=texts.get(spec.key, other)) for spec in TRAINING_CHARTS]
    charts = [c for c in charts if c.series or not c.key.startswith(OPTIONAL_CHARTS)]
    plugins = [p.name for p in store.list_plugins(job_id)]
    parsed = {n: found for n in series if (found := effect.parse(n, plugins)) is not None}
    claimed = {n for spec in TRAINING_CHARTS for n in series if spec.matches(n)} | set(parsed)
    extra = sorted(n for n in series if n not in claimed)[:MAX_EXTRA_CHARTS]
    for name in extra:
        charts.append(_chart(PluginChart(name, name, "", _exact(name), lambda n: n), series, x="step"))
    return charts + _plugin_metric_charts(series, parsed)


def _plugin_metric_charts(
    series: dict[str, list[SeriesPoint]], parsed: dict[str, tuple[str, str, str, str]]
) -> list[ChartOut]:
    """One chart per plugin and ``ctx.metric`` name: its mean, min and max per step (eval ones
    too), under a section per plugin; the title says how many values the newest step had."""
    names = sorted({(plugin, name) for _, plugin, name, _ in parsed.values()})
    out = []
    for plugin, name in names[:MAX_PLUGIN_CHARTS]:
        own = {n: f for n, f in parsed.items() if (f[1], f[2]) == (plugin, name)}
        drawn = {n for n, f in own.items() if f[3] != "count"}
        labels = {n: f"{f[0]}{f[3]}" for n, f in own.items()}
        spec = PluginChart(f"metric:{plugin}:{name}", name, "", drawn.__contains__, labels.__getitem__)
        chart = _chart(spec, series, x="step")
        count = series.get(effect.metric_name(plugin, name, "count"))
        if count:
            last = count[-1]
            chart.title = f"{name} ({last.value:.0f} values in step {last.step})"
        chart.section = f"Plugin {plugin}"
        out.append(chart)
    return out


def window(range_name: str, start: float | None, end: float | None, plugin: Plugin) -> tuple[float, float]:
    """The time window a range shows: custom start/end; ``life``, the plugin's lifetime (its start
    to its end, or now; a plugin that never started lived no time: the moment it ended, or now);
    else the range up to now (or to the plugin's end). An ended plugin's last points are written as
    the attempt closes, just after its end: the window keeps them."""
    if range_name == "custom":
        if start is None or end is None or end <= start:
            raise ValueError("a custom range needs start < end (epoch seconds)")
        return start, end
    if range_name != LIFETIME and range_name not in RANGES:
        raise ValueError(f"range must be one of {', '.join(RANGE_NAMES)}; got {range_name!r}")
    now = _time.time()
    if range_name != LIFETIME:
        stop = min(now, plugin.ended_at + END_SLACK_S) if plugin.ended_at is not None else now
        return stop - RANGES[range_name], stop
    stop = plugin.ended_at if plugin.ended_at is not None else now
    begin = plugin.started_at if plugin.started_at is not None else stop
    margin = max(MIN_MARGIN_S, (stop - begin) * 0.05)
    return begin - margin, min(now, stop + margin)


def _newest_per_step(points: list[SeriesPoint]) -> list[SeriesPoint]:
    if any(p.step is None for p in points):
        return points
    newest: dict[int, SeriesPoint] = {}
    for p in points:  # oldest first: a later point of the same step replaces the earlier one
        newest[int(p.step or 0)] = p
    return [newest[s] for s in sorted(newest)]


def plugin_metrics(
    store: Store, job_id: int, plugin: Plugin, range_name: str, start: float, end: float
) -> PluginMetricsOut:
    series = (
        {}
        if plugin.monitoring_expired
        else store.metrics(job_id, plugin.name, since=start, until=end, max_points=MAX_POINTS)
    )
    charts = [_chart(spec, series, x="time", x_min=start, x_max=end) for spec in PLUGIN_CHARTS]
    from plugtune.web.dependency_panels import panels  # it draws with this module's _chart

    job = store.get_job(job_id)
    dependencies = panels(job.spec if job is not None else {}, plugin, series, start, end)
    message = ""
    if plugin.monitoring_expired:
        message = (
            f"The monitoring data of plugin {plugin.name} has been reclaimed: metrics and logs are kept "
            "for the retention period after a plugin ends (PLUGTUNE_RETENTION_DAYS), then deleted."
        )
    return PluginMetricsOut(
        plugin=plugin.name,
        range=range_name,
        start=start,
        end=end,
        reclaimed=plugin.monitoring_expired,
        reclaimed_message=message,
        charts=charts,
        dependencies=dependencies,
    )


def _chart(
    spec: PluginChart,
    series: dict[str, list[SeriesPoint]],
    *,
    x: str,
    x_min: float | None = None,
    x_max: float | None = None,
    empty: str = "",
) -> ChartOut:
    names = sorted(n for n in series if spec.matches(n))
    # By step when every point has one (training metrics); otherwise the whole chart is by time.
    by_step = x == "step" and all(p.step is not None for n in names for p in series[n])
    out = [
        SeriesOut(
            name=spec.label(name),
            points=[
                (float(p.step) if by_step and p.step is not None else p.time, p.value) for p in series[name]
            ],
        )
        for name in names
    ]
    axis = "step" if by_step else "time"
    return ChartOut(
        key=spec.key,
        title=spec.title,
        unit=spec.unit,
        x=axis,
        x_min=x_min,
        x_max=x_max,
        empty=empty,
        series=out,
    )
