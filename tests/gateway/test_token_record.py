from __future__ import annotations

import concurrent.futures
import json
import logging
from typing import Any

import pytest
import torch

from plugtune.gateway import PolicyGateway
from plugtune.types import TokenTrace

from .conftest import ScriptedModel, encode

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
]
CALL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>'


def policy_runs(trace: TokenTrace) -> list[list[int]]:
    """The response tokens sampled by the policy, one list per run of mask 1."""
    runs: list[list[int]] = []
    previous = 0
    for token, mask in zip(trace.response_ids, trace.response_mask, strict=True):
        if mask and not previous:
            runs.append([])
        if mask:
            runs[-1].append(token)
        previous = mask
    return runs


def assert_well_formed(trace: TokenTrace) -> None:
    n = len(trace.response_ids)
    assert len(trace.response_mask) == len(trace.response_logprobs) == n
    assert all(lp == 0.0 for lp, m in zip(trace.response_logprobs, trace.response_mask, strict=True) if not m)
    assert all(lp <= 0.0 for lp in trace.response_logprobs)
    assert [s.start for s in trace.segments] == [0] + [s.end for s in trace.segments[:-1]]
    assert trace.segments[-1].end == n
    for s in trace.segments:
        assert set(trace.response_mask[s.start : s.end]) == {1 if s.source == "policy" else 0}


def test_a_tool_call_round_trip_records_policy_and_tool_tokens_apart(
    scripted: tuple[PolicyGateway, ScriptedModel], tokenizer: Any
) -> None:
    gw, model = scripted
    model.scripts += [encode(tokenizer, CALL_TEXT), encode(tokenizer, "7")]
    policy = gw.open("tools")
    client = policy.openai()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 3+4?"}]
    first = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, temperature=0.0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 3, "b": 4}

    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "7"},
    ]
    second = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, temperature=0.0)
    assert second.choices[0].message.content == "7" and second.choices[0].finish_reason == "stop"

    trace = gw.take("tools")
    assert_well_formed(trace)
    eos = tokenizer.eos_token_id
    assert policy_runs(trace) == [encode(tokenizer, CALL_TEXT) + [eos], encode(tokenizer, "7") + [eos]]
    assert [s.source for s in trace.segments] == ["policy", "environment", "policy"]
    tool_text = tokenizer.decode(trace.response_ids[trace.segments[1].start : trace.segments[1].end])
    assert (
        tool_text
        == "\n<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    rendered = tokenizer.apply_chat_template(
        messages, tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    assert tokenizer.decode(trace.prompt_ids + trace.response_ids) == rendered + "7<|im_end|>"
    assert trace.rewrites == 0 and trace.finish_reason == "stop"
    assert trace.messages[1]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 3, "b": 4}'}
    assert trace.messages[2] == {"role": "tool", "tool_call_id": call.id, "content": "7"}
    assert trace.messages[-1] == {"role": "assistant", "content": "7"}


def test_a_malformed_tool_call_is_plain_content(
    scripted: tuple[PolicyGateway, ScriptedModel], tokenizer: Any
) -> None:
    gw, model = scripted
    broken = '<tool_call>\n{"name": "add", "arguments": {"a": 3\n</tool_call>'
    model.scripts.append(encode(tokenizer, broken))
    policy = gw.open("broken")
    reply = policy.openai().chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "3+4?"}], tools=TOOLS, temperature=0.0
    )
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.content == broken and reply.choices[0].message.tool_calls is None
    gw.take("broken")


def test_multi_turn_user_messages_extend_the_record_with_mask_zero(
    gateway: PolicyGateway, tokenizer: Any
) -> None:
    policy = gateway.open("multi")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 3+4?"}]
    for question in ["What is 10+4?", "What is 1+1?"]:
        reply = policy.chat(messages, temperature=1.0, seed=5, max_tokens=8)
        messages += [reply["choices"][0]["message"], {"role": "user", "content": question}]
    policy.chat(messages, temperature=1.0, seed=5, max_tokens=8)
    trace = gateway.take("multi")
    assert_well_formed(trace)
    assert [s.source for s in trace.segments] == ["policy", "environment"] * 2 + ["policy"]
    assert trace.rewrites == 0
    assert tokenizer.decode(trace.prompt_ids) == tokenizer.apply_chat_template(
        messages[:1], add_generation_prompt=True, tokenize=False
    )
    env = trace.segments[1]
    assert tokenizer.decode(trace.response_ids[env.start : env.end]).startswith(
        "\n<|im_start|>user\nWhat is 10+4?<|im_end|>"
    )


def test_a_reply_cut_by_max_tokens_is_closed_by_template_tokens(
    gateway: PolicyGateway, tokenizer: Any
) -> None:
    policy = gateway.open("cut")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 3+4?"}]
    reply = policy.chat(messages, temperature=1.0, max_tokens=1)
    assert reply["choices"][0]["finish_reason"] == "length"
    messages += [reply["choices"][0]["message"], {"role": "user", "content": "Again?"}]
    policy.chat(messages, temperature=1.0, max_tokens=4)
    trace = gateway.take("cut")
    assert_well_formed(trace)
    env = trace.segments[1]
    assert tokenizer.decode(trace.response_ids[env.start : env.end]).startswith(
        "<|im_end|>\n<|im_start|>user"
    )


def test_a_rewritten_history_starts_a_new_segment_and_is_counted(
    gateway: PolicyGateway, tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    policy = gateway.open("rewrite")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 3+4?"}]
    reply = policy.chat(messages, temperature=1.0, max_tokens=8)
    rewritten = [
        *messages,
        {"role": "assistant", "content": "I changed this"},
        {"role": "user", "content": "ok?"},
    ]
    with caplog.at_level(logging.WARNING, logger="plugtune.gateway"):
        policy.chat(rewritten, temperature=1.0, max_tokens=8)
    assert "rewrote its history" in caplog.text
    trace = gateway.take("rewrite")
    assert_well_formed(trace)
    assert trace.rewrites == 1
    assert [s.source for s in trace.segments] == ["environment", "policy"]
    fresh = encode(
        tokenizer, tokenizer.apply_chat_template(rewritten, add_generation_prompt=True, tokenize=False)
    )
    assert (trace.prompt_ids + trace.response_ids)[: len(fresh)] == fresh
    assert reply["choices"][0]["message"]["content"] != "I changed this"
    assert trace.messages[:3] == rewritten


def test_segments_carry_the_policy_version(gateway: PolicyGateway) -> None:
    policy = gateway.open("versions")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 3+4?"}]
    reply = policy.chat(messages, temperature=1.0, max_tokens=4)
    with gateway.weights_lock:
        gateway.set_policy_version(3)
    messages += [reply["choices"][0]["message"], {"role": "user", "content": "1+1?"}]
    second = policy.chat(messages, temperature=1.0, max_tokens=4)
    assert second["system_fingerprint"] == "policy-v3"
    trace = gateway.take("versions")
    assert [s.policy_version for s in trace.segments] == [0, 3, 3]
    gateway.set_policy_version(0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_recorded_logprobs_match_a_fresh_forward_pass(
    gateway: PolicyGateway, demo_model: Any, temperature: float
) -> None:
    questions = ["What is 3+4?", "Compute 41+38.", "1+1=?", "What is 12 + 19?", "7+8=?"]
    policies = [gateway.open(f"logp-{i}") for i in range(len(questions))]

    def ask(i: int) -> dict[str, Any]:
        messages = [{"role": "user", "content": questions[i]}]
        return policies[i].chat(messages, temperature=temperature, max_tokens=8, logprobs=True)

    with concurrent.futures.ThreadPoolExecutor(len(policies)) as pool:
        replies = list(pool.map(ask, range(len(questions))))
    for i, reply in enumerate(replies):
        trace = gateway.take(f"logp-{i}")
        ids = torch.tensor([trace.prompt_ids + trace.response_ids])
        with torch.no_grad():
            logps_TV = torch.log_softmax(demo_model(input_ids=ids).logits[0, :-1].float() / temperature, -1)
        fresh_T = logps_TV.gather(-1, ids[0, 1:, None])[:, 0][len(trace.prompt_ids) - 1 :]
        recorded_T = torch.tensor(trace.response_logprobs)
        assert torch.allclose(fresh_T, recorded_T, atol=1e-4), (fresh_T, recorded_T)
        returned = [entry["logprob"] for entry in reply["choices"][0]["logprobs"]["content"]]
        assert returned == trace.response_logprobs


def test_a_stop_string_ends_the_reply_and_the_next_turn_closes_it(
    scripted: tuple[PolicyGateway, ScriptedModel], tokenizer: Any
) -> None:
    gw, model = scripted
    model.scripts += [encode(tokenizer, "12 apples and more"), encode(tokenizer, "5")]
    policy = gw.open("stop")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 3+9?"}]
    reply = policy.chat(messages, temperature=0.0, stop=[" app", "zzz"], max_tokens=30)
    assert reply["choices"][0]["message"]["content"] == "12"
    assert reply["choices"][0]["finish_reason"] == "stop"
    messages += [reply["choices"][0]["message"], {"role": "user", "content": "And 2+3?"}]
    policy.chat(messages, temperature=0.0)
    trace = gw.take("stop")
    assert_well_formed(trace)
    first = trace.response_ids[trace.segments[0].start : trace.segments[0].end]
    assert tokenizer.decode(first) == "12 app"  # the sampled stop string stays in the record
    env = trace.segments[1]
    assert tokenizer.decode(trace.response_ids[env.start : env.end]).startswith(
        "<|im_end|>\n<|im_start|>user"
    )
    assert trace.rewrites == 0


def test_changing_the_tools_is_a_rewrite(gateway: PolicyGateway) -> None:
    policy = gateway.open("tools-changed")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 3+4?"}]
    reply = policy.chat(messages, temperature=1.0, max_tokens=4)
    messages += [reply["choices"][0]["message"], {"role": "user", "content": "1+1?"}]
    policy.chat(messages, tools=TOOLS, temperature=1.0, max_tokens=4)
    trace = gateway.take("tools-changed")
    assert_well_formed(trace)
    assert trace.rewrites == 1
