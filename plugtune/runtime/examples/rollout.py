"""Example rollout: answers arithmetic with a calculator tool, so it needs no policy model."""

from __future__ import annotations

import asyncio
import operator
import re

from plugtune import RolloutResult, Runtime, Status, rollout
from plugtune.sdk import Context, Policy, Sample

OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
EXPR = re.compile(r"(-?\d+)\s*([+*-])\s*(-?\d+)")


@rollout(runtime=Runtime(memory_mb=256, timeout_s=10, max_concurrency=32, max_instances=2))
async def calculator(ctx: Context, policy: Policy, sample: Sample) -> RolloutResult:
    question = str(sample.messages[-1]["content"])
    match = EXPR.search(question)
    if match is None:
        return RolloutResult(status=Status.DISCARD, reason=f"no arithmetic in {question!r}")
    a, op, b = int(match.group(1)), match.group(2), int(match.group(3))
    await asyncio.sleep(0.005)  # the tool's latency
    value = OPS[op](a, b)
    ctx.logger.info("calculator(%s %s %s) = %s", a, op, b, value)
    ctx.metric("tool_calls", 1)
    call = {"id": "call-1", "type": "function", "function": {"name": "calc", "arguments": match.group(0)}}
    messages = [
        *sample.messages,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call-1", "content": str(value)},
        {"role": "assistant", "content": str(value)},
    ]
    return RolloutResult(messages=messages)
