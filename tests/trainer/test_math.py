"""The trainer's pure math against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from plugtune.trainer.losses import (
    clipped_pg_loss,
    kl_k3,
    masked_mean,
    token_logprobs,
    token_logprobs_and_entropy,
)
from plugtune.trainer.rewards import final_reward, group_advantages, summary


def test_final_reward_is_weighted_sum_of_scored_components() -> None:
    assert final_reward({"exact": 1.0, "len": 0.5}, {"exact": 2.0, "len": 0.5}) == pytest.approx(2.25)
    # a None component is left out; a grader without a weight counts 1.0
    assert final_reward({"exact": None, "len": 0.5}, {"exact": 2.0}) == pytest.approx(0.5)
    assert final_reward({"exact": None, "len": None}, {"exact": 2.0, "len": 1.0}) is None
    assert final_reward({}, {}) is None
    assert final_reward({"exact": 0.0}, {"exact": 3.0}) == 0.0


def test_group_advantages_by_hand() -> None:
    # rewards 1, 0, 0, 1: mean 0.5, population std 0.5 -> +-1 (up to eps)
    adv = group_advantages([1.0, 0.0, 0.0, 1.0], eps=0.0)
    assert adv == pytest.approx([1.0, -1.0, -1.0, 1.0])
    # rewards 3, 1: mean 2, std 1; eps shrinks the magnitude
    adv = group_advantages([3.0, 1.0], eps=1.0)
    assert adv == pytest.approx([0.5, -0.5])


def test_unscorable_rewards_are_excluded_from_group_stats() -> None:
    # scorable 2, 0, 4: mean 2, std sqrt(8/3)
    std = math.sqrt(8.0 / 3.0)
    adv = group_advantages([2.0, None, 0.0, 4.0], eps=0.0)
    assert adv[1] is None
    assert adv[0] == pytest.approx(0.0)
    assert adv[2] == pytest.approx(-2.0 / std)
    assert adv[3] == pytest.approx(2.0 / std)


def test_constant_or_tiny_groups_give_zero_advantage() -> None:
    assert group_advantages([0.7, 0.7, 0.7]) == [0.0, 0.0, 0.0]
    assert group_advantages([None, 0.7, None]) == [None, 0.0, None]
    assert group_advantages([None, None]) == [None, None]
    assert group_advantages([]) == []


def test_summary_ignores_none() -> None:
    s = summary([1.0, None, 3.0])
    assert s == {"mean": 2.0, "std": 1.0, "min": 1.0, "max": 3.0, "count": 2.0}
    assert math.isnan(summary([None])["mean"])


def test_token_logprobs_and_entropy_by_hand() -> None:
    # vocabulary of 2: logits (0, ln 3) -> p = (1/4, 3/4)
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]])
    tokens = torch.tensor([[1, 0]])
    logps = token_logprobs(logits, tokens)
    assert logps.tolist()[0] == pytest.approx([math.log(0.75), math.log(0.5)])
    logps_n, ent = token_logprobs_and_entropy(logits[0], tokens[0])
    assert logps_n.tolist() == pytest.approx([math.log(0.75), math.log(0.5)])
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert ent.tolist() == pytest.approx([h, math.log(2.0)])


def test_token_logprobs_and_entropy_from_one_log_softmax() -> None:
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0], [2.0, -1.0]], requires_grad=True)
    tokens = torch.tensor([1, 0, 1])
    logps, ent = token_logprobs_and_entropy(logits, tokens)
    torch.testing.assert_close(logps, token_logprobs(logits[None], tokens[None])[0])
    p = torch.softmax(logits.detach(), -1)
    torch.testing.assert_close(ent, -(p * p.log()).sum(-1))
    assert logps.requires_grad and not ent.requires_grad  # entropy is a statistic, not in the loss
    logps.sum().backward()
    assert logits.grad is not None
    # d log softmax(x)_k / dx = onehot(k) - softmax(x): each row's gradient sums to zero
    torch.testing.assert_close(logits.grad.sum(-1), torch.zeros(3))


def test_masked_mean_ignores_masked_positions_and_empty_mask() -> None:
    values = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_mean(values, mask).item() == pytest.approx(2.0)
    assert masked_mean(values, torch.zeros_like(mask)).item() == 0.0


def test_clipped_pg_loss_on_policy_is_minus_mean_advantage() -> None:
    logps = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]])
    adv = torch.tensor([1.0, -3.0])
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, clipfrac = clipped_pg_loss(logps, logps.clone(), adv, mask, clip_ratio=0.2)
    # ratio 1 everywhere: tokens (-1, -1, +3) over 3 masked tokens
    assert loss.item() == pytest.approx(1.0 / 3.0)
    assert clipfrac.item() == 0.0


def test_clipped_pg_loss_clips_by_hand() -> None:
    old = torch.zeros(1, 3)
    # ratios e^0.5 = 1.6487 (clipped to 1.2 for A>0 -> the objective stops growing),
    #        e^-0.5 = 0.6065 (A>0: unclipped -0.6065 is larger than clipped -0.8, so it is used),
    #        1.0
    logps = torch.tensor([[0.5, -0.5, 0.0]])
    loss, clipfrac = clipped_pg_loss(logps, old, torch.tensor([2.0]), torch.ones(1, 3), clip_ratio=0.2)
    per_token = [-2.0 * 1.2, -2.0 * math.exp(-0.5), -2.0]
    assert loss.item() == pytest.approx(sum(per_token) / 3)
    assert clipfrac.item() == pytest.approx(1.0 / 3.0)
    # negative advantage: the ratio below 1 - eps is clipped, the one above is not
    loss, clipfrac = clipped_pg_loss(logps, old, torch.tensor([-1.0]), torch.ones(1, 3), clip_ratio=0.2)
    per_token = [math.exp(0.5), 0.8, 1.0]
    assert loss.item() == pytest.approx(sum(per_token) / 3)
    assert clipfrac.item() == pytest.approx(1.0 / 3.0)


def test_clipped_pg_loss_gradient_is_zero_for_clipped_tokens() -> None:
    logps = torch.tensor([[0.5, 0.0]], requires_grad=True)
    loss, _ = clipped_pg_loss(logps, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), 0.2)
    loss.backward()
    assert logps.grad is not None
    # d/dlogp of -A * r / 2 at r = 1 is -0.5; the clipped token has no gradient
    assert logps.grad.tolist()[0] == pytest.approx([0.0, -0.5])


def test_kl_k3_by_hand() -> None:
    logps = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.0, -1.0]])
    kl = kl_k3(logps, ref)
    # d = 0 -> 0;  d = 1 -> e - 2
    assert kl.tolist()[0] == pytest.approx([0.0, math.e - 2.0])
    assert (kl_k3(ref, logps) >= 0).all()
