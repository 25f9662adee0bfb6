"""Multi-task steps (issue 27 item 5): a row's ``task`` picks the plugin set that scores it, and each
task's reward, failures and signal health are measured apart (``task/<name>/...``), with warnings
of their own; the metric and routing helpers on their own."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from plugtune import grader
from plugtune.gateway import JobSampling, PolicyGateway
from plugtune.gateway.sampling import SamplingView
from plugtune.sdk import Context, Sample, Trajectory
from plugtune.trainer.config import TrainerConfig
from plugtune.trainer.evaluation import EvalSettings, Evaluator
from plugtune.trainer.groups import Plugins
from plugtune.trainer.grpo import GRPOTrainer
from plugtune.trainer.model import load_model
from plugtune.trainer.tasks import DEFAULT_TASK, split_task_metric, task_metric, task_of, warning_key
from plugtune.trainer.testing import InProcessFunction, InProcessPolicyServer
from tests.trainer import plugins as p

CALLED: list[tuple[str, str]] = []  # (grader, the row's own tag), as each grader was called


@grader
def always_one(ctx: Context, sample: Sample, trajectory: Trajectory) -> float:
    CALLED.append(("always_one", sample.extra["tag"]))
    return 1.0


@grader
def always_zero(ctx: Context, sample: Sample, trajectory: Trajectory) -> float:
    CALLED.append(("always_zero", sample.extra["tag"]))
    if sample.extra.get("crash"):
        raise RuntimeError("the code grader crashed on purpose")
    return 0.0


def row(i: int, task: str | None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "messages": [{"role": "user", "content": f"{i}+{i}=?"}],
        "extra": {"tag": task or DEFAULT_TASK, **extra},
    }
    return out if task is None else {**out, "task": task}


def trainer_of(path: Path, rows: list[dict[str, Any]], steps: int = 1) -> GRPOTrainer:
    lm = load_model(path)
    config = TrainerConfig(
        steps=steps, batch_size=len(rows), group_size=2, max_new_tokens=4, learning_rate=1e-3
    )
    default = Plugins(rollout=InProcessFunction(p.answer), graders=[InProcessFunction(p.digits)])
    tasks = {
        "math": Plugins(rollout=InProcessFunction(p.answer), graders=[InProcessFunction(always_one)]),
        "code": Plugins(rollout=InProcessFunction(p.answer), graders=[InProcessFunction(always_zero)]),
    }
    plugins = replace(default, tasks=tasks)
    server = InProcessPolicyServer(lm.model, lm.tokenizer, seed=7)
    return GRPOTrainer(lm.model, lm.tokenizer, server, plugins, rows, config)


async def test_each_row_is_graded_by_its_tasks_graders_and_measured_per_task(tiny_model_path: Path) -> None:
    CALLED.clear()
    rows = [row(0, "math"), row(1, "code"), row(2, "math"), row(3, "code")]
    result = await trainer_of(tiny_model_path, rows).step()
    # every grader call was for a row of its own task, and each task's rows were all graded
    assert sorted(set(CALLED)) == [("always_one", "math"), ("always_zero", "code")]
    assert len(CALLED) == 8  # 4 rows x group_size 2, one grader each
    for r in result.records:
        task = rows[r.sample_index]["task"]
        assert set(r.reward_components) == {"always_one" if task == "math" else "always_zero"}
    m = result.metrics
    assert m[task_metric("math", "reward/mean")] == 1.0
    assert m[task_metric("code", "reward/mean")] == 0.0
    assert m["reward/mean"] == 0.5  # the mix, averaged: what per-task metrics keep apart
    assert m[task_metric("math", "reward/always_one")] == 1.0
    assert m[task_metric("code", "trajectories/total")] == 4.0
    # every group of either task had one reward for all: no gradient, per task
    assert m[task_metric("math", "groups/zero_variance_share")] == 1.0
    assert m[task_metric("code", "groups/zero_variance_share")] == 1.0
    # the per-task health checks warn with the task's own key and name
    keys = {w.key for w in result.warnings}
    assert {"no_gradient@task=math", "no_gradient@task=code"} <= keys
    warning = next(w for w in result.warnings if w.key == "no_gradient@task=code")
    assert warning.message.startswith("task code: step 1: 2 of 2 groups")
    assert "task/code/groups/zero_variance_share" in warning.message


async def test_failures_are_counted_per_task(tiny_model_path: Path) -> None:
    rows = [row(0, "math"), row(1, "code", crash=True), row(2, None)]
    result = await trainer_of(tiny_model_path, rows).step()
    m = result.metrics
    assert m[task_metric("code", "trajectories/failed")] == 2.0
    assert m[task_metric("code", "plugin/errors/500")] == 2.0
    assert m[task_metric("math", "trajectories/failed")] == 0.0
    assert task_metric("math", "plugin/errors/500") not in m
    # a row without task is the default task, graded by the top-level graders
    assert m[task_metric(DEFAULT_TASK, "trajectories/total")] == 2.0
    default = [r for r in result.records if r.sample_index == 2]
    assert all(set(r.reward_components) <= {"digits"} for r in default)


async def test_a_job_without_tasks_records_no_task_metrics(tiny_model_path: Path) -> None:
    lm = load_model(tiny_model_path)
    plugins = Plugins(rollout=InProcessFunction(p.answer), graders=[InProcessFunction(always_one)])
    config = TrainerConfig(steps=1, batch_size=2, group_size=2, max_new_tokens=4)
    server = InProcessPolicyServer(lm.model, lm.tokenizer, seed=7)
    rows = [row(0, None), row(1, None)]
    result = await GRPOTrainer(lm.model, lm.tokenizer, server, plugins, rows, config).step()
    assert not [n for n in result.metrics if n.startswith("task/")]


def test_a_task_without_plugin_set_is_refused_by_name() -> None:
    plugins = Plugins(rollout=InProcessFunction(p.answer), graders=[InProcessFunction(always_one)])
    assert plugins.for_task(DEFAULT_TASK) is plugins
    with pytest.raises(ValueError, match="task 'chem' has no plugin set"):
        plugins.for_task("chem")


def test_task_names_and_metric_names() -> None:
    assert task_of({"messages": [], "task": "math"}) == "math"
    assert task_of({"messages": []}) == DEFAULT_TASK
    assert task_metric("math", "reward/mean") == "task/math/reward/mean"
    assert split_task_metric("task/math/reward/mean") == ("math", "reward/mean")
    assert split_task_metric("reward/mean") is None
    assert warning_key("no_gradient@task=math") == "no_gradient"
    assert warning_key("no_gradient") == "no_gradient"


async def test_an_evaluation_of_a_multi_task_job_measures_each_task(tiny_model_path: Path) -> None:
    lm = load_model(tiny_model_path)
    plugins = trainer_of(tiny_model_path, [row(0, "math")]).runner.plugins  # the same three sets
    rows = [row(0, "math"), row(1, "code"), row(2, "code")]
    settings = EvalSettings(k=1, samples=2, max_new_tokens=4)
    with PolicyGateway(lm.model, lm.tokenizer, sampling=JobSampling(1.0, 1.0, 4)) as gateway:
        greedy = SamplingView(gateway, JobSampling(0.0, 1.0, 4, purpose="greedy evaluation"))
        sampled = SamplingView(gateway, JobSampling(1.0, 1.0, 4, purpose="sampled evaluation"))
        result = await Evaluator(greedy, sampled, plugins, rows, settings).run(0, 0)
    m = result.metrics
    assert m["eval/pass@1"] == pytest.approx(1 / 3)  # the mix
    assert m[task_metric("math", "eval/pass@1")] == 1.0 and m[task_metric("code", "eval/pass@1")] == 0.0
    assert m[task_metric("math", "eval/pass@k")] == 1.0 and m[task_metric("code", "eval/pass@k")] == 0.0
    assert (m[task_metric("math", "eval/rows")], m[task_metric("code", "eval/rows")]) == (1.0, 2.0)
