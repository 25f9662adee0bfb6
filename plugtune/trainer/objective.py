"""The GRPO objective over a step's micro-batches: backward, and the statistics of the step.

Each micro-batch's token means are weighted by its share of the step's policy tokens, so the
gradients add up to exactly those of one token-level mean over the whole batch. Only the tokens
the policy sampled are scored (``policy_logits``): the per-token tensors here are ``[N, 1]``, one
row per such token, and a token-level mean is a plain mean over them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from plugtune.trainer.batch import TrainBatch, policy_logits
from plugtune.trainer.losses import (
    clipped_pg_loss,
    kl_k3,
    token_logprobs,
    token_logprobs_and_entropy,
)
from plugtune.types import TrajectoryRecord


@dataclass(frozen=True)
class LossParts:
    loss: float
    pg_loss: float
    kl: float
    entropy: float
    clip_fraction: float
    logprob_gap: float
    # Each trained trajectory's log-prob per response token under the weights it trained (0.0 where
    # the policy did not sample the token), by trajectory id: what the console's token view shows.
    trainer_logprobs: dict[str, list[float]] = field(default_factory=dict)


class NonFiniteLoss(ArithmeticError):
    """A micro-batch's loss was NaN or infinite (before its backward)."""

    def __init__(self, value: float) -> None:
        super().__init__(f"the loss is {value}")
        self.value = value


def checkpoint_activations(model: PreTrainedModel) -> None:
    """Turn activation (gradient) checkpointing on, non-reentrant: transformers v5 named it
    ``activation_checkpointing_enable`` (the old name warns that v6 removes it)."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


@contextlib.contextmanager
def checkpointed(model: PreTrainedModel) -> Iterator[None]:
    """With gradient checkpointing on (``hyperparameters.gradient_checkpointing``), let the model's
    checkpointed layers recompute in backward: transformers does it only for a layer in training
    mode, and the trainer keeps the model in eval mode (no dropout); only those layers' own flag is
    set, so nothing inside them (dropout, attention dropout) changes."""
    layers = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True]
    before = [m.training for m in layers]
    for m in layers:
        m.training = True
    try:
        yield
    finally:
        for m, was in zip(layers, before, strict=True):
            m.training = was


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
    scored: dict[str, list[float]] = {}
    device = next(model.parameters()).device
    for batch in (b.to(device) for b in batches):
        share = batch.num_tokens / total
        b_N, t_N = batch.policy_positions
        tokens_N = batch.response_ids_BR[b_N, t_N]
        with checkpointed(model):
            logits_N = policy_logits(model, batch, temperature)
        logps_N, entropy_N = token_logprobs_and_entropy(logits_N, tokens_N)
        logps_N1, old_N1 = logps_N[:, None], batch.old_logps_BR[b_N, t_N][:, None]
        mask_N1 = torch.ones_like(logps_N1)
        pg, clip_fraction = clipped_pg_loss(logps_N1, old_N1, batch.advantages_B[b_N], mask_N1, clip_ratio)
        kl = torch.zeros((), device=device)
        if reference is not None:
            with torch.no_grad():
                ref_N = token_logprobs(policy_logits(reference, batch, temperature)[None], tokens_N[None])[0]
            kl = kl_k3(logps_N, ref_N).mean()
        loss = (pg + kl_coef * kl) * share
        if not math.isfinite(loss.item()):
            raise NonFiniteLoss(loss.item())
        loss.backward()
        with torch.no_grad():
            sums["entropy"] += share * entropy_N.mean().item()
            sums["gap"] += share * (logps_N1 - old_N1).abs().mean().item()
            scored.update(_per_trajectory(batch, logps_N.detach()))
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
        trainer_logprobs=scored,
    )


def with_trainer_logprobs(
    records: Sequence[TrajectoryRecord], scored: dict[str, list[float]]
) -> list[TrajectoryRecord]:
    """``records``, each one the trainer scored with its ``trainer_logprobs``."""
    return [
        dataclasses.replace(r, trainer_logprobs=scored[r.trajectory_id][: len(r.response_ids)])
        if r.trajectory_id in scored
        else r
        for r in records
    ]


def _per_trajectory(batch: TrainBatch, logps_N: torch.Tensor) -> dict[str, list[float]]:
    """``logps_N`` (one per policy token, row-major) as one list per trajectory over its response."""
    b_N, t_N = batch.policy_positions
    full_BR = torch.zeros(batch.mask_BR.shape, dtype=torch.float32, device=logps_N.device)
    full_BR[b_N, t_N] = logps_N.float()
    lengths = batch.response_attention_BR.sum(1).tolist()
    rows = full_BR.cpu().tolist()
    return {tid: row[: int(n)] for tid, row, n in zip(batch.trajectory_ids, rows, lengths, strict=True)}
