"""The token gateway in front of an engine's token-in/token-out generation (verl's shape)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from plugtune.gateway.engine import SamplingParams
from plugtune.integrations.token_gateway import TokenGateway, TokenReply

DEMO_MODEL = Path(__file__).parents[2] / "plugtune" / "demo" / "model"


@pytest.fixture()
def engine_loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def test_an_engine_reply_past_its_end_of_sequence_is_cut_there_and_recorded_as_sampled(
    engine_loop: asyncio.AbstractEventLoop,
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(DEMO_MODEL), local_files_only=True)
    words = tokenizer("hello there", add_special_tokens=False)["input_ids"]
    eos = int(tokenizer.eos_token_id)
    seen: list[list[int]] = []

    async def generate(prompt_ids: list[int], params: SamplingParams) -> TokenReply:
        seen.append(prompt_ids)  # an engine that keeps going after its end-of-sequence token
        tokens = [*words, eos, *words]
        return TokenReply(tokens, [-0.5] * len(tokens))

    gateway = TokenGateway(tokenizer, generate, engine_loop)
    gateway.start()
    try:
        policy = gateway.open("t-1")
        reply = policy.chat([{"role": "user", "content": "hi"}], max_tokens=16)
        trace = gateway.take("t-1")
    finally:
        gateway.stop()
    assert policy.content(reply) == "hello there"
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert trace.prompt_ids == seen[0]
    assert trace.response_ids == [*words, eos] and trace.response_mask == [1] * (len(words) + 1)
    assert trace.response_logprobs == [-0.5] * (len(words) + 1)
