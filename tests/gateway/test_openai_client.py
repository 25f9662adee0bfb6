from __future__ import annotations

import asyncio
import copy
import re
from typing import Any

import httpx
import openai
import pytest

from plugtune.errors import PlatformError
from plugtune.gateway import PolicyGateway

QUESTION = [{"role": "user", "content": "What is 3+4?"}]


def test_sync_client_gets_a_chat_completion_with_usage(gateway: PolicyGateway) -> None:
    policy = gateway.open("sync")
    reply = policy.openai().chat.completions.create(
        model=policy.model, messages=QUESTION, temperature=0.0, max_tokens=8
    )
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and reply.model == "policy"
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "stop"
    trace = gateway.take("sync")
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(trace.prompt_ids)
    assert reply.usage.completion_tokens == len(trace.response_ids) == sum(trace.response_mask)
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_models_lists_the_policy(gateway: PolicyGateway) -> None:
    policy = gateway.open("models")
    assert [m.id for m in policy.openai().models.list()] == ["policy"]
    gateway.take("models")


def test_stdlib_chat_of_the_sdk_works(gateway: PolicyGateway) -> None:
    policy = gateway.open("stdlib")
    reply = policy.chat(QUESTION, temperature=0.0, max_tokens=8)
    assert policy.content(reply) and reply["usage"]["completion_tokens"] >= 1
    gateway.take("stdlib")


async def test_async_client_and_concurrent_requests_are_batched(gateway: PolicyGateway) -> None:
    policies = [gateway.open(f"async-{i}") for i in range(8)]
    before = gateway.engine.batches_run

    async def ask(policy: Any, i: int) -> Any:
        client = policy.async_openai()
        messages = [{"role": "user", "content": f"What is {i}+{2 * i}?"}]
        return await client.chat.completions.create(
            model=policy.model, messages=messages, temperature=1.0, seed=i, max_tokens=6
        )

    replies = await asyncio.gather(*(ask(p, i) for i, p in enumerate(policies)))
    assert all(r.choices[0].finish_reason in ("stop", "length") for r in replies)
    ids = {r.id for r in replies}  # OpenAI's shape: chatcmpl- and 24 hex digits, unique per reply
    assert len(ids) == len(replies) and all(re.fullmatch(r"chatcmpl-[0-9a-f]{24}", i) for i in ids)
    assert gateway.engine.batches_run - before < len(policies)
    for i in range(8):
        trace = gateway.take(f"async-{i}")
        assert len(trace.response_ids) == replies[i].usage.completion_tokens


def test_a_seed_reproduces_the_sample(gateway: PolicyGateway) -> None:
    texts = []
    for i in range(2):
        policy = gateway.open(f"seed-{i}")
        reply = policy.chat(QUESTION, temperature=1.0, seed=123, max_tokens=8)
        texts.append((policy.content(reply), gateway.take(f"seed-{i}").response_ids))
    assert texts[0] == texts[1]


def test_unknown_missing_and_finished_keys_are_401(gateway: PolicyGateway) -> None:
    client = openai.OpenAI(base_url=gateway.base_url, api_key="not-a-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as err:
        client.chat.completions.create(model="policy", messages=QUESTION)
    assert err.value.status_code == 401 and err.value.code == "invalid_api_key"
    response = httpx.post(
        gateway.base_url + "/chat/completions", json={"model": "policy", "messages": QUESTION}
    )
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    policy = gateway.open("finished")
    gateway.take("finished")
    with pytest.raises(openai.AuthenticationError):
        policy.openai().chat.completions.create(model="policy", messages=QUESTION)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "policy"}, "messages"),
        ({"model": "policy", "messages": []}, "messages"),
        ({"model": "policy", "messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
        ({"model": "policy", "messages": QUESTION, "temperature": 5}, "temperature"),
        ({"model": "policy", "messages": QUESTION, "top_p": 0}, "top_p"),
        ({"model": "policy", "messages": QUESTION, "max_tokens": 0}, "max_tokens"),
        ({"model": "policy", "messages": QUESTION, "n": 2}, "n"),
        ({"model": "policy", "messages": QUESTION, "stream": True}, "stream"),
        ({"model": "policy", "messages": QUESTION, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"model": "policy", "messages": QUESTION, "tools": [{"type": "function"}]}, "tools"),
    ],
)
def test_bad_requests_are_openai_shaped_400s(
    gateway: PolicyGateway, body: dict[str, Any], param: str
) -> None:
    policy = gateway.open("bad")
    response = httpx.post(
        gateway.base_url + "/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {policy.api_key}"},
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]
    assert gateway.take("bad").prompt_ids == []


def test_bad_requests_through_the_client(gateway: PolicyGateway) -> None:
    policy = gateway.open("bad-client")
    client = policy.openai()
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="policy", messages=QUESTION, temperature=3.0)
    assert err.value.param == "temperature"
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4o", messages=QUESTION)
    assert missing.value.code == "model_not_found"
    response = httpx.post(
        gateway.base_url + "/chat/completions",
        content=b"{not json",
        headers={"Authorization": f"Bearer {policy.api_key}", "Content-Type": "application/json"},
    )
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]
    long_question = [{"role": "user", "content": "1+" * 1000}]
    with pytest.raises(openai.BadRequestError) as too_long:
        client.chat.completions.create(model="policy", messages=long_question)
    assert too_long.value.code == "context_length_exceeded"
    gateway.take("bad-client")


def test_a_failing_model_is_a_500_and_the_gateway_keeps_serving(
    scripted: tuple[PolicyGateway, Any], tokenizer: Any
) -> None:
    gw, model = scripted
    model.scripts.append("explode")  # not a token list: the forward pass raises
    policy = gw.open("boom")
    with pytest.raises(openai.InternalServerError) as err:
        policy.openai().chat.completions.create(model="policy", messages=QUESTION, temperature=0.0)
    assert err.value.status_code == 500 and "TypeError" in err.value.message
    model.scripts.append(tokenizer("12", add_special_tokens=False)["input_ids"])
    reply = policy.chat(QUESTION, temperature=0.0)
    assert policy.content(reply) == "12"
    trace = gw.take("boom")
    assert trace.rewrites == 0 and [s.source for s in trace.segments] == ["policy"]

    # A failed call followed by a longer conversation: the record is rebuilt from tokens, intact.
    model.scripts += ["explode", tokenizer("5", add_special_tokens=False)["input_ids"]]
    policy = gw.open("boom-2")
    with pytest.raises(openai.InternalServerError):
        policy.openai().chat.completions.create(model="policy", messages=QUESTION, temperature=0.0)
    longer = [*QUESTION, {"role": "assistant", "content": "7"}, {"role": "user", "content": "2+3?"}]
    policy.chat(longer, temperature=0.0)
    trace = gw.take("boom-2")
    rendered = tokenizer.apply_chat_template(longer, add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(trace.prompt_ids + trace.response_ids) == rendered + "5<|im_end|>"


def test_unknown_routes_and_methods_answer_in_the_openai_shape(gateway: PolicyGateway) -> None:
    missing = httpx.get(gateway.base_url + "/completions/nothing")
    assert missing.status_code == 404 and set(missing.json()["error"]) == {"message", "type", "param", "code"}
    wrong_method = httpx.get(gateway.base_url + "/chat/completions")
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["message"]


def test_a_busy_port_and_a_tokenizer_without_template_are_clear_errors(
    gateway: PolicyGateway, demo_model: Any, tokenizer: Any
) -> None:
    with pytest.raises(PlatformError, match="cannot listen"):
        PolicyGateway(demo_model, tokenizer, port=gateway.port).start()
    bare = copy.deepcopy(tokenizer)
    bare.chat_template = None
    with pytest.raises(ValueError, match="chat_template"):
        PolicyGateway(demo_model, bare)
