"""The reward-signal health checks of issue 27 item 1 on the native trainer: each is a per-step
metric and a warning naming example trajectories, fired by a real step built to trigger it; the
demo job's first steps raise none of them (no false alarms)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from plugtune import grader
from plugtune.demo.plugins import grader as demo_grader
from plugtune.demo.plugins import rollout as demo_rollout
from plugtune.gateway import JobSampling, PolicyGateway
from plugtune.jobs.validation import load_spec
from plugtune.sdk import Context, Sample, Trajectory
from plugtune.trainer.groups import Plugins
from plugtune.trainer.grpo import GRPOTrainer, StepResult
from plugtune.trainer.health import (
    GraderScores,
    SignalThresholds,
    StepSignal,
    unscorable_warnings,
    warning_examples,
)
from plugtune.trainer.model import load_model
from plugtune.trainer.testing import InProcessFunction
from tests.trainer import plugins as p
from tests.trainer.test_grpo import make_trainer

DEMO = Path(__file__).resolve().parents[2] / "plugtune" / "demo"
#: The keys of the checks this file covers (the demo must raise none of them).
NEW_KEYS = {"unscorable"}


def graded(step: int, name: str, total: int, none: int) -> StepSignal:
    ids = tuple(f"s{step}-b0-p0-r{i}" for i in range(none))
    return StepSignal(step, 1, 0, 0, total, 0, graders=(GraderScores(name, total, none, ids[:3]),))


def test_a_grader_mostly_unscorable_warns_naming_it_and_examples() -> None:
    window = [graded(s, "judge", 4, 3) for s in (1, 2)]
    [warning] = unscorable_warnings(window, SignalThresholds())
    assert warning.key == "unscorable"
    assert warning.message.startswith("steps 1-2: grader judge found 6 of 8 trajectories (75%) unscorable")
    assert "grader/judge/unscorable_share" in warning.message
    assert warning_examples(warning.message) == ["s1-b0-p0-r0", "s1-b0-p0-r1", "s1-b0-p0-r2"]
    assert unscorable_warnings([graded(s, "judge", 4, 2) for s in (1, 2)], SignalThresholds()) == []
    # the threshold is job.yaml's signal.unscorable_share
    assert unscorable_warnings([graded(1, "judge", 4, 1)], SignalThresholds(unscorable_share=0.2))


@grader
def picky(ctx: Context, sample: Sample, trajectory: Trajectory) -> float | None:
    """Scores only the first rollout of each group; unscorable for the rest."""
    return 1.0 if trajectory.trajectory_id.endswith("r0") else None


async def test_a_grader_returning_none_for_most_trajectories_is_measured_and_warned(
    tiny_model_path: Path,
) -> None:
    trainer = make_trainer(tiny_model_path, graders=[p.digits, picky], steps=1, max_new_tokens=4)
    result = await trainer.step()
    assert result.metrics["grader/picky/unscorable_share"] == 0.75  # 3 of each group of 4
    [warning] = [w for w in result.warnings if w.key == "unscorable"]
    assert "grader picky found 6 of 8 trajectories (75%) unscorable" in warning.message
    unscorable = {r.trajectory_id for r in result.records if r.reward_components.get("picky", 0) is None}
    assert warning_examples(warning.message) and set(warning_examples(warning.message)) <= unscorable


async def demo_steps(steps: int) -> list[StepResult]:
    """The demo job (plugtune/demo/job.yaml, its settings and signal thresholds) for ``steps`` steps."""
    spec = load_spec(DEMO / "job.yaml")
    config = replace(spec.hyperparameters, steps=steps)
    lm = load_model(DEMO / "model")
    rows: list[dict[str, Any]] = [
        json.loads(line) for line in (DEMO / "data" / "train.jsonl").read_text().splitlines()
    ]
    plugins = Plugins(
        rollout=InProcessFunction(demo_rollout.answer), graders=[InProcessFunction(demo_grader.exact_match)]
    )
    sampling = JobSampling(config.temperature, config.top_p, config.max_new_tokens)
    with PolicyGateway(lm.model, lm.tokenizer, sampling=sampling) as gateway:
        trainer = GRPOTrainer(
            lm.model, lm.tokenizer, gateway, plugins, rows, config, signal=spec.signal.thresholds()
        )
        return [await trainer.step() for _ in range(steps)]


async def test_the_demo_jobs_first_steps_raise_no_signal_warning() -> None:
    results = await demo_steps(20)
    keys = {w.key for r in results for w in r.warnings}
    assert not keys & (NEW_KEYS | {"no_gradient", "truncated"}), [w for r in results for w in r.warnings]
    assert all(r.metrics["grader/exact_match/unscorable_share"] == 0.0 for r in results)


pytestmark = pytest.mark.skipif(
    not (DEMO / "model" / "config.json").is_file(), reason="the demo model is not built"
)
