"""The rollout a job uses when ``plugins.rollout`` is absent: one chat call, the reply is the trajectory.

It imports only the SDK, so a plugin worker can load it like any user rollout.
"""

from __future__ import annotations

from typing import Any

from plugtune.sdk import Context, Policy, Sample, rollout


@rollout
async def single_turn(ctx: Context, policy: Policy, sample: Sample) -> None:
    """Ask the policy once with the sample's messages and sampling settings."""
    params: dict[str, Any] = {
        "temperature": sample.sampling.temperature,
        "top_p": sample.sampling.top_p,
        "max_tokens": sample.sampling.max_tokens,
    }
    if sample.tools:
        params["tools"] = sample.tools
    reply = await policy.achat(sample.messages, **params)
    ctx.logger.debug("reply: %r", Policy.content(reply))
    return None
