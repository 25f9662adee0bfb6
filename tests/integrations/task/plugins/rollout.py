"""A rollout for the TRL tests that calls a tool between two policy turns."""

from __future__ import annotations

from plugtune import Context, Policy, RolloutResult, Sample, rollout


def calculator(question: str) -> str:
    digits = [int(t) for t in question.replace("+", " ").replace("=?", " ").split() if t.isdigit()]
    return str(sum(digits))


@rollout
async def with_tool(ctx: Context, policy: Policy, sample: Sample) -> RolloutResult | None:
    question = sample.messages[-1]["content"]
    if sample.extra.get("rollout_crash"):
        raise RuntimeError(f"the rollout cannot start row {sample.index}")
    first = await policy.achat(sample.messages, max_tokens=sample.sampling.max_tokens)
    result = calculator(question)
    messages = [
        *sample.messages,
        {"role": "assistant", "content": Policy.content(first)},
        {"role": "tool", "tool_call_id": "calculator", "content": f"calculator: {result}"},
    ]
    reply = await policy.achat(messages, max_tokens=sample.sampling.max_tokens)
    ctx.logger.info("tool said %s, policy said %r", result, Policy.content(reply))
    ctx.metric("tool_calls", 1)
    return None
