"""The trainer through the real policy gateway (HTTP) and the demo model and plugins."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from plugtune.demo.plugins import grader as demo_grader
from plugtune.demo.plugins import rollout as demo_rollout
from plugtune.gateway.gateway import PolicyGateway
from plugtune.trainer.config import TrainerConfig
from plugtune.trainer.groups import Plugins
from plugtune.trainer.grpo import GRPOTrainer
from plugtune.trainer.model import load_model
from plugtune.trainer.testing import InProcessFunction

DEMO = Path(__file__).resolve().parents[2] / "plugtune" / "demo"


@pytest.mark.skipif(not (DEMO / "model" / "config.json").is_file(), reason="the demo model is not built")
async def test_grpo_step_through_the_gateway_with_the_demo_model() -> None:
    lm = load_model(DEMO / "model")
    rows = [json.loads(line) for line in (DEMO / "data" / "train.jsonl").read_text().splitlines()[:16]]
    config = TrainerConfig(steps=2, batch_size=2, group_size=4, max_new_tokens=8, learning_rate=1e-3)
    plugins = Plugins(
        rollout=InProcessFunction(demo_rollout.answer), graders=[InProcessFunction(demo_grader.exact_match)]
    )
    before = {k: v.detach().clone() for k, v in lm.model.state_dict().items()}
    with PolicyGateway(lm.model, lm.tokenizer) as gateway:
        trainer = GRPOTrainer(lm.model, lm.tokenizer, gateway, plugins, rows, config)
        first = await trainer.step()
        second = await trainer.step()
        assert gateway.policy_version == 2
    for result in (first, second):
        assert result.metrics["trajectories/failed"] == 0, [r.errors for r in result.records]
        assert result.metrics["tokens/policy"] > 0
        # the gateway's recorded sampling log-probs match the trainer's recomputation
        if "logprob_gap" in result.metrics:
            assert result.metrics["logprob_gap"] < 1e-3
    assert {r.policy_version for r in second.records} == {1}
    rec = first.records[0]
    assert rec.messages[-1]["role"] == "assistant" and rec.reward_components.keys() == {"exact_match"}
    assert len(rec.response_ids) == len(rec.response_mask) == len(rec.response_logprobs)
    after = lm.model.state_dict()
    changed = any(not torch.equal(before[k], after[k]) for k in before)
    # parameters move exactly when some group preferred one answer over another
    preferred = any(r.advantage for res in (first, second) for r in res.records)
    assert changed == preferred


@pytest.mark.skipif(not (DEMO / "model" / "config.json").is_file(), reason="the demo model is not built")
async def test_grpo_step_through_the_function_runtime_and_the_gateway(tmp_path: Path) -> None:
    """The whole path of a job: plugins in runtime processes, the policy over HTTP, one GRPO step."""
    from plugtune.runtime import LocalRuntime

    lm = load_model(DEMO / "model")
    rows = [json.loads(line) for line in (DEMO / "data" / "train.jsonl").read_text().splitlines()[:8]]
    config = TrainerConfig(steps=1, batch_size=2, group_size=4, max_new_tokens=8, learning_rate=1e-3)
    async with LocalRuntime(state_dir=tmp_path) as rt:
        plugins = Plugins(
            rollout=await rt.deploy(f"{DEMO / 'plugins' / 'rollout.py'}:answer"),
            graders=[await rt.deploy(f"{DEMO / 'plugins' / 'grader.py'}:exact_match")],
        )
        with PolicyGateway(lm.model, lm.tokenizer) as gateway:
            trainer = GRPOTrainer(lm.model, lm.tokenizer, gateway, plugins, rows, config, job_id="job-e2e")
            result = await trainer.step()
    assert result.metrics["trajectories/failed"] == 0, [r.errors for r in result.records]
    assert result.metrics["trajectories/total"] == 8 and result.metrics["tokens/policy"] > 0
    for rec in result.records:
        assert rec.reward in (0.0, 1.0) and rec.messages[-1]["role"] == "assistant"
        assert rec.metrics.get("completion_tokens") == sum(rec.response_mask)


@pytest.mark.skipif(not (DEMO / "model" / "config.json").is_file(), reason="the demo model is not built")
async def test_overlapped_rollouts_through_the_runtime_sample_the_updated_weights(tmp_path: Path) -> None:
    """With overlap_rollouts, step 2's plugins run during step 1's training, but every token of
    step 2 comes from the weights after step 1 (the gateway records version 1 on its segments)."""
    from plugtune.runtime import LocalRuntime

    lm = load_model(DEMO / "model")
    rows = [json.loads(line) for line in (DEMO / "data" / "train.jsonl").read_text().splitlines()[:8]]
    config = TrainerConfig(
        steps=3, batch_size=2, group_size=4, max_new_tokens=8, learning_rate=1e-3, overlap_rollouts=True
    )
    async with LocalRuntime(state_dir=tmp_path) as rt:
        plugins = Plugins(
            rollout=await rt.deploy(f"{DEMO / 'plugins' / 'rollout.py'}:answer"),
            graders=[await rt.deploy(f"{DEMO / 'plugins' / 'grader.py'}:exact_match")],
        )
        with PolicyGateway(lm.model, lm.tokenizer) as gateway:
            versions: dict[str, set[int]] = {}
            take = gateway.take

            def noting_take(trajectory_id: str) -> Any:
                trace = take(trajectory_id)
                versions[trajectory_id] = {s.policy_version for s in trace.segments if s.source == "policy"}
                return trace

            gateway.take = noting_take  # type: ignore[method-assign]
            trainer = GRPOTrainer(lm.model, lm.tokenizer, gateway, plugins, rows, config)
            results = [r async for r in trainer.train()]
    assert [r.step for r in results] == [1, 2, 3] and trainer._next is None
    for result in results:
        assert result.metrics["trajectories/failed"] == 0, [r.errors for r in result.records]
        sampled = set().union(*(versions[r.trajectory_id] for r in result.records))
        assert sampled == {result.step - 1}, (result.step, sampled)
    assert results[1].metrics["time/overlapped_s"] > 0
