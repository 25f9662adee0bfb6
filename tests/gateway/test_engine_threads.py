"""How many intra-op threads the generation engine decodes on by default: by the model's size."""

from __future__ import annotations

import torch
import transformers

from plugtune.gateway.engine import SMALL_MODEL_BYTES, decoding_threads
from tests.gateway.test_decoding import tiny


def test_a_small_model_decodes_on_one_thread_and_a_large_one_on_the_callers_count() -> None:
    assert decoding_threads(tiny("llama")) == 1
    config = transformers.LlamaConfig(
        vocab_size=32_000, hidden_size=576, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4
    )
    large = transformers.LlamaForCausalLM(config)  # its embedding alone is ~70 MiB
    assert sum(p.numel() * p.element_size() for p in large.parameters()) > SMALL_MODEL_BYTES
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert decoding_threads(large) == 2
    finally:
        torch.set_num_threads(before)
