"""failure_policy.group on plugtune's trainer: a failed trajectory leaves its group or drops it, and
a group with too few scored trajectories is dropped, each dropped trajectory saying why (tiny real
model, in-process plugins)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plugtune.trainer.config import TrainerConfig
from plugtune.trainer.draft import GroupRule
from plugtune.trainer.groups import Plugins
from plugtune.trainer.grpo import GRPOTrainer
from plugtune.trainer.model import load_model
from plugtune.trainer.testing import InProcessFunction, InProcessPolicyServer
from tests.trainer import plugins as p


def make(path: Path, rollout: Any, rule: GroupRule, unscorable_below: int = 0) -> GRPOTrainer:
    rows = [
        {
            "messages": [{"role": "user", "content": f"{i}+{i}=?"}],
            "extra": {"unscorable_below": unscorable_below},
        }
        for i in range(2)
    ]
    lm = load_model(path)
    config = TrainerConfig(steps=1, batch_size=2, group_size=3, max_new_tokens=6)
    plugins = Plugins(rollout=InProcessFunction(rollout), graders=[InProcessFunction(p.by_index)])
    server = InProcessPolicyServer(lm.model, lm.tokenizer, seed=3)
    return GRPOTrainer(lm.model, lm.tokenizer, server, plugins, rows, config, group_rule=rule)


async def test_by_default_a_failed_trajectory_leaves_its_group_and_the_rest_train(
    tiny_model_path: Path,
) -> None:
    result = await make(tiny_model_path, p.fail_first, GroupRule()).step()
    assert sorted(r.status for r in result.records) == ["failed"] * 2 + ["success"] * 4
    assert all(r.advantage is not None for r in result.records if r.status == "success")
    assert result.metrics["groups/dropped_by_rule"] == 0 and result.metrics["trajectories/trained"] == 4


async def test_drop_group_drops_every_group_with_a_failed_trajectory(tiny_model_path: Path) -> None:
    result = await make(tiny_model_path, p.fail_first, GroupRule(drop="group")).step()
    for r in result.records:
        assert r.advantage is None and r.reward is None
        if r.rollout_index == 0:  # the failed one stays failed, with its error
            assert r.status == "failed" and r.errors[0].cause == "500"
        else:
            assert r.status == "discard" and r.discard_reason == (
                "its group was dropped by failure_policy.group: 1 of its 3 trajectories failed (drop: group)"
            )
    m = result.metrics
    assert m["groups/dropped_by_rule"] == 2 and m["trajectories/trained"] == 0 and "loss" not in m


async def test_a_group_with_fewer_than_min_scored_scored_trajectories_is_dropped(
    tiny_model_path: Path,
) -> None:
    kept = await make(tiny_model_path, p.answer, GroupRule(min_scored=2), unscorable_below=1).step()
    assert kept.metrics["groups/dropped_by_rule"] == 0
    assert {r.status for r in kept.records} == {"success"}
    dropped = await make(tiny_model_path, p.answer, GroupRule(min_scored=3), unscorable_below=1).step()
    assert dropped.metrics["groups/dropped_by_rule"] == 2
    assert {r.status for r in dropped.records} == {"discard"}  # the unscorable one too: it succeeded
    why = "2 of its 3 trajectories scored, fewer than min_scored 3"
    assert {r.discard_reason for r in dropped.records} == {
        f"its group was dropped by failure_policy.group: {why}"
    }
