"""The GRPO objective over a step's micro-batches: backward, and the statistics of the step.

Each micro-batch's token means are weighted by its share of the step's policy tokens, so the
gradients add up to exactly those of one token-level mean over the whole batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from plugtune.trainer.batch import TrainBatch, response_logits
from plugtune.trainer.losses import clipped_pg_loss, entropy, kl_k3, masked_mean, token_logprobs


@dataclass(frozen=True)
class LossParts:
    loss: float
    pg_loss: float
    kl: float
    entropy: float
    clip_fraction: float
    logprob_gap: float


class NonFiniteLoss(ArithmeticError):
    """A micro-batch's loss was NaN or infinite (before its backward)."""

    def __init__(self, value: float) -> None:
        super().__init__(f"the loss is {value}")
        self.value = value


def backward(
    model: PreTrainedModel,
    reference: PreTrainedModel | None,
    batches: Sequence[TrainBatch],
    *,
    temperature: float,
    clip_ratio: float,
    kl_coef: float,
) -> LossParts:
    """Accumulate the gradient of the step's loss into ``model``; raise NonFiniteLoss on NaN/inf."""
    total = sum(b.num_tokens for b in batches)
    sums = dict.fromkeys(("loss", "pg", "kl", "entropy", "clip", "gap"), 0.0)
    for batch in batches:
        share = batch.num_tokens / total
        logits_BRV = response_logits(model, batch, temperature)
        logps_BR = token_logprobs(logits_BRV, batch.response_ids_BR)
        pg, clip_fraction = clipped_pg_loss(
            logps_BR, batch.old_logps_BR, batch.advantages_B, batch.mask_BR, clip_ratio
        )
        kl = torch.zeros(())
        if reference is not None:
            with torch.no_grad():
                ref_logps_BR = token_logprobs(
                    response_logits(reference, batch, temperature), batch.response_ids_BR
                )
            kl = masked_mean(kl_k3(logps_BR, ref_logps_BR), batch.mask_BR)
        loss = (pg + kl_coef * kl) * share
        if not math.isfinite(loss.item()):
            raise NonFiniteLoss(loss.item())
        loss.backward()
        with torch.no_grad():
            sums["entropy"] += share * masked_mean(entropy(logits_BRV), batch.mask_BR).item()
            sums["gap"] += share * masked_mean((logps_BR - batch.old_logps_BR).abs(), batch.mask_BR).item()
        sums["loss"] += loss.item()
        sums["pg"] += share * pg.item()
        sums["kl"] += share * kl.item()
        sums["clip"] += share * clip_fraction.item()
    return LossParts(
        loss=sums["loss"],
        pg_loss=sums["pg"],
        kl=sums["kl"],
        entropy=sums["entropy"],
        clip_fraction=sums["clip"],
        logprob_gap=sums["gap"],
    )
