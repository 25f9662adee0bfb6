"""Eval pass@1 falling while the train reward does not is warned about (issue 27 item 1, eval vs
train divergence): a real job whose grader passes every held-out reply before training and none
after, while its train reward rises, says so with the held-out rows it lost, wherever the job is
shown; the rule itself on evaluation records."""

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
from plugtune.trainer.health import SignalThresholds, eval_point, eval_warnings, warning_examples
from tests.jobs.jobkit import ROWS, make_job
from tests.jobs.test_eval_job import ROLLOUT
from tests.trainer.test_signal_warnings import record

# Held-out replies pass before training (step 0) and fail after; the train reward rises each step.
GRADER = """
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    if ctx.phase == "eval":
        return 1.0 if ctx.step == 0 else 0.0
    return ctx.step / 10 + (0.1 if trajectory.trajectory_id.endswith("r0") else 0.0)
"""


def greedy(step: int, row: int, reward: float, tokens: int = 3) -> object:
    r = record(f"eval-greedy-s{step}-p{row}", 0, None, tokens=tokens)
    return replace(r, reward=reward, sample_index=row, phase="eval")


def test_pass_at_1_falling_beyond_noise_while_the_train_reward_rises_warns() -> None:
    before = eval_point(0, [greedy(0, i, 1.0) for i in range(10)], 1.0)
    now = eval_point(4, [greedy(4, i, 1.0 if i < 5 else 0.0) for i in range(10)], 1.0)
    assert (before.pass_at_1, now.pass_at_1) == (1.0, 0.5)
    rising = [(s, 0.1 * s, 3.0) for s in (1, 2, 3, 4)]
    [warning] = eval_warnings(before, now, rising, SignalThresholds())
    assert warning.key == "eval_divergence"
    assert warning.message.startswith("eval at step 4: greedy pass@1 on the held-out rows fell from 1 to 0.5")
    assert warning_examples(warning.message) == [
        "eval-greedy-s4-p5-r0",
        "eval-greedy-s4-p6-r0",
        "eval-greedy-s4-p7-r0",
    ]
    falling = [(s, -0.1 * s, 3.0) for s in (1, 2, 3, 4)]
    assert eval_warnings(before, now, falling, SignalThresholds()) == []  # both fall: no divergence
    small = eval_point(4, [greedy(4, i, 1.0 if i < 9 else 0.0) for i in range(10)], 1.0)
    assert eval_warnings(before, small, rising, SignalThresholds(eval_drop=0.2)) == []
    # a 1-of-3 wobble is within twice the standard error: no warning at any eval_drop
    few = eval_point(0, [greedy(0, i, float(i < 2)) for i in range(3)], 1.0)
    fewer = eval_point(2, [greedy(2, i, float(i < 1)) for i in range(3)], 1.0)
    assert eval_warnings(few, fewer, rising, SignalThresholds()) == []
    longer = eval_point(4, [greedy(4, i, float(i < 5), tokens=6) for i in range(10)], 1.0)
    assert [w.key for w in eval_warnings(before, longer, falling, SignalThresholds())] == ["length_hacking"]


@pytest.mark.slow
def test_a_job_whose_eval_falls_while_training_rises_warns_with_the_rows_it_lost(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    root = tmp_path / "diverging"
    job_file = make_job(
        root,
        rollout=ROLLOUT,  # samples as the sample says (greedily for eval pass@1)
        grader=GRADER,
        hyper={"steps": 2, "eval_every_n_steps": 2, "batch_size": 2, "group_size": 2},
        extra={
            "data": {"train": "data/train.jsonl", "validation": "data/val.jsonl"},
            "eval": {"k": 1, "samples": 0},
        },
    )
    (root / "data" / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    ran = CliRunner().invoke(app, ["run", str(job_file)])
    assert ran.exit_code == 0, ran.output
    [job] = store.list_jobs()
    assert "warning: eval at step 2: greedy pass@1 on the held-out rows fell from 1 to 0" in ran.output
    doc = job_document(store, job.id)
    [warning] = [w for w in doc["warnings"] if w.startswith("eval at step 2")]
    assert "while the train reward did not fall" in warning
    examples = warning_examples(warning)
    assert len(examples) == 3 and all(store.get_trajectory(job.id, t) is not None for t in examples)
    shown = CliRunner().invoke(app, ["jobs", "show", str(job.id)])
    assert shown.exit_code == 0 and "greedy pass@1 on the held-out rows fell" in shown.output
