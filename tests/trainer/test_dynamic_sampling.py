"""hyperparameters.dynamic_sampling (issue 27 item 2): a step leaves out the groups that give no
gradient, records them as discard saying why, and refills its batch with new prompts from the data
cursor up to max_extra_batches (tiny real model, in-process plugins)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from plugtune.errors import InvalidValueError
from plugtune.sdk import Kind
from plugtune.trainer.config import TrainerConfig
from plugtune.trainer.data import DataCursor
from plugtune.trainer.groups import STOPPED, Plugins
from plugtune.trainer.grpo import GRPOTrainer, StepResult
from plugtune.trainer.model import load_model
from plugtune.trainer.protocols import call_once
from plugtune.trainer.testing import InProcessFunction, InProcessPolicyServer
from tests.trainer import plugins as p

VARIED = {3, 6}  # the rows whose groups get different rewards; every other row's are all 0.5
FLAT_REASON = (
    "its group was dropped by dynamic sampling: every scored trajectory had reward 0.5 (zero variance)"
)


def rows(varied: set[int]) -> list[dict[str, Any]]:
    return [
        {"messages": [{"role": "user", "content": f"{i}+{i}=?"}], "extra": {"flat": i not in varied}}
        for i in range(8)
    ]


def make(path: Path, varied: set[int] = VARIED, caller: Any = call_once, **settings: Any) -> GRPOTrainer:
    lm = load_model(path)
    config = TrainerConfig(
        **{"steps": 2, "batch_size": 2, "group_size": 2, "max_new_tokens": 4, "seed": 5, **settings}
    )
    plugins = Plugins(rollout=InProcessFunction(p.answer), graders=[InProcessFunction(p.flat_when_told)])
    server = InProcessPolicyServer(lm.model, lm.tokenizer, seed=3)
    return GRPOTrainer(lm.model, lm.tokenizer, server, plugins, rows(varied), config, caller=caller)


def groups_of(result: StepResult) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for r in result.records:
        out.setdefault(r.group_id, []).append(r)
    return out


async def test_flat_groups_are_left_out_and_the_batch_refilled_from_the_data_cursor(
    tiny_model_path: Path,
) -> None:
    trainer = make(tiny_model_path, steps=1, dynamic_sampling=True, max_extra_batches=8)
    result = await trainer.step()
    groups = groups_of(result)
    drawn = [members[0].sample_index for members in groups.values()]
    order = DataCursor(8, 5).take(8)
    assert order[:2] != [3, 6] and set(order[:2]) != VARIED  # the first batch has a flat row
    # the prompts drawn are the cursor's next ones, each once, up to the batch's second varied row
    assert drawn == order[: len(drawn)] and VARIED <= set(drawn)
    kept = [g for g in groups.values() if g[0].sample_index in VARIED]
    dropped = [g for g in groups.values() if g[0].sample_index not in VARIED]
    assert len(kept) == 2 and len(dropped) == len(drawn) - 2 >= 1
    for members in kept:
        assert {r.status for r in members} == {"success"}
        assert sorted(r.advantage for r in members) == pytest.approx([-1.0, 1.0], abs=1e-5)
    for members in dropped:
        for r in members:
            assert r.status == "discard" and r.advantage is None and r.reward is None
            assert r.discard_reason == FLAT_REASON
    m = result.metrics
    assert m["dynamic_sampling/filtered_groups"] == len(dropped)
    assert m["dynamic_sampling/extra_groups"] == len(drawn) - 2
    assert m["dynamic_sampling/extra_rollouts"] == 2 * (len(drawn) - 2)
    assert m["dynamic_sampling/kept_groups"] == 2
    assert m["trajectories/total"] == 2 * len(drawn) and m["trajectories/trained"] == 4
    assert m["trajectories/discarded"] == 2 * len(dropped)
    assert m["groups/zero_variance_share"] == pytest.approx(len(dropped) / len(drawn))  # as graded
    # no no_gradient warning (60% of the groups rolled out were flat): it trained on groups with one
    assert "loss" in m and [w.key for w in result.warnings] == ["truncated"]  # at max_new_tokens 4
    # the extra prompts were used up: the next step goes on where the refill stopped
    assert trainer.cursor.take(1) == [order[len(drawn)]]


async def test_with_overlapped_rollouts_the_next_step_draws_after_the_refill(tiny_model_path: Path) -> None:
    drawn = []
    for overlap in (False, True):
        trainer = make(
            tiny_model_path, steps=2, overlap_rollouts=overlap, dynamic_sampling=True, max_extra_batches=8
        )
        results = [r async for r in trainer.train()]
        assert [r.metrics["dynamic_sampling/kept_groups"] for r in results] == [2, 2]
        assert (results[1].metrics["time/overlapped_s"] > 0) is overlap  # step 2's batch started early
        drawn.append([[g[0].sample_index for g in groups_of(r).values()] for r in results])
    # step 2's batch, drawn while step 1 trained, comes after step 1's refill: the same prompts
    assert drawn[1] == drawn[0]
    assert drawn[0][0] == DataCursor(8, 5).take(len(drawn[0][0]))


async def test_off_by_default_flat_groups_train_as_before(tiny_model_path: Path) -> None:
    trainer = make(tiny_model_path)
    assert trainer.config.dynamic_sampling is False
    result = await trainer.step()
    groups = groups_of(result)
    assert [g[0].sample_index for g in groups.values()] == DataCursor(8, 5).take(2)
    assert len(result.records) == 4 and {r.status for r in result.records} == {"success"}
    flat = [r for r in result.records if r.sample_index not in VARIED]
    assert flat and all(r.advantage == 0.0 for r in flat)  # kept, with nothing to prefer
    assert not [n for n in result.metrics if n.startswith("dynamic_sampling/")]


async def test_the_bound_stops_the_refill_and_the_step_trains_on_what_it_has(tiny_model_path: Path) -> None:
    trainer = make(tiny_model_path, varied=set(), steps=1, dynamic_sampling=True, max_extra_batches=2)
    result = await trainer.step()
    m = result.metrics
    assert len(groups_of(result)) == 6  # the batch, then two extra batches of two prompts
    assert {r.discard_reason for r in result.records} == {FLAT_REASON}
    assert m["dynamic_sampling/filtered_groups"] == 6 and m["dynamic_sampling/kept_groups"] == 0
    assert m["dynamic_sampling/extra_groups"] == 4 and m["dynamic_sampling/extra_rollouts"] == 8
    assert m["trajectories/trained"] == 0 and "loss" not in m
    assert trainer.step_count == 1 and trainer.server.version == 1  # type: ignore[attr-defined]
    # it says what no_gradient would have said, and no_gradient stays quiet
    assert [w.key for w in result.warnings] == ["truncated", "dynamic_sampling_short"]
    short = result.warnings[1:]
    assert short[0].message.startswith(
        "step 1: dynamic sampling found 0 of batch_size 2 groups with a reward difference after 2 "
        "extra batches (hyperparameters.max_extra_batches 2, 8 extra rollouts; 6 groups left out)"
    )
    # max_extra_batches 0: the flat groups are only left out
    trainer = make(tiny_model_path, varied={3}, dynamic_sampling=True, max_extra_batches=0)
    result = await trainer.step()
    m = result.metrics
    assert m["dynamic_sampling/extra_rollouts"] == 0 and len(result.records) == 4
    assert m["dynamic_sampling/filtered_groups"] == 2 - m["dynamic_sampling/kept_groups"] >= 1


class StopTheJob(Exception):
    """What the jobs layer's caller raises to end the job (JobStop), here without the jobs layer."""


async def test_a_stop_during_the_refill_keeps_every_trajectory_of_the_step(tiny_model_path: Path) -> None:
    async def caller(fn: Any, ctx: Any, *args: Any) -> Any:
        if fn.spec.kind is Kind.ROLLOUT and ctx.trajectory_id.startswith("s1-b2-"):  # the first extra group
            raise StopTheJob("stop")
        return await fn.invoke(ctx, *args)

    trainer = make(tiny_model_path, varied=set(), caller=caller, dynamic_sampling=True)
    with pytest.raises(StopTheJob):
        await trainer.step()
    assert trainer.step_count == 0
    stopped = trainer.take_stopped()
    places = sorted({r.group_id.split("-")[1] for r in stopped})
    assert places == ["b0", "b1", "b2", "b3"] and len(stopped) == 8
    batch = [r for r in stopped if r.group_id.split("-")[1] in ("b0", "b1")]
    assert {(r.status, r.reward) for r in batch} == {("success", 0.5)}  # as graded, not yet left out
    refill = [r for r in stopped if r not in batch]
    assert {(r.status, r.stop_reason) for r in refill} == {("failed", STOPPED)}


def test_the_options_are_documented_and_checked() -> None:
    docs = TrainerConfig.docs()
    assert "Default False (true or false)" in docs["dynamic_sampling"]
    assert "Default 2, range [0, 64]" in docs["max_extra_batches"]
    with pytest.raises(InvalidValueError, match=r"hyperparameters.max_extra_batches\]: -1 is outside"):
        TrainerConfig.from_dict({"dynamic_sampling": True, "max_extra_batches": -1})
    with pytest.raises(InvalidValueError, match=r"hyperparameters.dynamic_sampling\]: must be true or false"):
        TrainerConfig.from_dict({"dynamic_sampling": "yes"})
