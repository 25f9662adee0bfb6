"""Multi-task jobs: a dataset row's ``task`` picks the plugin set that rolls it out and grades it,
and each task's steps are measured on their own, so a math + code mix is not averaged into one number.

A row without ``task`` belongs to :data:`DEFAULT_TASK` (job.yaml's top-level ``plugins``). A job with
``tasks:`` gets, per step and per task present in the step, the metrics ``task/<name>/<metric>``
(``reward/mean``, ``trajectories/failed``, ``groups/zero_variance_share``, ...; see
:func:`task_metrics`) and the reward-signal checks of :mod:`plugtune.trainer.health` run per task:
their warnings' keys are ``<key>@task=<name>`` and their messages start with ``task <name>:``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from plugtune.trainer.batch import is_trainable
from plugtune.trainer.health import SignalMonitor, SignalThresholds, StepWarning, signal_metrics
from plugtune.trainer.rewards import summary
from plugtune.types import TrajectoryRecord

#: The task of a row without ``task``: job.yaml's top-level ``plugins``.
DEFAULT_TASK = "default"
#: What a task's metric names start with: ``task/math/reward/mean``.
TASK_PREFIX = "task/"


def task_of(row: Mapping[str, Any]) -> str:
    """The task a dataset row names (:data:`DEFAULT_TASK` without one)."""
    task = row.get("task")
    return task if isinstance(task, str) and task else DEFAULT_TASK


def task_metric(task: str, name: str) -> str:
    """``task/<task>/<name>``: one task's share of a step metric."""
    return f"{TASK_PREFIX}{task}/{name}"


def split_task_metric(name: str) -> tuple[str, str] | None:
    """``(task, metric)`` of a per-task metric name, None for any other name."""
    if not name.startswith(TASK_PREFIX):
        return None
    task, _, metric = name[len(TASK_PREFIX) :].partition("/")
    return (task, metric) if task and metric else None


def task_metrics(records: Sequence[TrajectoryRecord]) -> dict[str, float]:
    """One task's step metrics (without the ``task/<name>/`` prefix): its reward (mean, scored,
    per grader), trajectories (total, trained, failed, discarded), failed calls by cause
    (``plugin/errors/<cause>``) and mean response length."""
    rewards = summary([r.reward for r in records])
    out = {
        "reward/mean": rewards["mean"],
        "reward/scored": rewards["count"],
        "trajectories/total": float(len(records)),
        "trajectories/trained": float(sum(is_trainable(r) and r.advantage != 0.0 for r in records)),
        "trajectories/failed": float(sum(r.status == "failed" for r in records)),
        "trajectories/discarded": float(sum(r.status == "discard" for r in records)),
        "response_length": summary([float(len(r.response_ids)) for r in records])["mean"],
    }
    for name in sorted({n for r in records for n in r.reward_components}):
        out[f"reward/{name}"] = summary([r.reward_components.get(name) for r in records])["mean"]
    for cause, count in Counter(e.cause for r in records for e in r.errors).items():
        out[f"plugin/errors/{cause}"] = float(count)
    return out


@dataclass
class TaskHealth:
    """The per-task metrics and reward-signal checks of a multi-task job's steps: one
    :class:`SignalMonitor` per task (its own window, floor and ceiling)."""

    thresholds: SignalThresholds | None = None
    steps: int = 0

    def __post_init__(self) -> None:
        self.monitors: dict[str, SignalMonitor] = {}

    def observe(
        self,
        step: int,
        records: Sequence[TrajectoryRecord],
        task_by_row: Sequence[str],
        weights: Mapping[str, Mapping[str, float]],
        max_new_tokens: int | None,
    ) -> tuple[dict[str, float], list[StepWarning]]:
        """The step's ``task/<name>/...`` metrics and per-task warnings; ``task_by_row[i]`` is the
        task of dataset row ``i`` (a record's ``sample_index``), ``weights[task]`` its graders'."""
        by_task: dict[str, list[TrajectoryRecord]] = {}
        for r in records:
            task = task_by_row[r.sample_index] if 0 <= r.sample_index < len(task_by_row) else DEFAULT_TASK
            by_task.setdefault(task, []).append(r)
        metrics: dict[str, float] = {}
        warnings: list[StepWarning] = []
        for task in sorted(by_task):
            own = by_task[task]
            graders = weights.get(task, {})
            monitor = self.monitors.setdefault(task, SignalMonitor(self.thresholds, self.steps))
            signal = monitor.measure(step, own, graders)
            found = {
                **task_metrics(own),
                "groups/zero_variance_share": signal.zero_variance_share,
                "response/truncated_share": signal.truncated_share,
                **signal_metrics(signal),
            }
            metrics.update({task_metric(task, k): v for k, v in found.items()})
            warnings += [_of_task(task, w) for w in monitor.warnings(signal, max_new_tokens)]
        return metrics, warnings


def _of_task(task: str, warning: StepWarning) -> StepWarning:
    """A task's warning: its own key (shown once per attempt per task), its message naming the task
    and the task's metric names."""
    message = warning.message
    for name in _METRICS_SAID:
        message = message.replace(f"metric {name}", f"metric {task_metric(task, name)}")
        message = message.replace(f"metrics {name}", f"metrics {task_metric(task, name)}")
    return replace(warning, key=f"{warning.key}@task={task}", message=f"task {task}: {message}")


#: Metric names the health warnings point at, which a task's warning points at under its prefix.
_METRICS_SAID = (
    "groups/zero_variance_share",
    "response/truncated_share",
    "reward/at_ceiling_share",
    "reward/at_floor_share",
    "response_length",
)


def warning_key(key: str) -> str:
    """A warning's kind without its task (``no_gradient@task=math`` -> ``no_gradient``)."""
    return key.partition("@task=")[0]
