"""Evaluation on held-out rows: greedy pass@1, sampled pass@k, mean reward per grader, length.

Every row runs through the job's own rollout and graders (same runtime, caller and gateway),
tagged ``phase="eval"`` and never trained on: once greedily (temperature 0) and ``samples``
times at the job's temperature. A trajectory *passes* when its reward is at least
``pass_threshold``. Per row, pass@k is the unbiased estimator ``1 - C(n-c, k) / C(n, k)`` over
its ``n`` scored samples of which ``c`` passed (Chen et al., 2021), averaged over rows. Rewards
per grader and the response length are those of the greedy replies. A trajectory without a
reward (failed, unscorable, discarded) is counted in ``eval/unscored`` and left out of every
mean, never scored 0; so is a row with fewer than ``k`` scored samples from pass@k.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from plugtune.sdk import Sample, Sampling
from plugtune.trainer.groups import GroupRunner, Plugins, gather_or_cancel
from plugtune.trainer.protocols import Caller, PolicyServer, call_once
from plugtune.trainer.rewards import summary
from plugtune.trainer.tasks import task_metric, task_of
from plugtune.types import TrajectoryRecord

#: Group id prefixes of evaluation trajectories (``eval-greedy-s10-p3-r0``: step 10, row 3).
GREEDY_PREFIX, SAMPLED_PREFIX = "eval-greedy-s", "eval-sampled-s"


@dataclass(frozen=True)
class EvalSettings:
    """How a job evaluates (job.yaml's ``eval`` section and the job's sampling settings)."""

    k: int = 4
    samples: int = 4  # n: replies sampled per row for pass@k (n >= k; 0: greedy only)
    pass_threshold: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64

    def __post_init__(self) -> None:
        if self.samples and self.samples < self.k:
            raise ValueError(f"eval samples={self.samples} must be at least k={self.k} (or 0)")


@dataclass(frozen=True)
class EvalResult:
    step: int  # the training step whose weights were evaluated (0: before training)
    metrics: dict[str, float]
    records: list[TrajectoryRecord]


def pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that at least one of ``k`` of the ``n`` samples (``c`` of which passed) passes."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def is_pass(record: TrajectoryRecord, threshold: float) -> bool:
    return record.reward is not None and record.reward >= threshold


def eval_metrics(
    greedy: Sequence[TrajectoryRecord], sampled: Sequence[Sequence[TrajectoryRecord]], settings: EvalSettings
) -> dict[str, float]:
    """The ``eval/*`` metrics of one evaluation: one greedy record per row, each row's samples."""
    scored = [r for r in greedy if r.reward is not None]
    out: dict[str, float] = {
        "eval/rows": float(len(greedy)),
        "eval/unscored": float(
            sum(r.reward is None for r in [*greedy, *(s for row in sampled for s in row)])
        ),
        "eval/reward/mean": summary([r.reward for r in scored])["mean"],
        "eval/pass@1": _mean([float(is_pass(r, settings.pass_threshold)) for r in scored]),
        "eval/response_length": _mean([float(len(r.response_ids)) for r in greedy]),
    }
    for name in sorted({n for r in scored for n in r.reward_components}):
        out[f"eval/reward/{name}"] = summary([r.reward_components.get(name) for r in scored])["mean"]
    if settings.samples:
        per_row = []
        for row in sampled:
            row_scored = [r for r in row if r.reward is not None]
            if len(row_scored) >= settings.k:
                passed = sum(is_pass(r, settings.pass_threshold) for r in row_scored)
                per_row.append(pass_at_k(len(row_scored), passed, settings.k))
        out["eval/pass@k"] = _mean(per_row)
        out["eval/k"] = float(settings.k)
    return out


#: The eval metrics a multi-task job also records per task, as ``task/<name>/eval/...``.
TASK_EVAL_METRICS = ("eval/pass@1", "eval/pass@k", "eval/reward/mean", "eval/rows")


def task_eval_metrics(
    task_by_row: Sequence[str],
    greedy: Sequence[TrajectoryRecord],
    sampled: Sequence[Sequence[TrajectoryRecord]],
    settings: EvalSettings,
) -> dict[str, float]:
    """``task/<name>/eval/pass@1`` (and pass@k, reward/mean, rows) of each task's held-out rows;
    ``task_by_row[i]`` is row i's task (a record's ``sample_index``)."""
    out: dict[str, float] = {}
    for task in sorted(set(task_by_row)):
        own = [r for r in greedy if task_by_row[r.sample_index] == task]
        rows = [row for row in sampled if row and task_by_row[row[0].sample_index] == task]
        found = eval_metrics(own, rows, settings)
        out.update({task_metric(task, k): found[k] for k in TASK_EVAL_METRICS if k in found})
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


class Evaluator:
    """Evaluates the policy on ``rows``: ``greedy`` and ``sampled`` serve the same model, the first
    decoding greedily (temperature 0), the second with the job's settings."""

    def __init__(
        self,
        greedy: PolicyServer,
        sampled: PolicyServer,
        plugins: Plugins,
        rows: Sequence[dict[str, Any]],
        settings: EvalSettings,
        *,
        caller: Caller = call_once,
        job_id: str = "",
        rows_at_once: int = 8,
    ) -> None:
        self.rows, self.settings, self.rows_at_once = rows, settings, max(1, rows_at_once)
        self.greedy = GroupRunner(greedy, plugins, caller, job_id, phase="eval", group_prefix=GREEDY_PREFIX)
        self.sampled = GroupRunner(
            sampled, plugins, caller, job_id, phase="eval", group_prefix=SAMPLED_PREFIX
        )
        self._finished: list[TrajectoryRecord] = []  # of an evaluation that was stopped

    def take_stopped(self) -> list[TrajectoryRecord]:
        """Every trajectory of evaluations stopped since the last call, finished or not (as
        ``GRPOTrainer.take_stopped``)."""
        stopped = [*self._finished, *self.greedy.stopped, *self.sampled.stopped]
        self._finished, self.greedy.stopped, self.sampled.stopped = [], [], []
        return stopped

    async def run(self, step: int, policy_version: int) -> EvalResult:
        """Evaluate every row (``rows_at_once`` rows' trajectories in flight at a time)."""
        greedy: list[TrajectoryRecord] = []
        sampled: list[list[TrajectoryRecord]] = []
        finished: list[TrajectoryRecord] = []

        async def kept(run: Awaitable[list[TrajectoryRecord]]) -> list[TrajectoryRecord]:
            records = await run
            finished.extend(records)  # kept should a sibling stop the evaluation
            return records

        try:
            await self._rows(step, policy_version, greedy, sampled, kept)
        except BaseException:
            self._finished += finished
            raise
        records = [*greedy, *(r for row in sampled for r in row)]
        metrics = eval_metrics(greedy, sampled, self.settings)
        if any("task" in row for row in self.rows):  # a multi-task job: each task's pass rates too
            metrics.update(
                task_eval_metrics([task_of(row) for row in self.rows], greedy, sampled, self.settings)
            )
        return EvalResult(step=step, metrics=metrics, records=records)

    async def _rows(
        self,
        step: int,
        policy_version: int,
        greedy: list[TrajectoryRecord],
        sampled: list[list[TrajectoryRecord]],
        kept: Callable[[Awaitable[list[TrajectoryRecord]]], Awaitable[list[TrajectoryRecord]]],
    ) -> None:
        s = self.settings
        greedy_sampling = Sampling(temperature=0.0, top_p=1.0, max_tokens=s.max_new_tokens)
        sampled_sampling = Sampling(temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_new_tokens)
        for at in range(0, len(self.rows), self.rows_at_once):
            chunk = list(enumerate(self.rows))[at : at + self.rows_at_once]
            runs = [
                self.greedy.run(step, _sample(i, row, greedy_sampling), 1, policy_version, task=task_of(row))
                for i, row in chunk
            ]
            if s.samples:
                runs += [
                    self.sampled.run(
                        step, _sample(i, row, sampled_sampling), s.samples, policy_version, task=task_of(row)
                    )
                    for i, row in chunk
                ]
            groups = await gather_or_cancel([kept(r) for r in runs])
            greedy += [g[0] for g in groups[: len(chunk)]]
            sampled += groups[len(chunk) :]


def _sample(index: int, row: dict[str, Any], sampling: Sampling) -> Sample:
    return replace(Sample.from_dict(row), index=index, sampling=sampling)
