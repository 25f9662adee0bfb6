"""The gateway samples with the job's settings: omitted ones are filled in, contradicting ones are 400s."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import torch

from plugtune.gateway import JobSampling, PolicyGateway

from .conftest import ScriptedModel, encode

QUESTION = [{"role": "user", "content": "What is 3+4?"}]
JOB = JobSampling(temperature=0.5, top_p=1.0, max_new_tokens=6)


@pytest.fixture(scope="module")
def job_gateway(demo_model: Any, tokenizer: Any) -> Iterator[PolicyGateway]:
    with PolicyGateway(demo_model, tokenizer, sampling=JOB) as gw:
        yield gw


def sampled_logprobs(model: Any, prompt: list[int], response: list[int], temperature: float) -> list[float]:
    """Log-probs of ``response`` after ``prompt`` under the model at ``temperature``, recomputed."""
    with torch.no_grad():
        logits_TV = model(input_ids=torch.tensor([prompt + response])).logits[0].float()
    logps_TV = torch.log_softmax(logits_TV[len(prompt) - 1 : -1] / temperature, -1)
    return logps_TV.gather(-1, torch.tensor(response)[:, None])[:, 0].tolist()


def test_a_request_without_temperature_samples_at_the_jobs(
    job_gateway: PolicyGateway, demo_model: Any
) -> None:
    policy = job_gateway.open("omits")
    client = policy.openai()
    for i in range(4):  # a rollout that passes no sampling settings at all, several calls
        client.chat.completions.create(
            model=policy.model, messages=[{"role": "user", "content": f"{i}+{i}?"}]
        )
        trace = job_gateway.take("omits")
        assert set(trace.response_mask) == {1}
        at_job = sampled_logprobs(demo_model, trace.prompt_ids, trace.response_ids, JOB.temperature)
        at_default = sampled_logprobs(demo_model, trace.prompt_ids, trace.response_ids, 1.0)
        assert trace.response_logprobs == pytest.approx(at_job, abs=1e-4)
        assert max(abs(a - b) for a, b in zip(at_default, trace.response_logprobs, strict=True)) > 1e-2
        policy = job_gateway.open("omits")
        client = policy.openai()
    job_gateway.take("omits")


def test_replies_never_exceed_max_new_tokens(demo_model: Any, tokenizer: Any) -> None:
    long_reply = encode(tokenizer, "one two three four five six seven eight nine ten eleven twelve")
    assert len(long_reply) > JOB.max_new_tokens
    model = ScriptedModel(demo_model, tokenizer.eos_token_id, [long_reply] * 3)
    with PolicyGateway(model, tokenizer, sampling=JOB) as gw:
        policy = gw.open("long")
        client = policy.openai()
        reply = client.chat.completions.create(model=policy.model, messages=QUESTION)
        assert reply.usage is not None and reply.usage.completion_tokens == JOB.max_new_tokens
        assert reply.choices[0].finish_reason == "length"
        assert len(gw.take("long").response_ids) == JOB.max_new_tokens
        policy = gw.open("shorter")
        shorter = policy.openai().chat.completions.create(model=policy.model, messages=QUESTION, max_tokens=3)
        assert shorter.usage is not None and shorter.usage.completion_tokens == 3  # fewer is fine
        assert len(gw.take("shorter").response_ids) == 3


@pytest.mark.parametrize(
    ("asked", "param", "named"),
    [
        ({"max_tokens": 7}, "max_tokens", ["max_tokens=7", "hyperparameters.max_new_tokens=6"]),
        ({"max_completion_tokens": 64}, "max_completion_tokens", ["max_completion_tokens=64", "=6"]),
        ({"temperature": 1.0}, "temperature", ["temperature=1", "hyperparameters.temperature=0.5"]),
        ({"temperature": 0.0}, "temperature", ["temperature=0 ", "hyperparameters.temperature=0.5"]),
        ({"top_p": 0.9}, "top_p", ["top_p=0.9", "hyperparameters.top_p=1"]),
    ],
)
def test_a_request_contradicting_the_job_is_a_clear_400(
    job_gateway: PolicyGateway, asked: dict[str, Any], param: str, named: list[str]
) -> None:
    policy = job_gateway.open("conflict")
    with pytest.raises(openai.BadRequestError) as err:
        policy.openai().chat.completions.create(model=policy.model, messages=QUESTION, **asked)
    assert err.value.status_code == 400 and err.value.param == param
    assert err.value.code == "sampling_conflict"
    message = err.value.message
    assert all(text in message for text in named), message
    assert f"Omit {param}" in message  # what to do
    assert job_gateway.take("conflict").prompt_ids == []  # nothing was recorded


def test_the_jobs_own_values_are_accepted(job_gateway: PolicyGateway) -> None:
    policy = job_gateway.open("same")
    reply = policy.chat(QUESTION, temperature=0.5, top_p=1.0, max_tokens=6)
    assert reply["usage"]["completion_tokens"] <= 6
    job_gateway.take("same")


def test_n_above_one_points_to_group_size(gateway: PolicyGateway) -> None:
    policy = gateway.open("n")
    with pytest.raises(openai.BadRequestError) as err:
        policy.openai().chat.completions.create(model=policy.model, messages=QUESTION, n=4)
    assert err.value.param == "n"
    assert "one completion per call" in err.value.message
    assert "hyperparameters.group_size" in err.value.message
    gateway.take("n")


@pytest.mark.parametrize(
    "asked", [{"frequency_penalty": 0.5}, {"presence_penalty": -1.0}, {"logit_bias": {"5": 3}}]
)
def test_penalties_the_gateway_would_ignore_are_refused(
    gateway: PolicyGateway, asked: dict[str, Any]
) -> None:
    policy = gateway.open("penalty")
    with pytest.raises(openai.BadRequestError) as err:
        policy.openai().chat.completions.create(model=policy.model, messages=QUESTION, **asked)
    assert err.value.param == next(iter(asked))
    gateway.take("penalty")


def test_top_logprobs_come_from_the_sampling_distribution(gateway: PolicyGateway) -> None:
    policy = gateway.open("top")
    client = policy.openai()
    reply = client.chat.completions.create(
        model=policy.model, messages=QUESTION, temperature=0.0, max_tokens=5, logprobs=True, top_logprobs=3
    )
    content = reply.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content and len(content) == reply.usage.completion_tokens  # type: ignore[union-attr]
    for entry in content:
        top = entry.top_logprobs
        assert len(top) == 3
        assert [t.logprob for t in top] == sorted((t.logprob for t in top), reverse=True)
        assert top[0].token == entry.token and top[0].logprob == entry.logprob  # greedy: the best one
        assert sum(math.exp(t.logprob) for t in top) <= 1.0 + 1e-6
        assert top[0].bytes == list(top[0].token.encode())
    sampled = client.chat.completions.create(
        model=policy.model,
        messages=QUESTION,
        temperature=1.0,
        top_p=0.3,
        max_tokens=4,
        logprobs=True,
        top_logprobs=5,
    )
    for entry in sampled.choices[0].logprobs.content:  # type: ignore[union-attr]
        # top-p leaves few candidates: those it rules out (probability 0) are not listed
        assert 1 <= len(entry.top_logprobs) <= 5 and all(math.isfinite(t.logprob) for t in entry.top_logprobs)
        assert entry.token in {t.token for t in entry.top_logprobs}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=policy.model, messages=QUESTION, top_logprobs=2)
    assert err.value.param == "top_logprobs"
    gateway.take("top")
