"""One policy call per trajectory, with verl's sampling settings (sample.sampling)."""

from __future__ import annotations

from plugtune import Context, Policy, RolloutResult, Sample, rollout


@rollout
async def solve(ctx: Context, policy: Policy, sample: Sample) -> RolloutResult | None:
    reply = await policy.achat(
        sample.messages,
        temperature=sample.sampling.temperature,
        top_p=sample.sampling.top_p,
        max_tokens=sample.sampling.max_tokens,
    )
    ctx.logger.info("answered %d characters", len(Policy.content(reply)))
    return None
