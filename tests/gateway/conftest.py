from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from plugtune.demo import MODEL_DIR
from plugtune.gateway import PolicyGateway


class ScriptedModel(torch.nn.Module):
    """The demo model with a large logit bias towards scripted replies, one script per batch.

    Every forward pass still runs the real model (so log-probs are real), but greedy decoding
    follows ``scripts[k]`` for the k-th batch, then ends with the end-of-sequence token.
    """

    def __init__(self, inner: Any, eos_id: int, scripts: list[list[int]]) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config
        self.generation_config = inner.generation_config
        self.eos_id = eos_id
        self.scripts = list(scripts)
        self._script: list[int] = []
        self._prefill_width = 0

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs: Any) -> Any:
        out = self.inner(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        if kwargs.get("cache", kwargs.get("past_key_values")) is None:
            self._prefill_width = attention_mask.shape[-1]
            self._script = self.scripts.pop(0) if self.scripts else []
        step = attention_mask.shape[-1] - self._prefill_width  # a 2D or a 4D mask: keys last
        target = self._script[step] if step < len(self._script) else self.eos_id
        out.logits[:, -1, target] += 100.0
        return out


@pytest.fixture(scope="session")
def demo_model() -> Any:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(MODEL_DIR)


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(MODEL_DIR)


@pytest.fixture(scope="module")
def gateway(demo_model: Any, tokenizer: Any) -> Iterator[PolicyGateway]:
    gw = PolicyGateway(demo_model, tokenizer, model_name="policy", max_batch_size=64)
    gw.start()
    try:
        yield gw
    finally:
        gw.stop()


@pytest.fixture
def scripted(demo_model: Any, tokenizer: Any) -> Iterator[tuple[PolicyGateway, ScriptedModel]]:
    """A gateway over a ScriptedModel; append token-id scripts to ``model.scripts``."""
    model = ScriptedModel(demo_model, tokenizer.eos_token_id, [])
    gw = PolicyGateway(model, tokenizer, model_name="policy")
    gw.start()
    try:
        yield gw, model
    finally:
        gw.stop()


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
