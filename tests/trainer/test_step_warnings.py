"""A step that trained on something else than the user thinks says so: off-policy samples, dropped tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from plugtune import Context, Policy, Sample, rollout
from plugtune.demo.plugins import grader as demo_grader
from plugtune.gateway import JobSampling, PolicyGateway
from plugtune.trainer.config import TrainerConfig
from plugtune.trainer.groups import Plugins
from plugtune.trainer.grpo import GRPOTrainer, StepResult
from plugtune.trainer.health import FULL_PRECISION_NOISE, logprob_noise, step_warnings
from plugtune.trainer.model import load_model
from plugtune.trainer.testing import InProcessFunction

DEMO = Path(__file__).resolve().parents[2] / "plugtune" / "demo"


@rollout
async def at_temperature_0_7(ctx: Context, policy: Policy, sample: Sample) -> None:
    await policy.achat(sample.messages, temperature=0.7, max_tokens=sample.sampling.max_tokens)


@rollout
async def rewrites_its_answer(ctx: Context, policy: Policy, sample: Sample) -> None:
    first = await policy.achat(sample.messages)
    edited = {"role": "assistant", "content": f"I think {Policy.content(first)}"}
    await policy.achat([*sample.messages, edited, {"role": "user", "content": "Sure?"}])


@rollout
async def follows_up(ctx: Context, policy: Policy, sample: Sample) -> None:
    first = await policy.achat(sample.messages)
    said = {"role": "assistant", "content": Policy.content(first)}
    await policy.achat([*sample.messages, said, {"role": "user", "content": "Sure?"}])


async def one_step(fn: Any, config: TrainerConfig, sampling: JobSampling | None) -> StepResult:
    lm = load_model(DEMO / "model")
    rows = [json.loads(line) for line in (DEMO / "data" / "train.jsonl").read_text().splitlines()[:8]]
    plugins = Plugins(rollout=InProcessFunction(fn), graders=[InProcessFunction(demo_grader.exact_match)])
    with PolicyGateway(lm.model, lm.tokenizer, sampling=sampling) as gateway:
        return await GRPOTrainer(lm.model, lm.tokenizer, gateway, plugins, rows, config).step()


CONFIG = TrainerConfig(steps=1, batch_size=2, group_size=2, max_new_tokens=6, learning_rate=1e-5)
JOB = JobSampling(CONFIG.temperature, CONFIG.top_p, CONFIG.max_new_tokens)


async def test_samples_from_another_temperature_raise_the_logprob_gap_warning() -> None:
    # a gateway without the job's settings lets the rollout sample at 0.7; the trainer scores at 1.0
    result = await one_step(at_temperature_0_7, CONFIG, sampling=None)
    assert result.metrics["logprob_gap"] > FULL_PRECISION_NOISE
    [warning] = [w for w in result.warnings if w.key == "logprob_gap"]
    assert "off-policy" in warning.message and "step 1" in warning.message


async def test_a_top_p_below_one_is_named_as_the_cause_of_the_gap() -> None:
    config = TrainerConfig(steps=1, batch_size=2, group_size=2, max_new_tokens=6, top_p=0.5)
    result = await one_step(follows_up, config, JobSampling(1.0, 0.5, 6))
    [warning] = [w for w in result.warnings if w.key == "logprob_gap"]
    assert "hyperparameters.top_p is 0.5" in warning.message


async def test_an_on_policy_step_has_no_warning() -> None:
    result = await one_step(follows_up, CONFIG, JOB)
    assert result.metrics["logprob_gap"] < FULL_PRECISION_NOISE
    assert result.metrics["history/rewrites"] == 0
    # (its two groups may well each get one reward: that is the no_gradient warning's business)
    assert [w for w in result.warnings if w.key in ("logprob_gap", "history_rewrites")] == []
    assert all(r.metrics["history/rewrites"] == 0 for r in result.records)


async def test_a_rewritten_history_counts_the_dropped_policy_tokens() -> None:
    result = await one_step(rewrites_its_answer, CONFIG, JOB)
    for record in result.records:
        assert record.status == "success", record.errors
        assert record.metrics["history/rewrites"] == 1
        assert record.metrics["history/dropped_policy_tokens"] >= 1
    dropped = sum(r.metrics["history/dropped_policy_tokens"] for r in result.records)
    assert result.metrics["history/rewrites"] == len(result.records)
    assert result.metrics["tokens/dropped_policy"] == dropped
    [warning] = [w for w in result.warnings if w.key == "history_rewrites"]
    assert f"{dropped:.0f} recorded policy tokens were dropped" in warning.message


def test_the_noise_allowance_follows_the_weights_precision() -> None:
    assert logprob_noise(torch.float32) == FULL_PRECISION_NOISE < logprob_noise(torch.bfloat16)
    assert step_warnings(3, {"logprob_gap": 5e-4}, 1e-3, 1.0) == []
    assert [w.key for w in step_warnings(3, {"logprob_gap": 0.05}, 1e-3, 1.0)] == ["logprob_gap"]
    assert step_warnings(3, {}, 1e-3, 1.0) == []  # a step with nothing to train


pytestmark = pytest.mark.skipif(
    not (DEMO / "model" / "config.json").is_file(), reason="the demo model is not built"
)
