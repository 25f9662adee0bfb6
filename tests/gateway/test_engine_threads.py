"""How many intra-op threads the generation engine decodes on: by the model's size, and for a large
model per batch by measurement; how long it gathers a burst: by the last batch's decode time."""

from __future__ import annotations

import threading

import pytest
import torch
import transformers

from plugtune.gateway import GenerationEngine, SamplingParams
from plugtune.gateway.engine import (
    AUTO_THREADS,
    GAP_SHARE,
    SMALL_MODEL_BYTES,
    WINDOW_SHARE,
    ThreadChoice,
    decoding_threads,
    gather_waits,
)
from tests.gateway.test_decoding import tiny


def _large() -> transformers.LlamaForCausalLM:
    config = transformers.LlamaConfig(
        vocab_size=32_000, hidden_size=576, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)  # its embedding alone is ~70 MiB
    model.eval()
    return model


def test_a_small_model_decodes_on_one_thread_and_a_large_one_on_the_callers_count() -> None:
    assert decoding_threads(tiny("llama")) == 1
    large = _large()
    assert sum(p.numel() * p.element_size() for p in large.parameters()) > SMALL_MODEL_BYTES
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert decoding_threads(large) == 2
    finally:
        torch.set_num_threads(before)


def test_a_batch_probes_both_thread_counts_then_keeps_the_faster_one() -> None:
    choice = ThreadChoice(most=2, probe_steps=2)
    for times in ({1: 0.30, 2: 0.10}, {1: 0.10, 2: 0.45}):  # an idle machine, then a loaded one
        choice.start_batch()
        probed = [choice.threads(i) for i in range(4)]
        assert probed == [1, 2, 1, 2]
        for i, n in enumerate(probed):
            choice.record(n, times[n] + 0.01 * i)
        assert {choice.threads(i) for i in range(4, 40)} == {min(times, key=lambda n: times[n])}
    assert choice.chosen == {1: 1, 2: 1}
    single = ThreadChoice(most=1)
    assert [single.threads(i) for i in range(6)] == [1] * 6 and single.chosen == {1: 0}


def test_gathering_waits_longer_only_after_a_long_batch() -> None:
    assert gather_waits(0.005, 0.05, 0.0) == (0.005, 0.05)  # the demo model: as configured
    assert gather_waits(0.005, 0.05, 0.015) == (0.005, 0.05)
    gap, window = gather_waits(0.005, 0.05, 12.0)  # a large model's batch on a loaded machine
    assert gap == pytest.approx(12.0 * GAP_SHARE) and window == pytest.approx(12.0 * WINDOW_SHARE)
    assert window <= 0.05 * 12.0  # a few percent of a batch, never a second batch's worth


def test_a_large_model_decodes_the_same_tokens_whichever_thread_count_it_picks() -> None:
    model = _large()
    before = torch.get_num_threads()
    replies: dict[str, list[list[int]]] = {}
    try:
        torch.set_num_threads(2)
        for name, threads in (("auto", AUTO_THREADS), ("fixed", 1)):
            engine = GenerationEngine(
                model,
                eos_token_ids=set(),
                decode=lambda ids: " ".join(map(str, ids)),
                weights_lock=threading.Lock(),
                policy_version=lambda: 0,
                threads=threads,
            )
            engine.start()
            try:
                params = SamplingParams(max_tokens=8, temperature=0.0)
                futures = [engine.submit([5, 6, 7 + i], params) for i in range(3)]
                replies[name] = [f.result(timeout=120).token_ids for f in futures]
                if name == "auto":
                    assert engine.thread_choice.counts == [1, 2]
                    assert sum(engine.thread_choice.chosen.values()) == engine.batches_run
            finally:
                engine.stop()
    finally:
        torch.set_num_threads(before)
    assert replies["auto"] == replies["fixed"] and all(len(r) == 8 for r in replies["auto"])
