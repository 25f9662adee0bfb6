"""A corpus of hostile requests to the real policy gateway: each is a clear 4xx in OpenAI's error shape,
never a 500 or a hang, and the same trajectory's key still gets a normal answer right after it."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from plugtune.gateway import JobSampling, PolicyGateway
from plugtune.sdk import Policy

ASK = [{"role": "user", "content": "What is 3+4?"}]
JSON = {"content-type": "application/json"}


def _chat(**fields: Any) -> bytes:
    return json.dumps({"model": "policy", "messages": ASK, **fields}).encode()


HOSTILE = {
    "malformed JSON": (b'{"model": "policy", "messages": [', JSON),
    "not an object": (b'["policy"]', JSON),
    "invalid UTF-8": (b'{"model": "policy", "messages": [{"role": "user", "content": "\xff\xfe"}]}', JSON),
    "nested 100k deep": (b"[" * 100_000 + b"]" * 100_000, JSON),
    "17 MiB body": (b'{"model": "policy", "pad": "' + b"x" * (17 << 20) + b'"}', JSON),
    "10 MB message": (
        json.dumps(
            {"model": "policy", "messages": [{"role": "user", "content": "hello " * ((10 << 20) // 6)}]}
        ).encode(),
        JSON,
    ),
    "huge max_tokens": (_chat(max_tokens=10**30), JSON),
    "huge max_completion_tokens": (_chat(max_completion_tokens=2**40), JSON),
    "max_tokens as a float": (_chat(max_tokens=1e400), JSON),
    "absurd seed": (_chat(seed=10**30), JSON),
    "absurd n": (_chat(n=10**30), JSON),
    "negative temperature": (_chat(temperature=-1), JSON),
    "no messages": (_chat(messages=[]), JSON),
    "unknown role": (_chat(messages=[{"role": "root", "content": "x"}]), JSON),
    "messages not a list": (_chat(messages="hi"), JSON),
    "form content type": (b"model=policy&messages=hi", {"content-type": "application/x-www-form-urlencoded"}),
    "text content type": (_chat(), {"content-type": "text/plain"}),
}


@pytest.fixture(scope="module")
def job_gateway(demo_model: Any, tokenizer: Any) -> Iterator[PolicyGateway]:
    with PolicyGateway(demo_model, tokenizer, sampling=JobSampling(1.0, 1.0, 8)) as gw:
        yield gw


def _post(
    policy: Policy, body: bytes, headers: dict[str, str], path: str = "/v1/chat/completions"
) -> tuple[int, dict[str, Any]]:
    url = urlsplit(policy.base_url)
    # 20 s bounds a hang: the 10 MB message used to hold the gateway's one thread for ~45 s.
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=20)
    try:
        connection.request(
            "POST", path, body=body, headers={**headers, "authorization": f"Bearer {policy.api_key}"}
        )
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read())
    except (BrokenPipeError, ConnectionResetError):  # refused before the whole body was sent
        return 413, {"error": {"message": "the connection was closed on an oversized body"}}
    finally:
        connection.close()


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_requests_are_clear_4xx_and_the_gateway_still_serves(
    job_gateway: PolicyGateway, case: str
) -> None:
    body, headers = HOSTILE[case]
    policy = job_gateway.open(f"hostile-{case}")
    status, answer = _post(policy, body, headers)
    assert 400 <= status < 500, (case, status, answer)
    assert len(answer["error"]["message"]) > 10 and answer["error"]["type"] == "invalid_request_error"
    status, answer = _post(policy, _chat(), JSON)
    assert status == 200 and answer["choices"][0]["message"]["role"] == "assistant"
    job_gateway.take(f"hostile-{case}")


def test_the_refusals_name_what_to_fix(job_gateway: PolicyGateway) -> None:
    policy = job_gateway.open("named")
    expected = {
        "17 MiB body": (413, "at most 16777216 bytes"),
        "10 MB message": (400, "maximum context length"),
        "huge max_tokens": (400, "max_tokens"),
        "absurd seed": (400, "seed"),
        "text content type": (415, "application/json"),
        "nested 100k deep": (400, "nested too deeply"),
        "invalid UTF-8": (400, "UTF-8"),
    }
    for case, (status, words) in expected.items():
        got, answer = _post(policy, *HOSTILE[case])
        assert got == status and words in answer["error"]["message"], (case, got, answer)
    job_gateway.take("named")
