"""Eval pass@1 falling while the train reward does not is warned about (issue 27 item 1, eval vs
train divergence): a real job whose grader passes every held-out reply before training, half at
step 2 and none at step 4, while its train reward rises, says so with the held-out rows it lost,
wherever the job is shown; the rule itself on evaluation records (an early dip is not one)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.jobs.report import job_document
from plugtune.settings import Settings
from plugtune.store import Store
from plugtune.trainer.health import (
    EvalPoint,
    SignalThresholds,
    eval_point,
    eval_warnings,
    rises,
    warning_examples,
)
from plugtune.types import TrajectoryRecord
from tests.jobs.jobkit import ROWS, make_job
from tests.jobs.test_eval_job import ROLLOUT
from tests.trainer.test_signal_warnings import record

# Every held-out reply passes before training (step 0), half at step 2, none at step 4; the train
# reward rises each step.
GRADER = """
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    if ctx.phase == "eval":
        return 1.0 if ctx.step == 0 or (ctx.step == 2 and ctx.sample_id % 2 == 0) else 0.0
    return ctx.step / 10 + (0.1 if trajectory.trajectory_id.endswith("r0") else 0.0)
"""


def greedy(step: int, row: int, reward: float, tokens: int = 3) -> TrajectoryRecord:
    r = record(f"eval-greedy-s{step}-p{row}", 0, None, tokens=tokens)
    return replace(r, reward=reward, sample_index=row, phase="eval")


def test_pass_at_1_falling_at_each_evaluation_while_the_train_reward_rises_warns() -> None:
    def point(step: int, passing: int, tokens: int = 3) -> EvalPoint:
        return eval_point(step, [greedy(step, i, float(i < passing), tokens) for i in range(10)], 1.0)

    evals = [point(0, 10), point(2, 8), point(4, 5)]
    assert [e.pass_at_1 for e in evals] == [1.0, 0.8, 0.5]
    rising = [(s, 0.1 * s, 3.0) for s in (1, 2, 3, 4)]
    [warning] = eval_warnings(evals, rising, SignalThresholds())
    assert warning.key == "eval_divergence"
    assert warning.message.startswith(
        "eval at step 4: greedy pass@1 on the held-out rows fell from 1 to 0.8 to 0.5 (steps 0, 2, 4"
    )
    assert warning_examples(warning.message) == [f"eval-greedy-s4-p{i}-r0" for i in (5, 6, 7)]
    falling = [(s, -0.1 * s, 3.0) for s in (1, 2, 3, 4)]
    assert eval_warnings(evals, falling, SignalThresholds()) == []  # both fall: no divergence
    # a flat, noisy train reward that happens to end a little higher is no rise (the demo's first
    # 20 steps once warned so): divergence needs training to improve beyond its noise
    noisy = [
        (s, r, 3.0)
        for s, r in zip(
            range(11, 21), (0.28, 0.25, 0.22, 0.33, 0.22, 0.3, 0.24, 0.27, 0.31, 0.29), strict=True
        )
    ]
    assert not rises(noisy) and eval_warnings(evals, noisy, SignalThresholds()) == []
    assert rises([(s, 0.02 * s + (0.01 if s % 2 else -0.01), 3.0) for s in range(11, 21)])
    dip = [point(0, 10), point(2, 5), point(4, 6)]  # fell, then rose again: an early dip
    assert eval_warnings(dip, rising, SignalThresholds()) == []
    assert [w.key for w in eval_warnings(dip[:2], rising, SignalThresholds(eval_falls=1))] == [
        "eval_divergence"
    ]
    assert eval_warnings(evals[1:], rising, SignalThresholds()) == []  # two evaluations: one fall
    assert eval_warnings([point(0, 10), point(2, 10), point(4, 9)], rising, SignalThresholds()) == []
    # a 1-of-3 wobble is within twice the standard error: no warning at any eval_drop
    few = [eval_point(s, [greedy(s, i, float(i < 3 - s)) for i in range(3)], 1.0) for s in (0, 1)]
    assert eval_warnings(few, rising, SignalThresholds(eval_falls=1)) == []
    longer = [point(0, 10), point(2, 8), point(4, 5, tokens=6)]
    assert [w.key for w in eval_warnings(longer, falling, SignalThresholds())] == ["length_hacking"]


@pytest.mark.slow
def test_a_job_whose_eval_falls_while_training_rises_warns_with_the_rows_it_lost(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    root = tmp_path / "diverging"
    job_file = make_job(
        root,
        rollout=ROLLOUT,  # samples as the sample says (greedily for eval pass@1)
        grader=GRADER,
        hyper={"steps": 4, "eval_every_n_steps": 2, "batch_size": 2, "group_size": 2},
        extra={
            "data": {"train": "data/train.jsonl", "validation": "data/val.jsonl"},
            "eval": {"k": 1, "samples": 0},
        },
    )
    (root / "data" / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    ran = CliRunner().invoke(app, ["run", str(job_file)])
    assert ran.exit_code == 0, ran.output
    [job] = store.list_jobs()
    said = (
        "warning: eval at step 4: greedy pass@1 on the held-out rows fell from 1 to 0.5 to 0 (steps 0, 2, 4"
    )
    assert said in ran.output
    doc = job_document(store, job.id)
    [warning] = [w for w in doc["warnings"] if w.startswith("eval at step ")]
    assert "while the train reward rose" in warning
    examples = warning_examples(warning)
    assert len(examples) == 3 and all(store.get_trajectory(job.id, t) is not None for t in examples)
    shown = CliRunner().invoke(app, ["jobs", "show", str(job.id)])
    assert shown.exit_code == 0 and "greedy pass@1 on the held-out rows fell" in shown.output
