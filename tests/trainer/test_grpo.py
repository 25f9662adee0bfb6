"""GRPO on a tiny random Llama, through in-process plugins and policy: a real model, real steps."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from plugtune.errors import LossNanError, PluginCallError
from plugtune.trainer import batch as batch_module
from plugtune.trainer.batch import micro_batches
from plugtune.trainer.config import TrainerConfig
from plugtune.trainer.groups import STOPPED, Plugins
from plugtune.trainer.grpo import GRPOTrainer
from plugtune.trainer.model import load_model
from plugtune.trainer.testing import InProcessFunction, InProcessPolicyServer
from tests.trainer import plugins as p

ROWS = [
    {"messages": [{"role": "user", "content": f"{i}+{i}=?"}], "extra": {"answer": str(2 * i)}}
    for i in range(6)
]


def make_trainer(
    path: Path,
    rows: list[dict[str, Any]] = ROWS,
    graders: list[Any] | None = None,
    group_graders: list[Any] | None = None,
    **overrides: Any,
) -> GRPOTrainer:
    lm = load_model(path)
    settings: dict[str, Any] = dict(
        steps=3, batch_size=2, group_size=4, max_new_tokens=12, learning_rate=1e-2
    )
    settings.update(overrides)
    plugins = Plugins(
        rollout=InProcessFunction(p.answer),
        graders=[InProcessFunction(g) for g in (graders if graders is not None else [p.digits])],
        group_graders=[InProcessFunction(g) for g in (group_graders or [])],
    )
    server = InProcessPolicyServer(lm.model, lm.tokenizer, seed=7)
    return GRPOTrainer(lm.model, lm.tokenizer, server, plugins, rows, TrainerConfig(**settings))


def params(trainer: GRPOTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


async def test_smoke_step_changes_parameters_and_reports_metrics(tiny_model_path: Path) -> None:
    trainer = make_trainer(tiny_model_path, group_graders=[p.longest], kl_coef=0.05)
    before = params(trainer)
    result = await trainer.step()
    m = result.metrics
    for name in (
        "reward/mean",
        "reward/std",
        "reward/digits",
        "reward/longest",
        "loss",
        "kl",
        "grad_norm",
        "entropy",
        "response_length",
        "time/plugins_s",
        "time/step_s",
    ):
        assert name in m, name
    assert torch.isfinite(torch.tensor(m["loss"])) and m["grad_norm"] > 0
    assert m["trajectories/total"] == 8 and m["trajectories/trained"] == 8
    # the gateway's sampling log-probs and the trainer's recomputed ones agree
    assert m["logprob_gap"] < 1e-4
    after = params(trainer)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert trainer.server.version == 1  # type: ignore[attr-defined]
    rec = result.records[0]
    assert rec.status == "success" and rec.reward is not None and rec.advantage is not None
    assert set(rec.reward_components) == {"digits", "longest"}
    assert len(rec.response_ids) == len(rec.response_mask) == len(rec.response_logprobs) > 0
    assert rec.messages[-1]["role"] == "assistant"
    # records of one group share its id, and their advantages sum to ~0
    group = [r for r in result.records if r.group_id == rec.group_id]
    assert len(group) == 4 and abs(sum(r.advantage or 0.0 for r in group)) < 1e-4


async def test_failed_retry_discard_and_unscorable_trajectories(tiny_model_path: Path) -> None:
    rows = [
        {"messages": [{"role": "user", "content": mode}], "extra": {"mode": mode}}
        for mode in ("crash", "retry", "discard", "unscorable")
    ]
    trainer = make_trainer(tiny_model_path, rows=rows, batch_size=4)
    result = await trainer.step()
    by_mode = {rows[r.sample_index]["extra"]["mode"]: r for r in result.records}
    crash = by_mode["crash"]
    assert crash.status == "failed" and crash.reward is None and crash.advantage is None
    assert crash.errors[0].cause == "500" and "crashed on purpose" in crash.errors[0].message
    assert crash.errors[0].plugin == "answer"
    assert len(crash.response_ids) > 0  # the tokens it produced are kept for the viewer
    assert [m["role"] for m in crash.messages][:2] == ["user", "assistant"]  # and what the policy said
    retried = by_mode["retry"]  # the plugin's own verdict, with its reason: not a crash
    assert retried.status == "failed" and retried.errors[0].cause == "Status retry"
    assert "returned Status.RETRY; its reason: asked to retry" in retried.errors[0].message
    assert {r.status for r in result.records if r.sample_index == 2} == {"discard"}
    unscorable = by_mode["unscorable"]
    assert unscorable.status == "success" and unscorable.reward is None and unscorable.advantage is None
    m = result.metrics
    assert m["plugin/errors/500"] == 4 and m["plugin/errors/Status retry"] == 4
    assert m["trajectories/discarded"] == 4 and m["trajectories/trained"] == 0
    assert "loss" not in m  # nothing trainable: no optimizer step


async def test_caller_strategy_retries_a_rollout_in_a_fresh_trajectory(tiny_model_path: Path) -> None:
    calls: list[str] = []

    async def retry_once(fn: Any, ctx: Any, *args: Any) -> Any:
        outcome = await fn.invoke(ctx, *args)
        calls.append(fn.spec.name)
        if outcome.status == "retry":
            outcome = await fn.invoke(ctx, *args)
        return outcome

    rows = [{"messages": [{"role": "user", "content": "r"}], "extra": {"mode": "retry"}}]
    trainer = make_trainer(tiny_model_path, rows=rows, batch_size=1, group_size=2)
    trainer.runner.caller = retry_once
    result = await trainer.step()
    rec = result.records[0]
    assert rec.attempt == 2 and rec.trajectory_id == "s1-b0-p0-r0"
    # only the second attempt's tokens are kept: one policy turn of at most max_new_tokens
    assert 0 < sum(rec.response_mask) <= 12


async def test_resume_from_checkpoint_gives_the_same_next_step(tiny_model_path: Path, tmp_path: Path) -> None:
    straight = make_trainer(tiny_model_path, save_every_n_steps=1, kl_coef=0.05)
    results = [r async for r in straight.train(tmp_path / "ckpt")]
    assert [r.step for r in results] == [1, 2, 3]
    assert (tmp_path / "ckpt" / "step-000002" / "config.json").is_file()

    resumed = make_trainer(tiny_model_path, save_every_n_steps=1, kl_coef=0.05)
    resumed.load_checkpoint(tmp_path / "ckpt" / "step-000002")
    assert resumed.step_count == 2
    third = await resumed.step()
    assert third.step == 3
    assert [r.response_ids for r in third.records] == [r.response_ids for r in results[2].records]
    assert third.metrics["loss"] == pytest.approx(results[2].metrics["loss"], rel=1e-5, abs=1e-7)
    a, b = params(straight), params(resumed)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


async def test_save_final_writes_a_loadable_hf_directory(tiny_model_path: Path, tmp_path: Path) -> None:
    trainer = make_trainer(tiny_model_path, steps=1)
    await trainer.step()
    out = trainer.save_final(tmp_path / "final")
    reloaded = load_model(out)
    for k, v in trainer.model.state_dict().items():
        torch.testing.assert_close(reloaded.model.state_dict()[k], v)


async def test_inf_reward_raises_loss_nan_and_applies_nothing(tiny_model_path: Path) -> None:
    trainer = make_trainer(tiny_model_path, graders=[p.digits, p.huge], batch_size=1)
    before = params(trainer)
    with pytest.raises(LossNanError) as info:
        await trainer.step()
    err = info.value
    assert err.type == "Loss nan" and err.step == 1
    assert err.stats["reward/max"] == float("inf")
    assert "advantage/mean" in err.stats
    assert len(err.trajectory_ids) == 4 and all(t.startswith("s1-b0-p") for t in err.trajectory_ids)
    assert "step 1" in err.message and "not applied" in err.message
    after = params(trainer)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert trainer.step_count == 0
    assert all(p.grad is None for p in trainer.model.parameters())


async def test_non_finite_gradient_with_finite_loss_is_not_applied(tiny_model_path: Path) -> None:
    trainer = make_trainer(tiny_model_path)
    result = await trainer.step()
    before = params(trainer)
    weight = next(trainer.model.parameters())
    # sqrt at 0: the value is 0.0, its gradient is inf * 0 = nan
    loss = torch.sqrt(weight.sum() * 0.0)
    assert torch.isfinite(loss)
    loss.backward()
    batches = micro_batches(result.records, trainer.pad_id, trainer.vocab_size)
    with pytest.raises(LossNanError, match="gradient norm is nan") as info:
        trainer._apply(2, result.records, batches)
    assert info.value.trajectory_ids == [t for b in batches for t in b.trajectory_ids]
    assert all(torch.equal(before[k], v) for k, v in params(trainer).items())
    assert all(p.grad is None for p in trainer.model.parameters())


async def test_micro_batches_give_the_same_step_as_one_batch(
    tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = make_trainer(tiny_model_path, kl_coef=0.1)
    one = await whole.step()
    split = make_trainer(tiny_model_path, kl_coef=0.1)
    # room for about three rows per forward: the 8 trajectories go through in several micro-batches
    monkeypatch.setattr(batch_module, "LOGITS_BUDGET", 3 * 12 * split.vocab_size)
    assert len(batch_module.micro_batches(one.records, split.pad_id, split.vocab_size)) >= 3
    many = await split.step()
    assert [r.response_ids for r in many.records] == [r.response_ids for r in one.records]
    for name in ("loss", "kl", "entropy", "grad_norm", "logprob_gap"):
        assert many.metrics[name] == pytest.approx(one.metrics[name], rel=1e-4, abs=1e-6), name
    # Adam divides each gradient by its own scale (plus eps 1e-8), so a weight whose gradient is
    # near eps moves by the float rounding of the summation order: 1e-4 is a hundredth of the
    # learning rate's step (the loss and grad_norm above compare the gradients themselves)
    for k, v in params(whole).items():
        torch.testing.assert_close(params(split)[k], v, rtol=1e-4, atol=1e-4)


def test_plugins_check_kinds_and_unique_grader_names() -> None:
    with pytest.raises(TypeError, match="digits is a grader, used here as a rollout"):
        Plugins(rollout=InProcessFunction(p.digits))
    with pytest.raises(ValueError, match="unique"):
        Plugins(rollout=InProcessFunction(p.answer), graders=[InProcessFunction(p.digits)] * 2)


async def test_a_caller_that_stops_the_job_keeps_the_evidence_in_the_stopped_records(
    tiny_model_path: Path,
) -> None:
    class Stop(Exception):
        pass

    seen: list[str] = []

    async def stop_on_crash(fn: Any, ctx: Any, *args: Any) -> Any:
        try:
            return await fn.invoke(ctx, *args)
        except PluginCallError as exc:
            seen.append(ctx.trajectory_id)
            raise Stop(ctx.trajectory_id) from exc

    rows = [{"messages": [{"role": "user", "content": "c"}], "extra": {"mode": "crash"}}]
    trainer = make_trainer(tiny_model_path, rows=rows, batch_size=1, group_size=2)
    trainer.runner.caller = stop_on_crash
    before = params(trainer)
    with pytest.raises(Stop):
        await trainer.step()
    assert seen and seen[0].startswith("s1-b0-p0-r")
    stopped = {r.trajectory_id: r for r in trainer.take_stopped()}
    record = stopped[seen[0]]  # what the rollout got from the policy before it crashed
    assert record.status == "failed" and record.stop_reason == STOPPED
    assert sum(record.response_mask) > 0 and record.messages[-1]["role"] == "assistant"
    with pytest.raises(KeyError):  # the policy server closed it
        trainer.server.take(seen[0])
    assert trainer.step_count == 0 and all(torch.equal(before[k], v) for k, v in params(trainer).items())


async def test_the_policy_server_knows_the_steps_fan_out_before_a_rollout_asks(tiny_model_path: Path) -> None:
    trainer = make_trainer(tiny_model_path, batch_size=2, group_size=3, overlap_rollouts=True)
    server = trainer.server
    assert isinstance(server, InProcessPolicyServer)
    open_at_first_call: list[int] = []
    chat = server.chat

    def counting_chat(key: str, messages: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
        open_at_first_call.append(len(server._open))
        return chat(key, messages, **params)

    server.chat = counting_chat  # type: ignore[method-assign]
    result = await trainer.step()
    assert open_at_first_call and open_at_first_call[0] == 6  # every trajectory of the step
    assert len(result.records) == 6 and not any(t.startswith("s1-") for t in server._open)  # closed after it
    await trainer.cancel_pending()  # the next step's rollouts, started ahead, close theirs
    assert not server._open


async def test_the_next_steps_rollouts_start_during_training_and_sample_the_new_weights(
    tiny_model_path: Path,
) -> None:
    trainer = make_trainer(tiny_model_path, batch_size=2, group_size=3, steps=2, overlap_rollouts=True)
    server = trainer.server
    assert isinstance(server, InProcessPolicyServer)
    next_step_asked = threading.Event()
    sampled_at_version: list[int] = []
    chat, generate, backward = server.chat, server.model.generate, trainer._backward

    def noting_chat(key: str, messages: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
        if key.startswith("s2-"):
            next_step_asked.set()  # then it waits for the weights lock, held by the training
        return chat(key, messages, **params)

    def noting_generate(*args: Any, **kwargs: Any) -> Any:
        sampled_at_version.append(server.version)  # under the weights lock
        return generate(*args, **kwargs)

    def backward_once_the_next_step_asked(*args: Any) -> Any:
        if trainer.step_count == 0:  # step 1's training goes on only once step 2 asked the policy
            assert next_step_asked.wait(30), "the next step's rollouts did not start during training"
        return backward(*args)

    server.chat = noting_chat  # type: ignore[method-assign]
    server.model.generate = noting_generate  # type: ignore[method-assign]
    trainer._backward = backward_once_the_next_step_asked  # type: ignore[method-assign]
    first = await trainer.step()
    second = await trainer.step()
    assert first.metrics["time/overlapped_s"] == 0.0 and second.metrics["time/overlapped_s"] > 0
    # every step-2 token was sampled after step 1's update (policy version 1), none before it
    assert sampled_at_version == [0] * 6 + [1] * 6
    assert {r.policy_version for r in second.records} == {1}
    assert trainer._next is None  # no step 3 to start ahead
    assert {r.sample_index for r in second.records}.isdisjoint({r.sample_index for r in first.records})


async def test_a_checkpoint_taken_with_the_next_step_started_resumes_with_its_prompts(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    trainer = make_trainer(tiny_model_path, batch_size=2, group_size=2, steps=3, overlap_rollouts=True)
    await trainer.step()
    assert trainer._next is not None  # step 2 started ahead, its prompts drawn
    trainer.save_checkpoint(tmp_path / "step-1")
    straight = await trainer.step()
    await trainer.cancel_pending()

    resumed = make_trainer(tiny_model_path, batch_size=2, group_size=2, steps=3)
    resumed.load_checkpoint(tmp_path / "step-1")
    again = await resumed.step()
    await resumed.cancel_pending()
    assert [r.sample_index for r in again.records] == [r.sample_index for r in straight.records]


async def test_a_nan_step_cancels_the_next_steps_rollouts(tiny_model_path: Path) -> None:
    trainer = make_trainer(tiny_model_path, graders=[p.huge], overlap_rollouts=True)
    with pytest.raises(LossNanError):
        await trainer.step()
    assert trainer._next is None and not trainer.server._open  # type: ignore[attr-defined]


async def test_without_overlap_nothing_runs_between_steps(tiny_model_path: Path) -> None:
    trainer = make_trainer(tiny_model_path, batch_size=2, group_size=2)
    result = await trainer.step()
    assert trainer._next is None and not trainer.server._open  # type: ignore[attr-defined]
    assert result.metrics["time/overlapped_s"] == 0.0


async def test_spin_quieting_after_each_step_changes_no_result(
    tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from plugtune.trainer import spin

    before = torch.get_num_threads()
    monkeypatch.setattr(spin, "_usable_cpus", lambda: 2)
    torch.set_num_threads(2)
    try:
        plain = make_trainer(tiny_model_path)
        monkeypatch.setattr(plain.spin, "applies", lambda: False)
        quiet = make_trainer(tiny_model_path)
        for _ in range(2):
            a, b = await plain.step(), await quiet.step()
            assert quiet.spin.started == torch.backends.openmp.is_available()  # quieted after the step
            assert not plain.spin.started
            assert [r.response_ids for r in a.records] == [r.response_ids for r in b.records]
        quiet.spin.release()
        for k, v in params(plain).items():
            torch.testing.assert_close(params(quiet)[k], v, rtol=0, atol=0)
    finally:
        torch.set_num_threads(before)


async def test_a_trajectory_is_graded_as_soon_as_its_rollout_ends(tiny_model_path: Path) -> None:
    p.EVENTS.clear()
    trainer = make_trainer(tiny_model_path, batch_size=1, group_size=3, graders=[p.stamp])
    trainer.runner.plugins = Plugins(
        rollout=InProcessFunction(p.slow_first), graders=[InProcessFunction(p.stamp)]
    )
    result = await trainer.step()
    at = {(event, index): t for event, index, t in p.EVENTS}
    slowest_ended = at[("rollout ended", 0)]
    assert at[("graded", 1)] < slowest_ended and at[("graded", 2)] < slowest_ended  # not after the group
    assert at[("graded", 0)] > slowest_ended
    assert all(r.reward_components == {"stamp": 1.0} for r in result.records)


async def test_a_discarded_group_keeps_no_grade(tiny_model_path: Path) -> None:
    rows = [{"messages": [{"role": "user", "content": "d"}], "extra": {"mode": "discard"}}]
    trainer = make_trainer(tiny_model_path, rows=rows, batch_size=1, group_size=3)
    result = await trainer.step()
    assert {r.status for r in result.records} == {"discard"}
    assert all(r.reward is None and r.reward_components == {} for r in result.records)
