"""Why a trajectory gave no gradient, and a stopped step keeps every trajectory (tiny real model)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from plugtune.sdk import Kind
from plugtune.trainer.config import TrainerConfig
from plugtune.trainer.groups import STOPPED, Plugins
from plugtune.trainer.grpo import GRPOTrainer
from plugtune.trainer.model import load_model
from plugtune.trainer.testing import InProcessFunction, InProcessPolicyServer
from tests.trainer import plugins as p

ROWS = [{"messages": [{"role": "user", "content": f"{i}+{i}=?"}], "extra": {"mode": "ok"}} for i in range(4)]


def make(
    path: Path, rollout: Any, graders: list[Any], rows: list[dict[str, Any]] = ROWS, **kw: Any
) -> GRPOTrainer:
    lm = load_model(path)
    config = TrainerConfig(**{"steps": 2, "batch_size": 2, "group_size": 3, "max_new_tokens": 6, **kw})
    plugins = Plugins(rollout=InProcessFunction(rollout), graders=[InProcessFunction(g) for g in graders])
    server = InProcessPolicyServer(lm.model, lm.tokenizer, seed=3)
    return GRPOTrainer(lm.model, lm.tokenizer, server, plugins, rows, config)


async def test_every_untrained_trajectory_says_why(tiny_model_path: Path) -> None:
    discarded = await make(tiny_model_path, p.discard_first, [p.digits]).step()
    by_id = {r.trajectory_id: r for r in discarded.records}
    first = (
        by_id["s1-b0-p0-r0"]
        if "s1-b0-p0-r0" in by_id
        else next(r for r in discarded.records if r.rollout_index == 0)
    )
    assert first.status == "discard"
    assert first.discard_reason == "discard_first discarded it (Status.DISCARD): the tool sandbox was down"
    sibling = next(r for r in discarded.records if r.group_id == first.group_id and r.rollout_index == 1)
    assert sibling.status == "discard"
    assert sibling.discard_reason == f"its group was discarded: {first.trajectory_id}: {first.discard_reason}"

    flat = await make(tiny_model_path, p.answer, [p.constant]).step()  # every reward 0.5
    assert {r.advantage for r in flat.records} == {0.0}
    assert all("advantage 0: every scored trajectory of group" in r.discard_reason for r in flat.records)
    assert all("reward 0.5" in r.discard_reason for r in flat.records)

    rows = [
        {"messages": [{"role": "user", "content": m}], "extra": {"mode": m}} for m in ("crash", "unscorable")
    ]
    mixed = await make(tiny_model_path, p.answer, [p.digits], rows=rows).step()
    by_mode = {rows[r.sample_index]["extra"]["mode"]: r for r in mixed.records}
    assert by_mode["crash"].discard_reason == "failed: answer 500 (try 1); left out of training"
    assert by_mode["unscorable"].discard_reason.startswith("unscorable: no grader gave it a reward")


class StopTheJob(Exception):
    """What the jobs layer's caller raises to end the job (JobStop), here without the jobs layer."""


async def test_a_stopped_step_keeps_every_trajectory_finished_or_not(tiny_model_path: Path) -> None:
    trainer = make(tiny_model_path, p.first_ends, [p.constant])
    graded: list[str] = []
    stopper: list[str] = []  # the first rollout 1 to start stops the step

    async def caller(fn: Any, ctx: Any, *args: Any) -> Any:
        if ctx.rollout_index == 1 and not stopper:  # stops the job once both rollouts 0 are graded
            stopper.append(ctx.trajectory_id)
            call = asyncio.ensure_future(fn.invoke(ctx, *args))
            for _ in range(2000):
                if len(graded) == 2:
                    break
                await asyncio.sleep(0.01)
            call.cancel()
            raise StopTheJob("stop")
        outcome = await fn.invoke(ctx, *args)
        if fn.spec.kind is Kind.GRADER:
            graded.append(ctx.trajectory_id)
        return outcome

    trainer.runner.caller = caller
    with pytest.raises(StopTheJob):
        await asyncio.wait_for(trainer.step(), 30)
    stopped = {r.trajectory_id: r for r in trainer.take_stopped()}
    groups = {tid.rsplit("-r", 1)[0] for tid in stopped}
    assert len(groups) == 2 and sorted(stopped) == sorted(f"{g}-r{j}" for g in groups for j in range(3))
    for tid in graded:  # finished: kept as they ended, graded
        assert stopped[tid].status == "success" and stopped[tid].stop_reason != STOPPED
        assert stopped[tid].reward_components == {"constant": 0.5}
        assert len(stopped[tid].response_ids) > 0
    unfinished = [r for tid, r in stopped.items() if tid not in graded]
    assert len(unfinished) == 4
    assert all(r.status == "failed" and r.stop_reason == STOPPED and r.reward is None for r in unfinished)
    assert all(r.messages for r in unfinished)  # at least the prompt it was given
    assert trainer.take_stopped() == [] and trainer.step_count == 0
