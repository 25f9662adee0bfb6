"""The reward-signal health checks of issue 27 item 1 on the native trainer: each is a per-step
metric and a warning naming example trajectories, fired by a real step built to trigger it; the
demo job's first steps raise none of them (no false alarms)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from plugtune import Policy, grader, rollout
from plugtune.demo.plugins import grader as demo_grader
from plugtune.demo.plugins import rollout as demo_rollout
from plugtune.gateway import JobSampling, PolicyGateway
from plugtune.jobs.demo import demo_job_file
from plugtune.jobs.evaluate import build_evaluator
from plugtune.sdk import Context, Sample, Trajectory
from plugtune.spec.validation import validate_job
from plugtune.trainer.config import TrainerConfig
from plugtune.trainer.groups import Plugins
from plugtune.trainer.grpo import GRPOTrainer, StepResult
from plugtune.trainer.health import (
    EvalPoint,
    GraderScores,
    SignalMonitor,
    SignalThresholds,
    StepSignal,
    dominance_warnings,
    eval_point,
    eval_warnings,
    length_warnings,
    rises,
    saturation_warnings,
    step_signal,
    unscorable_warnings,
    warning_examples,
)
from plugtune.trainer.model import load_model
from plugtune.trainer.protocols import call_once
from plugtune.trainer.testing import InProcessFunction, InProcessPolicyServer
from plugtune.types import TrajectoryRecord
from tests.trainer import plugins as p
from tests.trainer.test_grpo import ROWS, make_trainer

DEMO = Path(__file__).resolve().parents[2] / "plugtune" / "demo"
#: The keys of the checks this file covers (the demo must raise none of them).
NEW_KEYS = {"unscorable", "saturated", "dominant_component", "length_hacking", "eval_divergence"}


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


def at(step: int, ceiling: float | None, floor: float | None = 0.0) -> StepSignal:
    ids = (f"s{step}-b0-p0-r0",)
    return StepSignal(
        step,
        1,
        0,
        0,
        4,
        0,
        bounds=(0.0, 1.0),
        at_floor=floor,
        at_ceiling=ceiling,
        ceiling_examples=ids,
        floor_examples=ids,
    )


def test_a_reward_at_its_ceiling_for_n_steps_in_a_row_warns() -> None:
    thresholds = SignalThresholds(saturation_steps=3)
    [warning] = saturation_warnings([at(s, 1.0) for s in (1, 2, 3)], thresholds)
    assert warning.key == "saturated"
    said = "the reward sat at its ceiling (1, the highest reward this run scored) for 3 steps in a row"
    assert warning.message.startswith(f"steps 1-3: {said}")
    assert "reward/at_ceiling_share" in warning.message
    assert warning_examples(warning.message) == ["s1-b0-p0-r0", "s2-b0-p0-r0", "s3-b0-p0-r0"]
    assert saturation_warnings([at(s, 1.0) for s in (1, 2)], thresholds) == []  # not yet 3 steps
    assert saturation_warnings([at(1, 1.0), at(2, 0.9), at(3, 1.0)], thresholds) == []  # not in a row
    assert saturation_warnings([at(s, None, None) for s in (1, 2, 3)], thresholds) == []  # no bounds


def test_a_step_measures_its_rewards_against_the_floor_and_ceiling() -> None:
    from tests.trainer.test_signal_warnings import record

    records = [replace(record("s1-b0-p0", i, 0.0), reward=r) for i, r in enumerate([0.0, 0.0, 1.0, 0.5])]
    signal = step_signal(1, records, (0.0, 1.0))
    assert (signal.at_floor, signal.at_ceiling) == (0.5, 0.25)
    assert signal.floor_examples == ("s1-b0-p0-r0", "s1-b0-p0-r1")
    assert step_signal(1, records).at_floor is None  # no bounds known: not measured
    assert SignalThresholds().reward_bounds(0.0, 0.0) is None  # one value seen is no range
    assert SignalThresholds(reward_ceiling=2.0).reward_bounds(0.0, 1.0) == (0.0, 2.0)


@grader
def full_marks(ctx: Context, sample: Sample, trajectory: Trajectory) -> float:
    return 1.0


@grader
def first_step_only(ctx: Context, sample: Sample, trajectory: Trajectory) -> float:
    """One reward of 1 at step 1 (which sets the ceiling), 0 ever after."""
    first = "-b0-" in trajectory.trajectory_id and trajectory.trajectory_id.endswith("-r0")
    return 1.0 if ctx.step == 1 and first else 0.0


async def test_a_reward_at_its_configured_ceiling_warns_after_saturation_steps(tiny_model_path: Path) -> None:
    trainer = make_trainer(tiny_model_path, graders=[full_marks], steps=3, max_new_tokens=4)
    trainer.monitor = SignalMonitor(
        SignalThresholds(saturation_steps=2, reward_floor=0.0, reward_ceiling=1.0), 3
    )
    results = [await trainer.step() for _ in range(3)]
    assert all(r.metrics["reward/at_ceiling_share"] == 1.0 for r in results)
    assert [w.key for w in results[0].warnings if w.key == "saturated"] == []
    [warning] = [w for w in results[1].warnings if w.key == "saturated"]
    assert warning.message.startswith("steps 1-2: the reward sat at its ceiling (1, signal.reward_ceiling)")
    ids = {r.trajectory_id for res in results for r in res.records}
    assert set(warning_examples(warning.message)) <= ids


async def test_a_reward_stuck_at_the_lowest_seen_warns_at_its_floor(tiny_model_path: Path) -> None:
    trainer = make_trainer(tiny_model_path, graders=[first_step_only], steps=3, max_new_tokens=4)
    trainer.monitor = SignalMonitor(SignalThresholds(saturation_steps=2), 3)
    results = [await trainer.step() for _ in range(3)]
    assert results[0].metrics["reward/at_floor_share"] == 7 / 8  # the ceiling (1) was scored once
    assert results[1].metrics["reward/at_floor_share"] == 1.0
    assert [w for r in results[:2] for w in r.warnings if w.key == "saturated"] == []
    [warning] = [w for w in results[2].warnings if w.key == "saturated"]
    assert "steps 2-3: the reward sat at its floor (0, the lowest reward this run scored)" in warning.message
    assert warning_examples(warning.message)[0].startswith("s2-")


def test_the_reward_variance_splits_among_the_weighted_graders() -> None:
    from tests.trainer.test_signal_warnings import record

    def scored(r: int, correct: float, style: float | None) -> TrajectoryRecord:
        components = {"correct": correct, "style": style}
        reward = 2.0 * correct + (style or 0.0)
        return replace(record("s1-b0-p0", r, 0.0), reward=reward, reward_components=components)

    # correct varies (weight 2), style is constant or unscorable: correct carries all the variance
    records = [scored(0, 1.0, 0.5), scored(1, 0.0, 0.5), scored(2, 1.0, None), scored(3, 0.0, 0.5)]
    signal = step_signal(1, records, weights={"correct": 2.0})
    shares = signal.variance_shares()
    assert abs(sum(shares.values()) - 1.0) < 1e-9  # the weighted components add up to the reward
    assert shares["correct"] > 0.9 and signal.varied_examples[0] == ("correct", ("s1-b0-p0-r0",))
    [warning] = dominance_warnings([signal], SignalThresholds())
    assert warning.key == "dominant_component"
    assert warning.message.startswith(f"step 1: grader correct carries {shares['correct']:.0%} of the final")
    assert "the other graders (style)" in warning.message
    assert warning_examples(warning.message) == ["s1-b0-p0-r0"]
    # both varying alike: half each, no warning; one grader alone: nothing to compare
    even = [scored(r, float(r % 2), float(r % 2) * 2.0) for r in range(4)]
    weights = {"correct": 2.0}
    assert step_signal(1, even, weights=weights).variance_shares() == {"correct": 0.5, "style": 0.5}
    assert dominance_warnings([step_signal(1, even, weights=weights)], SignalThresholds()) == []
    alone = [replace(r, reward_components={"correct": r.reward_components["correct"]}) for r in even]
    assert step_signal(1, alone).variance_shares() == {}
    assert dominance_warnings([step_signal(1, alone)], SignalThresholds()) == []


@grader
def steady(ctx: Context, sample: Sample, trajectory: Trajectory) -> float:
    return 0.5


@grader
def first_wins(ctx: Context, sample: Sample, trajectory: Trajectory) -> float:
    return 1.0 if trajectory.trajectory_id.endswith("-r0") else 0.0


async def test_a_grader_that_never_varies_leaves_the_other_dominant(tiny_model_path: Path) -> None:
    trainer = make_trainer(tiny_model_path, graders=[first_wins, steady], steps=1, max_new_tokens=4)
    result = await trainer.step()
    assert result.metrics["reward/steady/variance_share"] == 0.0
    assert result.metrics["reward/first_wins/variance_share"] == pytest.approx(1.0)
    [warning] = [w for w in result.warnings if w.key == "dominant_component"]
    assert "grader first_wins carries 100% of the final reward's variance" in warning.message
    assert set(warning_examples(warning.message)) <= {r.trajectory_id for r in result.records}


def sized(step: int, length: float, reward: float) -> StepSignal:
    ids = (f"s{step}-b0-p0-r0",)
    return StepSignal(
        step, 1, 0, 0, 4, 0, length=length, reward=reward, reward_low=0.0, reward_high=1.0, long_examples=ids
    )


def test_replies_growing_while_the_reward_falls_warn_of_length_hacking() -> None:
    window = [sized(1, 10, 0.6), sized(2, 10, 0.6), sized(3, 14, 0.4), sized(4, 14, 0.4)]
    [warning] = length_warnings(window, SignalThresholds())
    assert warning.key == "length_hacking"
    assert warning.message.startswith("steps 1-4: the replies grew 40% longer (mean 10 to 14 tokens")
    assert "the mean reward fell from 0.6 to 0.4 (20% of its range 0 to 1" in warning.message
    assert warning_examples(warning.message) == ["s4-b0-p0-r0", "s3-b0-p0-r0"]  # the latest first
    rising = [sized(1, 10, 0.4), sized(2, 10, 0.4), sized(3, 14, 0.6), sized(4, 14, 0.6)]
    assert length_warnings(rising, SignalThresholds()) == []  # longer and better: fine
    slight = [sized(1, 10, 0.6), sized(2, 10, 0.6), sized(3, 11, 0.4), sized(4, 11, 0.4)]
    assert length_warnings(slight, SignalThresholds()) == []  # 10% longer: below length_rise
    assert length_warnings(window[:3], SignalThresholds()) == []  # too few steps to compare halves
    assert length_warnings(window, SignalThresholds(reward_drop=0.3)) == []


@rollout
def longer_each_step(ctx: Context, policy: Policy, sample: Sample) -> None:
    policy.chat(sample.messages, temperature=1.0, max_tokens=2 if ctx.step <= 2 else 12)


@grader
def prefers_short(ctx: Context, sample: Sample, trajectory: Trajectory) -> float:
    return 1.0 / (1 + len(trajectory.completion))


async def test_a_run_whose_replies_lengthen_while_its_reward_falls_warns(tiny_model_path: Path) -> None:
    lm = load_model(tiny_model_path)
    plugins = Plugins(rollout=InProcessFunction(longer_each_step), graders=[InProcessFunction(prefers_short)])
    server = InProcessPolicyServer(lm.model, lm.tokenizer, seed=7)
    config = TrainerConfig(steps=4, batch_size=2, group_size=4, max_new_tokens=12, learning_rate=1e-5)
    trainer = GRPOTrainer(lm.model, lm.tokenizer, server, plugins, ROWS, config)
    results = [await trainer.step() for _ in range(4)]
    assert results[3].metrics["response_length"] > 1.2 * results[0].metrics["response_length"]
    [warning] = [w for w in results[3].warnings if w.key == "length_hacking"]
    assert warning.message.startswith("steps 1-4: the replies grew")
    later = {r.trajectory_id for res in results[2:] for r in res.records}
    assert warning_examples(warning.message) and set(warning_examples(warning.message)) <= later


async def demo_steps(
    steps: int, every: int, grade: Any = demo_grader.exact_match
) -> tuple[list[StepResult], list[EvalPoint]]:
    """The demo job (plugtune/demo/job.yaml: its settings, plugins, signal thresholds and held-out
    rows) for ``steps`` steps, evaluated greedily before them and every ``every`` steps, as its job
    does (every 30); ``grade`` is its grader (the demo's exact match unless given)."""
    job = validate_job(demo_job_file())
    spec = job.spec
    config = spec.hyperparameters.model_copy(update={"steps": steps})
    lm = load_model(DEMO / "model")
    rows: list[dict[str, Any]] = [
        json.loads(line) for line in (DEMO / "data" / "train.jsonl").read_text().splitlines()
    ]
    plugins = Plugins(
        rollout=InProcessFunction(demo_rollout.answer), graders=[InProcessFunction(grade)]
    )
    sampling = JobSampling(config.temperature, config.top_p, config.max_new_tokens)
    with PolicyGateway(lm.model, lm.tokenizer, sampling=sampling) as gateway:
        trainer = GRPOTrainer(
            lm.model, lm.tokenizer, gateway, plugins, rows, config, signal=spec.signal.thresholds()
        )
        evaluator = build_evaluator(job, gateway, plugins, call_once, "")
        threshold = spec.eval.pass_threshold
        evals = [eval_point(0, (await evaluator.run(0, 0)).records, threshold)]
        results = []
        for _ in range(steps):
            results.append(await trainer.step())
            if trainer.step_count % every == 0:
                evals.append(
                    eval_point(
                        trainer.step_count,
                        (await evaluator.run(*[trainer.step_count] * 2)).records,
                        threshold,
                    )
                )
        return results, evals


async def test_the_demo_job_raises_no_step_warning_and_an_eval_warning_only_on_a_real_fall() -> None:
    """The demo job as it runs (60 steps, greedy evaluations at 0, 30 and 60): no per-step check
    fires. In about 1 run in 5 its greedy pass@1 on the 250 held-out rows really falls at both
    evaluations, by more than twice its noise, while its sampled reward rises: eval_divergence then
    says so, and nothing else may make it fire."""
    results, evals = await demo_steps(60, every=30)  # the demo job's own steps and evaluations
    keys = {w.key for r in results for w in r.warnings}
    assert not keys & (NEW_KEYS | {"no_gradient", "truncated"}), [w for r in results for w in r.warnings]
    assert all(r.metrics["grader/exact_match/unscorable_share"] == 0.0 for r in results)
    assert max(r.metrics["reward/at_floor_share"] for r in results[1:]) < 0.95  # it learns from step 1
    train = [(r.step, r.metrics["reward/mean"], r.metrics["response_length"]) for r in results]
    assert [(e.step, e.rows) for e in evals] == [(0, 250), (30, 250), (60, 250)]
    thresholds = validate_job(demo_job_file()).spec.signal.thresholds()
    said = [w for i in range(len(evals)) for w in eval_warnings(evals[: i + 1], train, thresholds)]
    passes = [e.pass_at_1 for e in evals]
    for warning in said:  # only a true divergence: two falls, beyond the noise, training improving
        assert warning.key == "eval_divergence", (warning, passes)
        p0, p1 = passes[0], passes[-1]
        noise = 2 * math.sqrt(p0 * (1 - p0) / 250 + p1 * (1 - p1) / 250)
        assert passes[0] > passes[1] > passes[2] and p0 - p1 > max(noise, thresholds.eval_drop), passes
        assert rises([t for t in train if t[0] > evals[0].step]), train  # the rule's window: since the first


async def test_a_healthy_job_with_a_real_grader_raises_no_warning() -> None:
    """The demo's task graded by math-verify (a real-world grader, the one TRL's and open-r1's accuracy
    rewards use; installed by `make test`) instead of the demo's exact match: 30 steps raise no step
    warning (no false alarms on a real grader's rewards)."""
    from tests.fixtures.plugins.math_verify_grader import verified

    results, evals = await demo_steps(30, every=30, grade=verified)
    warned = [w for r in results for w in r.warnings]
    assert not {w.key for w in warned} & (NEW_KEYS | {"no_gradient", "truncated"}), warned
    assert all(r.metrics["grader/verified/unscorable_share"] == 0.0 for r in results)
    rewards = [r.metrics["reward/mean"] for r in results]
    assert 0.1 < sum(rewards) / len(rewards) < 0.9, rewards  # a signal to learn from, not a flat one
    # two evaluations cannot show the eval rule's falls (eval_falls: 2 needs three): the demo job's
    # own test above holds the eval-vs-train rule free of false alarms
    assert [e.step for e in evals] == [0, 30]


pytestmark = pytest.mark.skipif(
    not (DEMO / "model" / "config.json").is_file(), reason="the demo model is not built"
)
