from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from plugtune.jobs.builtin_rollout import single_turn
from plugtune.sdk import Context, Kind, Policy, Sample, Sampling, spec_of
from plugtune.spec.models import BUILTIN_ROLLOUT, parse_entry


@dataclass(frozen=True)
class RecordingPolicy(Policy):
    calls: list[tuple[list[dict[str, Any]], dict[str, Any]]] = field(default_factory=list)

    def chat(self, messages: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
        self.calls.append((messages, params))
        return {"choices": [{"message": {"role": "assistant", "content": "7"}}]}

    async def achat(self, messages: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
        return self.chat(messages, **params)


async def test_builtin_rollout_asks_once_with_the_sampling_settings() -> None:
    ref = parse_entry(BUILTIN_ROLLOUT)
    assert ref.module == single_turn.__module__ and ref.function == single_turn.__name__
    spec = spec_of(single_turn)
    assert spec is not None and spec.kind is Kind.ROLLOUT and spec.is_async
    policy = RecordingPolicy(base_url="http://unused", api_key="k")
    messages = [{"role": "user", "content": "What is 3+4?"}]
    sample = Sample(messages=messages, sampling=Sampling(temperature=0.7, top_p=0.9, max_tokens=16))
    assert await single_turn(Context(), policy, sample) is None
    assert policy.calls == [(messages, {"temperature": 0.7, "top_p": 0.9, "max_tokens": 16})]
