from __future__ import annotations

import copy
import math
import threading
from typing import Any

import pytest
import torch

from plugtune.gateway import GenerationEngine, SamplingParams
from plugtune.gateway.engine import sample_batch, top_p_logps

from .conftest import encode


def make_engine(model: Any, tokenizer: Any, max_batch_size: int = 64, **options: Any) -> GenerationEngine:
    engine = GenerationEngine(
        model,
        eos_token_ids={tokenizer.eos_token_id},
        decode=lambda ids: tokenizer.decode(ids),
        weights_lock=threading.Lock(),
        policy_version=lambda: 7,
        pad_token_id=tokenizer.pad_token_id,
        max_batch_size=max_batch_size,
        **options,
    )
    engine.start()
    return engine


def prompt(tokenizer: Any, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return encode(tokenizer, text)


def test_top_p_keeps_the_smallest_set_reaching_p_and_renormalises() -> None:
    logps_V = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept_V = top_p_logps(logps_V, 0.75).exp()
    assert torch.allclose(kept_V, torch.tensor([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0]))
    assert top_p_logps(logps_V, 0.1).exp()[0] == 1.0  # the top token is always kept


def test_sampled_logprobs_are_under_the_tempered_distribution_and_seeds_reproduce() -> None:
    logits_BV = torch.tensor([[2.0, 1.0, 0.0, -1.0]] * 3)
    params = [
        SamplingParams(max_tokens=1, temperature=0.5, seed=3),
        SamplingParams(max_tokens=1, temperature=0.0),
        SamplingParams(max_tokens=1, temperature=1.0, top_p=0.5),
    ]

    def draw() -> tuple[list[int], list[float], list[list[tuple[int, float]]]]:
        generators = [torch.Generator().manual_seed(3), None, None]
        return sample_batch(logits_BV, params, generators, torch.Generator().manual_seed(0))

    tokens, logps, _ = draw()
    assert math.isclose(logps[0], float(torch.log_softmax(logits_BV[0] / 0.5, -1)[tokens[0]]), rel_tol=1e-6)
    assert tokens[1] == 0 and math.isclose(
        logps[1], float(torch.log_softmax(logits_BV[1], -1)[0]), rel_tol=1e-6
    )
    assert tokens[2] == 0 and logps[2] == 0.0  # top_p 0.5 keeps only the top token (p = 0.64)
    assert draw()[:2] == (tokens, logps)
    many = [
        sample_batch(logits_BV[:1], params[:1], [None], torch.Generator().manual_seed(i))[0][0]
        for i in range(50)
    ]
    assert len(set(many)) > 1


def test_a_batch_decodes_like_single_requests(demo_model: Any, tokenizer: Any) -> None:
    engine = make_engine(demo_model, tokenizer)
    try:
        questions = ["What is 3+4?", "Compute 41+38.", "1+1=?", "What is 12 + 9?", "5+5=?", "What is 30+3?"]
        prompts = [prompt(tokenizer, q) for q in questions]
        params = [
            SamplingParams(max_tokens=6, temperature=0.0),
            SamplingParams(max_tokens=1, temperature=1.0, seed=1),
            SamplingParams(max_tokens=12, temperature=1.5, seed=2),
            SamplingParams(max_tokens=12, temperature=1.5, seed=3),
            SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=4),
            SamplingParams(max_tokens=3, temperature=1.0, seed=5, stop=("1",)),
        ]
        alone = [engine.submit(p, sp).result(timeout=60) for p, sp in zip(prompts, params, strict=True)]
        before = engine.batches_run
        futures = [engine.submit(p, sp) for p, sp in zip(prompts, params, strict=True)]
        together = [f.result(timeout=60) for f in futures]
        assert engine.batches_run - before < len(prompts)
        assert max(g.batch_size for g in together) > 1
        assert len({len(g.token_ids) for g in together}) > 1  # rows left the batch at different steps
        for a, b in zip(alone, together, strict=True):
            assert a.token_ids == b.token_ids
            assert a.finish_reason == b.finish_reason
            assert a.policy_version == b.policy_version == 7
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
    finally:
        engine.stop()


def test_each_row_stops_on_its_own(demo_model: Any, tokenizer: Any) -> None:
    engine = make_engine(demo_model, tokenizer)
    try:
        p = prompt(tokenizer, "What is 3+4?")
        short = engine.submit(p, SamplingParams(max_tokens=1, temperature=1.0, seed=1))
        full = engine.submit(p, SamplingParams(max_tokens=20, temperature=0.0))
        assert short.result(timeout=60).finish_reason == "length"
        assert len(short.result().token_ids) == 1
        done = full.result(timeout=60)
        assert done.finish_reason == "stop" and done.ended_with_eos
        assert done.token_ids[-1] == tokenizer.eos_token_id
    finally:
        engine.stop()


def test_a_held_weights_lock_holds_generation_back(demo_model: Any, tokenizer: Any) -> None:
    engine = make_engine(demo_model, tokenizer)
    try:
        with engine._lock:  # what the trainer does while it updates the weights
            future = engine.submit(prompt(tokenizer, "1+1=?"), SamplingParams(max_tokens=4, temperature=0.0))
            assert not future.done()
            threading.Event().wait(0.2)
            assert not future.done()
        assert future.result(timeout=60).token_ids
    finally:
        engine.stop()


def test_a_request_cancelled_while_queued_is_skipped(demo_model: Any, tokenizer: Any) -> None:
    engine = make_engine(demo_model, tokenizer)
    try:
        p = prompt(tokenizer, "1+1=?")
        greedy = SamplingParams(max_tokens=4, temperature=0.0)
        with engine._lock:
            first = engine.submit(p, greedy)
            threading.Event().wait(0.3)  # the worker now holds `first` and waits for the lock
            cancelled = engine.submit(p, greedy)
            assert cancelled.cancel()
            kept = engine.submit(p, greedy)
        assert first.result(timeout=60).token_ids == kept.result(timeout=60).token_ids
        assert engine.requests_served == 2
    finally:
        engine.stop()


class CountingModel(torch.nn.Module):
    """The demo model, recording how many rows each prefill (a forward without a cache) had."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config
        self.prefill_rows: list[int] = []

    def forward(self, input_ids: torch.Tensor, **kwargs: Any) -> Any:
        if kwargs.get("cache", kwargs.get("past_key_values")) is None:
            self.prefill_rows.append(input_ids.shape[0])
        return self.inner(input_ids=input_ids, **kwargs)


def test_a_groups_shared_prompt_is_prefilled_once_and_rows_decode_as_if_alone(
    demo_model: Any, tokenizer: Any
) -> None:
    model = CountingModel(demo_model)
    asked = 6
    # A gap this long: only "every open caller has asked" can start the batch in time.
    engine = make_engine(model, tokenizer, batch_gap_s=30.0, batch_window_s=60.0, open_callers=lambda: asked)
    try:
        group = prompt(tokenizer, "What is 21+38?")
        prompts = [group] * 4 + [prompt(tokenizer, "1+1=?")] * 2
        params = [SamplingParams(max_tokens=10, temperature=1.0, seed=s) for s in range(asked)]
        futures = [engine.submit(p, sp) for p, sp in zip(prompts, params, strict=True)]
        together = [f.result(timeout=20) for f in futures]
        assert model.prefill_rows == [2] and {g.batch_size for g in together} == {asked}
        assert len({tuple(g.token_ids) for g in together[:4]}) > 1  # the group's rows sample apart
        asked = 1
        alone = [engine.submit(p, sp).result(timeout=20) for p, sp in zip(prompts, params, strict=True)]
        assert model.prefill_rows == [2] + [1] * 6
        for a, b in zip(alone, together, strict=True):
            assert a.token_ids == b.token_ids
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
        for p, g in zip(prompts, together, strict=True):  # and they are the model's own log-probs
            ids = torch.tensor([p + g.token_ids])
            with torch.no_grad():
                logps_TV = torch.log_softmax(demo_model(input_ids=ids).logits[0, :-1], -1)
            fresh_T = logps_TV.gather(-1, ids[0, 1:, None])[len(p) - 1 :, 0]
            assert torch.allclose(fresh_T, torch.tensor(g.logprobs), atol=1e-4)
    finally:
        engine.stop()


class GatedModel(torch.nn.Module):
    """The demo model that never says end-of-sequence and pauses at its ``gate_at``-th forward."""

    def __init__(self, inner: Any, eos_id: int, gate_at: int) -> None:
        super().__init__()
        self.inner, self.config, self.eos_id, self.gate_at = inner, inner.config, eos_id, gate_at
        self.calls = 0
        self.reached, self.release = threading.Event(), threading.Event()

    def forward(self, input_ids: torch.Tensor, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == self.gate_at:
            self.reached.set()
            self.release.wait(30)
        out = self.inner(input_ids=input_ids, **kwargs)
        out.logits[..., self.eos_id] = -1e9
        return out


def test_a_finished_row_is_answered_while_longer_rows_still_decode(demo_model: Any, tokenizer: Any) -> None:
    model = GatedModel(demo_model, tokenizer.eos_token_id, gate_at=3)
    engine = make_engine(
        model, tokenizer, batch_gap_s=30.0, batch_window_s=60.0, open_callers=lambda: 2, hold_finished_s=0.0
    )
    try:
        p = prompt(tokenizer, "What is 3+4?")
        short = engine.submit(p, SamplingParams(max_tokens=1, temperature=0.0))
        long = engine.submit(p, SamplingParams(max_tokens=6, temperature=0.0))
        assert model.reached.wait(30)
        assert len(short.result(timeout=10).token_ids) == 1 and not long.done()
        model.release.set()
        assert len(long.result(timeout=30).token_ids) == 6
        assert long.result().token_ids[:1] == short.result().token_ids
    finally:
        model.release.set()
        engine.stop()


def test_finished_rows_are_held_back_within_hold_finished_s(demo_model: Any, tokenizer: Any) -> None:
    model = GatedModel(demo_model, tokenizer.eos_token_id, gate_at=3)
    engine = make_engine(
        model, tokenizer, batch_gap_s=30.0, batch_window_s=60.0, open_callers=lambda: 2, hold_finished_s=60.0
    )
    try:
        p = prompt(tokenizer, "What is 3+4?")
        short = engine.submit(p, SamplingParams(max_tokens=1, temperature=0.0))
        long = engine.submit(p, SamplingParams(max_tokens=6, temperature=0.0))
        assert model.reached.wait(30)
        assert not short.done() and not long.done()  # the short row waits for the batch (or the hold)
        model.release.set()
        assert len(short.result(timeout=30).token_ids) == 1 and len(long.result(timeout=30).token_ids) == 6
    finally:
        model.release.set()
        engine.stop()


def test_the_engine_decodes_on_its_own_thread_count_and_leaves_the_callers(
    demo_model: Any, tokenizer: Any
) -> None:
    seen: list[int] = []

    class Probe(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner, self.config = demo_model, demo_model.config

        def forward(self, **kwargs: Any) -> Any:
            seen.append(torch.get_num_threads())
            return self.inner(**kwargs)

    before = torch.get_num_threads()
    engine = make_engine(Probe(), tokenizer)
    try:
        engine.submit(prompt(tokenizer, "1+1=?"), SamplingParams(max_tokens=2, temperature=0.0)).result(60)
    finally:
        engine.stop()
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_ready_made_4d_decode_mask_decodes_as_the_2d_one(
    demo_model: Any, tokenizer: Any, attention: str
) -> None:
    model = copy.deepcopy(demo_model)
    model.config._attn_implementation = attention
    replies, kinds = [], []
    for mask_4d in (True, False):
        engine = make_engine(model, tokenizer, mask_4d=mask_4d, fused=False)
        kinds.append(engine.decoder.mask_4d)  # type: ignore[attr-defined]
        try:
            futures = [
                engine.submit(prompt(tokenizer, q), SamplingParams(max_tokens=6, temperature=0.0))
                for q in ("1+1=?", "What is 12+30? Answer now.")  # different lengths: left padding
            ]
            replies.append([f.result(timeout=60) for f in futures])
        finally:
            engine.stop()
    assert kinds == [attention, None]
    for with_4d, with_2d in zip(*replies, strict=True):
        assert with_4d.token_ids == with_2d.token_ids
        assert with_4d.logprobs == pytest.approx(with_2d.logprobs, abs=1e-4)


def test_decoding_in_inference_mode_leaves_the_model_trainable(demo_model: Any, tokenizer: Any) -> None:
    """The engine decodes under inference_mode; the trainer then updates the same weights in
    place and trains through them, and the next batch decodes from the new weights."""
    model = copy.deepcopy(demo_model)
    engine = make_engine(model, tokenizer)
    greedy = SamplingParams(max_tokens=6, temperature=0.0)
    ask = prompt(tokenizer, "12+30=?")
    try:
        before = engine.submit(ask, greedy).result(timeout=60)
        assert not any(p.is_inference() for p in model.parameters())
        with engine._lock:  # a training step: a backward through the weights, then in-place updates
            logits = model(input_ids=torch.tensor([ask + before.token_ids])).logits
            logits.float().logsumexp(-1).mean().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p), alpha=0.5)
        after = engine.submit(ask, greedy).result(timeout=60)
        assert after.logprobs != before.logprobs  # decoded from the updated weights
    finally:
        engine.stop()
