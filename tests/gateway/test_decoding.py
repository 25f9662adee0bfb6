"""The fused Llama-family decoder against the model's own forward, and the choice of decoder."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers

from plugtune import llama_family
from plugtune.gateway.decoding import FusedDecoder, HFDecoder, decoder_for

from .test_engine import make_engine, prompt

SMALL = {
    "vocab_size": 97,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 512,
}


def tiny(family: str, **extra: Any) -> Any:
    config_class = {
        "llama": transformers.LlamaConfig,
        "mistral": transformers.MistralConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
    }[family]
    options = {**SMALL, **extra}
    if family == "mistral":
        options.setdefault("sliding_window", None)
    config = config_class(**options)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.eval()
    return model


def reference_logits(model: Any, prompt_ids: list[int], continuation: list[int]) -> torch.Tensor:
    """The model's own next-token logits after each of ``prompt + continuation[:t]``, t = 0..len."""
    ids = torch.tensor([prompt_ids + continuation])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    return logits[len(prompt_ids) - 1 :]


CASES = [
    ("llama", {}),
    ("llama", {"num_key_value_heads": 2}),  # grouped-query attention
    ("mistral", {"num_key_value_heads": 2}),
    ("qwen2", {"num_key_value_heads": 4}),  # biased query/key/value projections
    ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}),
]


@pytest.mark.parametrize(("family", "extra"), CASES)
@pytest.mark.parametrize("fuse", [True, False])
def test_the_fused_decoder_gives_the_models_own_logits(
    family: str, extra: dict[str, Any], fuse: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not fuse:  # as for a model too large to copy its matrices per batch
        monkeypatch.setattr(llama_family, "FUSE_BYTES", 0)
    model = tiny(family, **extra)
    decoder = decoder_for(model, pad_token_id=0)
    assert isinstance(decoder, FusedDecoder) and decoder.fuse is fuse, decoder.description
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]]  # different lengths: left padding
    row_prompt = [0, 0, 1, 0, 1]  # rows share their prompt's prefill
    steps = 70  # past the cache's first 16 new columns, and 32, and 64: it grows thrice
    generator = torch.Generator().manual_seed(1)
    fed = torch.randint(1, 97, (len(row_prompt), steps), generator=generator).tolist()
    live = list(range(len(row_prompt)))
    got: dict[int, list[torch.Tensor]] = {b: [] for b in live}
    with torch.no_grad():
        session = decoder.start(prompts, row_prompt, max_new=steps)
        for t in range(steps):
            for i, b in enumerate(live):
                got[b].append(session.logits[i].clone())
            if t == 3:  # rows 1 and 3 finish: they leave the cache
                keep = [i for i, b in enumerate(live) if b not in (1, 3)]
                session.keep(keep)
                live = [live[i] for i in keep]
            session.step([fed[b][t] for b in live])
    for b, logits in got.items():
        want = reference_logits(model, prompts[row_prompt[b]], fed[b][: len(logits) - 1])
        assert torch.allclose(torch.stack(logits), want, atol=2e-4), f"row {b}"


@pytest.mark.parametrize(
    ("family", "extra", "why"),
    [
        ("qwen3", {}, "not the plain qwen3 layer"),
        ("mistral", {"sliding_window": 16}, "sliding-window"),
        ("llama", {"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ("llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}}, "dynamic"),
    ],
)
def test_models_it_does_not_cover_fall_back_to_their_own_forward_and_say_why(
    family: str, extra: dict[str, Any], why: str
) -> None:
    if family == "qwen3":
        families = (*llama_family.FAMILIES, "qwen3")  # even were qwen3 listed: q_norm
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(llama_family, "FAMILIES", families)
            decoder = decoder_for(tiny(family, **extra), pad_token_id=0)
    else:
        decoder = decoder_for(tiny(family, **extra), pad_token_id=0)
    assert isinstance(decoder, HFDecoder)
    assert why in decoder.description


def test_an_adapted_projection_keeps_the_models_own_forward() -> None:
    class Adapted(torch.nn.Linear):  # as a LoRA layer: more than its .weight
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) + 1.0

    model = tiny("llama")
    old = model.model.layers[1].self_attn.v_proj
    adapted = Adapted(old.in_features, old.out_features, bias=False)
    adapted.weight = old.weight
    model.model.layers[1].self_attn.v_proj = adapted
    decoder = decoder_for(model, pad_token_id=0)
    assert (
        isinstance(decoder, HFDecoder) and "v_proj is Adapted, not a plain nn.Linear" in decoder.description
    )


def test_a_wrapped_model_and_the_switch_choose_the_hf_forward(demo_model: Any) -> None:
    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner, self.config = demo_model, demo_model.config

    assert "not a plain llama" in decoder_for(Wrapper(), 0).description
    assert decoder_for(demo_model, 0, fused=False).description.endswith("(the fused decoder is turned off)")
    assert isinstance(decoder_for(demo_model, 0), FusedDecoder)


def test_the_engine_samples_the_same_replies_on_either_decoder(demo_model: Any, tokenizer: Any) -> None:
    questions = ["1+1=?", "What is 12+30? Answer now.", "What is 7+5?"]
    replies = []
    for fused in (True, False):
        engine = make_engine(demo_model, tokenizer, fused=fused)
        try:
            assert isinstance(engine.decoder, FusedDecoder) is fused
            futures = [
                engine.submit(prompt(tokenizer, q), engine_params(seed))
                for seed, q in enumerate(questions * 3)
            ]
            replies.append([f.result(timeout=60) for f in futures])
        finally:
            engine.stop()
    for fused, plain in zip(*replies, strict=True):
        assert fused.token_ids == plain.token_ids
        assert fused.logprobs == pytest.approx(plain.logprobs, abs=1e-4)


def test_an_optimizer_step_between_batches_is_seen_by_the_next_batch(demo_model: Any, tokenizer: Any) -> None:
    import copy

    model = copy.deepcopy(demo_model)
    engine = make_engine(model, tokenizer)
    ask = prompt(tokenizer, "What is 12+30?")
    try:
        before = engine.submit(ask, engine_params(0)).result(timeout=60)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, fused=True)
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        optimizer.step()  # in place, without bumping the tensors' version counters
        after = engine.submit(ask, engine_params(0)).result(timeout=60)
    finally:
        engine.stop()
    with torch.no_grad():
        ids = torch.tensor([ask + after.token_ids])
        logps = torch.log_softmax(model(input_ids=ids).logits[0, len(ask) - 1 : -1], -1)
    fresh = logps.gather(-1, torch.tensor(after.token_ids)[:, None])[:, 0]
    assert torch.allclose(fresh, torch.tensor(after.logprobs), atol=1e-4)
    assert (before.token_ids, before.logprobs) != (after.token_ids, after.logprobs)


def engine_params(seed: int) -> Any:
    from plugtune.gateway import SamplingParams

    return SamplingParams(max_tokens=8, temperature=1.0, seed=seed)


def test_a_bfloat16_model_decodes_like_its_own_forward() -> None:
    model = tiny("llama", num_key_value_heads=2).to(torch.bfloat16)
    decoder = decoder_for(model, pad_token_id=0)
    assert isinstance(decoder, FusedDecoder)
    prompt_ids, fed = [5, 6, 7, 8], [9, 10, 11]
    with torch.no_grad():
        session = decoder.start([prompt_ids], [0], max_new=4)
        got = [session.logits[0].clone()]
        for token in fed:
            session.step([token])
            got.append(session.logits[0].clone())
    want = reference_logits(model, prompt_ids, fed)
    assert torch.stack(got).dtype == torch.bfloat16
    assert torch.allclose(torch.stack(got).float(), want.float(), atol=0.05, rtol=0.02)
