"""Token-level math of the GRPO loss: log-probs, masked means, the clipped objective, KL, entropy.

Shapes: ``B`` sequences, ``T`` response positions, ``N`` scored tokens, ``V`` vocabulary.
Every function is pure.
"""

from __future__ import annotations

import torch


def token_logprobs(logits_BTV: torch.Tensor, tokens_BT: torch.Tensor) -> torch.Tensor:
    """log p(token) at each position, from the logits that predict that position."""
    logps_BTV = torch.log_softmax(logits_BTV.float(), dim=-1)
    return logps_BTV.gather(-1, tokens_BT.unsqueeze(-1)).squeeze(-1)


def token_logprobs_and_entropy(
    logits_NV: torch.Tensor, tokens_N: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``token_logprobs`` (with its gradient) and the entropy of each next-token distribution in
    nats (a statistic: no gradient), from one log-softmax over the logits."""
    logps_NV = torch.log_softmax(logits_NV.float(), dim=-1)
    logps_N = logps_NV.gather(-1, tokens_N.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropy_N = -(logps_NV.exp() * logps_NV).sum(-1)
    return logps_N, entropy_N


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is 1; 0.0 when the mask is empty (never NaN from 0/0)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def clipped_pg_loss(
    logps_BT: torch.Tensor,
    old_logps_BT: torch.Tensor,
    advantages_B: torch.Tensor,
    mask_BT: torch.Tensor,
    clip_ratio: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO/GRPO clipped surrogate, averaged over every masked token of the batch.

    Per token: ``max(-A * r, -A * clip(r, 1 - eps, 1 + eps))`` with ``r = exp(logp - old_logp)``.
    ``old_logps`` are the sampling log-probs the gateway recorded. The mean is over all
    response tokens of the batch (token-level, as DAPO and TRL's default), so long and short
    responses weigh by their tokens. Returns the loss and the fraction of clipped tokens.
    """
    ratio_BT = torch.exp(logps_BT - old_logps_BT)
    adv_BT = advantages_B.unsqueeze(-1)
    unclipped_BT = -adv_BT * ratio_BT
    clipped_BT = -adv_BT * torch.clamp(ratio_BT, 1.0 - clip_ratio, 1.0 + clip_ratio)
    loss_BT = torch.maximum(unclipped_BT, clipped_BT)
    is_clipped_BT = (clipped_BT > unclipped_BT).to(logps_BT.dtype)
    return masked_mean(loss_BT, mask_BT), masked_mean(is_clipped_BT, mask_BT).detach()


def kl_k3(logps_BT: torch.Tensor, ref_logps_BT: torch.Tensor) -> torch.Tensor:
    """Per-token KL(policy || reference), Schulman's k3 estimator: ``e^d - d - 1`` with ``d = ref - logp``.

    Unbiased for samples drawn from the policy and never negative.
    """
    delta_BT = ref_logps_BT - logps_BT
    return torch.exp(delta_BT) - delta_BT - 1.0
