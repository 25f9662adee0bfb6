"""A history rewrite says where in the record it cut tokens, and how many (the console's token view
marks the place)."""

from __future__ import annotations

from typing import Any

from plugtune.gateway import PolicyGateway
from plugtune.gateway.engine import Generation
from plugtune.gateway.trace import CallPlan, TraceBuilder
from plugtune.types import DroppedSpan


def test_a_rewrite_records_the_span_it_cut(gateway: PolicyGateway) -> None:
    policy = gateway.open("cut")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 3+4?"}]
    policy.chat(messages, temperature=1.0, max_tokens=8)
    rewritten = [
        *messages,
        {"role": "assistant", "content": "I changed this"},
        {"role": "user", "content": "ok?"},
    ]
    policy.chat(rewritten, temperature=1.0, max_tokens=8)
    trace = gateway.take("cut")
    assert trace.rewrites == 1
    [span] = trace.dropped_spans
    # the first reply's tokens were cut where the re-rendered history (its environment segment) starts
    assert span == DroppedSpan(
        at=trace.segments[0].start, tokens=span.tokens, policy_tokens=trace.dropped_policy_tokens, rewrite=1
    )
    assert span.tokens >= span.policy_tokens > 0


def test_a_call_that_extends_the_record_cuts_nothing(gateway: PolicyGateway) -> None:
    policy = gateway.open("kept")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 3+4?"}]
    reply = policy.chat(messages, temperature=1.0, max_tokens=8)
    policy.chat(
        [*messages, reply["choices"][0]["message"], {"role": "user", "content": "sure?"}], max_tokens=8
    )
    trace = gateway.take("kept")
    assert trace.rewrites == 0 and trace.dropped_spans == []


def _reply(builder: TraceBuilder, ids: list[int]) -> None:
    generation = Generation(ids, [-0.5] * len(ids), [], "stop", True, None, 0, 1)
    builder.record_reply(generation, {"role": "assistant", "content": "x"})


def test_a_later_rewrite_that_cuts_earlier_moves_the_older_span_to_its_cut() -> None:
    builder = TraceBuilder("t")
    builder.apply(CallPlan(0, [1, 2], [], is_rewrite=False), [], None, 0)
    _reply(builder, [10, 11, 12, 13])  # response: 10 11 12 13
    builder.apply(CallPlan(2 + 3, None, [20, 21], is_rewrite=True), [], None, 0)  # keeps 10 11 12
    _reply(builder, [30, 31])  # response: 10 11 12 20 21 30 31
    assert builder.snapshot().dropped_spans == [DroppedSpan(at=3, tokens=1, policy_tokens=1, rewrite=1)]
    builder.apply(CallPlan(2 + 1, None, [40], is_rewrite=True), [], None, 0)  # keeps 10
    trace = builder.snapshot()
    assert trace.response_ids == [10, 40] and trace.dropped_policy_tokens == 1 + 4
    assert trace.dropped_spans == [
        DroppedSpan(at=1, tokens=1, policy_tokens=1, rewrite=1),  # it stood after 12: now gone too
        DroppedSpan(at=1, tokens=6, policy_tokens=4, rewrite=2),
    ]
