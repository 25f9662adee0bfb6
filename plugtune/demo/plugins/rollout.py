"""The demo rollout: one question, one answer from the policy."""

from __future__ import annotations

from plugtune import Context, Policy, RolloutResult, Sample, rollout


@rollout
async def answer(ctx: Context, policy: Policy, sample: Sample) -> RolloutResult | None:
    # async: the instance's event loop runs every rollout in flight, with no thread per call.
    reply = await policy.achat(
        sample.messages,
        temperature=sample.sampling.temperature,
        top_p=sample.sampling.top_p,
        max_tokens=sample.sampling.max_tokens,
    )
    ctx.metric("completion_tokens", reply["usage"]["completion_tokens"])
    ctx.logger.info("answer: %r", Policy.content(reply))
    return None
