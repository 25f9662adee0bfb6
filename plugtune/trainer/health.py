"""Warnings about a step that trained, but not on what the user thinks: pure functions of its metrics.

Each warning has a key (the jobs layer shows a key once per attempt) and a message that says what
was measured, why it matters and what to do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: How far the trainer's recomputed log-probs may drift from the sampler's by float rounding alone
#: (mean absolute difference per policy token): the same weights run two code paths (the gateway's
#: decoder with a key/value cache, the trainer's full forward).
FULL_PRECISION_NOISE = 1e-3
HALF_PRECISION_NOISE = 2e-2


@dataclass(frozen=True)
class StepWarning:
    key: str  # logprob_gap | history_rewrites
    message: str


def logprob_noise(dtype: torch.dtype) -> float:
    """The ``logprob_gap`` that float rounding explains for weights of ``dtype``."""
    return FULL_PRECISION_NOISE if dtype.itemsize >= 4 else HALF_PRECISION_NOISE


def step_warnings(step: int, metrics: dict[str, float], noise: float, top_p: float) -> list[StepWarning]:
    """What the step's metrics say went silently wrong ([] for a healthy step)."""
    out: list[StepWarning] = []
    gap = metrics.get("logprob_gap")
    if gap is not None and gap > noise:
        cause = (
            f"hyperparameters.top_p is {top_p:g}: the gateway samples from the nucleus but the trainer "
            "scores the full distribution; set top_p: 1.0 for on-policy training"
            if top_p < 1.0
            else "the replies were sampled from another distribution than the policy at the job's "
            "temperature (a policy outside the gateway, or a model whose generation differs from its "
            "forward pass); sample through policy.openai() / policy.achat() of the rollout's policy"
        )
        out.append(
            StepWarning(
                "logprob_gap",
                f"step {step}: logprob_gap is {gap:.4g}, above the {noise:g} that numerical noise "
                f"explains: training is off-policy. Likely cause: {cause}.",
            )
        )
    rewrites = metrics.get("history/rewrites", 0.0)
    if rewrites > 0:
        dropped = metrics.get("tokens/dropped_policy", 0.0)
        out.append(
            StepWarning(
                "history_rewrites",
                f"step {step}: {rewrites:.0f} rollout call(s) sent a history that differs from what the "
                f"policy produced, so {dropped:.0f} recorded policy tokens were dropped from training. "
                "Send the assistant messages back as the policy returned them (each trajectory's "
                "metrics history/rewrites and history/dropped_policy_tokens say which ones).",
            )
        )
    return out
