"""A rollout for the verl tests that calls a tool: the calculator's result goes back to the policy."""

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
    first = await policy.achat(sample.messages, max_tokens=4, temperature=sample.sampling.temperature)
    messages = [
        *sample.messages,
        {"role": "assistant", "content": Policy.content(first)},  # exactly what the policy said
        {"role": "tool", "tool_call_id": "call-1", "content": calculator(question)},
    ]
    reply = await policy.achat(messages, max_tokens=8)
    ctx.logger.info("tool said %s, policy said %r", calculator(question), Policy.content(reply))
    ctx.metric("tool_calls", 1)
    return None
