"""A history rewrite says where in the record it cut tokens, and how many (the console's token view
marks the place)."""

from __future__ import annotations

from typing import Any

from plugtune.gateway import PolicyGateway
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
