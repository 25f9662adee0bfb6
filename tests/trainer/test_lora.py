"""LoRA through peft: what the gateway samples is the adapted model, checkpoints hold the adapter,
and the merged final model is a plain Hugging Face model that generates the same tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from plugtune.demo import MODEL_DIR
from plugtune.demo.plugins import grader as demo_grader
from plugtune.demo.plugins import rollout as demo_rollout
from plugtune.gateway.engine import SamplingParams
from plugtune.gateway.gateway import PolicyGateway
from plugtune.llama_family import LlamaFamily, unsupported
from plugtune.trainer import lora
from plugtune.trainer.batch import mask_kind
from plugtune.trainer.config import TrainerConfig
from plugtune.trainer.groups import Plugins
from plugtune.trainer.grpo import GRPOTrainer
from plugtune.trainer.losses import token_logprobs
from plugtune.trainer.model import load_model
from plugtune.trainer.testing import InProcessFunction, chat_prompt_ids
from tests.gateway.test_decoding import CASES, tiny

ROWS = [json.loads(line) for line in (MODEL_DIR.parent / "data" / "train.jsonl").read_text().splitlines()[:8]]
PLUGINS = Plugins(
    rollout=InProcessFunction(demo_rollout.answer), graders=[InProcessFunction(demo_grader.exact_match)]
)


def _randomise_adapter(model: Any, seed: int = 1) -> None:
    """peft starts B at zero (the adapted model is the base): give the update a value, as training would."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)


@pytest.mark.parametrize(("family", "extra"), CASES[:4])
def test_the_fused_forward_of_an_adapted_model_gives_peft_logits_and_adapter_gradients(
    family: str, extra: dict[str, Any]
) -> None:
    model = tiny(family, **extra)
    adapted = lora.attach(model, lora.LoraSettings(r=4, alpha=8.0))
    _randomise_adapter(model)
    assert unsupported(model) is None and mask_kind(model) == "fused"
    ids_GL = torch.randint(1, 97, (2, 9), generator=torch.Generator().manual_seed(2))
    positions_GL = torch.arange(9).expand(2, 9)
    mask_G1LL = torch.ones(9, 9, dtype=torch.bool).tril().expand(2, 1, 9, 9)
    family_forward = LlamaFamily(model)

    normed, _, _ = family_forward.forward(ids_GL, positions_GL, mask_G1LL, family_forward.layers())
    ours = family_forward.head(normed)
    theirs = adapted(input_ids=ids_GL, position_ids=positions_GL).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=2e-5)
    base = lora.attach(tiny(family, **extra), lora.LoraSettings(r=4, alpha=8.0))  # B = 0: the base model
    assert not torch.allclose(ours, base(input_ids=ids_GL).logits, atol=1e-3)  # the adapter does something
    with torch.no_grad():  # what the gateway decodes from: the update folded into the weights
        merged, _, _ = family_forward.forward(
            ids_GL, positions_GL, mask_G1LL, family_forward.layers(merge=True)
        )
    torch.testing.assert_close(family_forward.head(merged), theirs, rtol=1e-4, atol=2e-5)

    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n, _ in trained)  # only the adapter trains
    weights = torch.randn(ours.shape, generator=torch.Generator().manual_seed(3))
    grads_ours = torch.autograd.grad((ours * weights).sum(), [p for _, p in trained])
    grads_theirs = torch.autograd.grad((theirs * weights).sum(), [p for _, p in trained])
    for (name, _), a, b in zip(trained, grads_ours, grads_theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-6 * float(b.abs().max()), msg=name)


def _trainer(gateway: PolicyGateway, lm: Any, **hyper: Any) -> GRPOTrainer:
    config = TrainerConfig(
        steps=4,
        batch_size=2,
        group_size=4,
        max_new_tokens=6,
        learning_rate=1e-2,
        lora=lora.LoraSettings(r=4, alpha=8.0),
        **hyper,
    )
    return GRPOTrainer(lm.model, lm.tokenizer, gateway, PLUGINS, ROWS, config)


async def test_the_gateway_samples_from_base_plus_adapter_and_the_merged_model_generates_the_same(
    tmp_path: Path,
) -> None:
    lm = load_model(MODEL_DIR)
    base = {k: v.clone() for k, v in lm.model.state_dict().items()}
    with PolicyGateway(lm.model, lm.tokenizer) as gateway:
        trainer = _trainer(gateway, lm)
        assert gateway.engine.decoder.description.startswith("fused")
        _randomise_adapter(lm.model)  # as if trained a while: base + adapter differs from the base
        result = await trainer.step()
        # The trainer's recomputation (fused forward, adapter kept apart) of the gateway's records:
        assert any(any(r.response_mask) for r in result.records)
        assert result.metrics["logprob_gap"] < 1e-4, result.metrics
        # The gateway's log-probs are the adapted model's (peft's own forward, independently);
        # its greedy reply is checked against the merged model reloaded by plain transformers.
        prompt = chat_prompt_ids(lm.tokenizer, ROWS[0]["messages"])
        greedy = gateway.engine.submit(prompt, SamplingParams(max_tokens=8, temperature=0.0)).result(60)
        sampled = gateway.engine.submit(prompt, SamplingParams(max_tokens=8, temperature=1.0, seed=5)).result(
            60
        )
        with torch.no_grad():
            ids = torch.tensor([prompt + sampled.token_ids])
            logits = trainer.adapted(input_ids=ids).logits[0, len(prompt) - 1 : -1]
            peft_logps = token_logprobs(logits[None], torch.tensor([sampled.token_ids]))[0]
        torch.testing.assert_close(torch.tensor(sampled.logprobs), peft_logps, rtol=0, atol=1e-4)
        final = trainer.save_final(tmp_path / "final")

    assert not (final / "adapter_config.json").exists()  # a plain model: no peft needed to load it
    assert (final / lora.ADAPTER_DIR / lora.ADAPTER_WEIGHTS).is_file()
    merged = transformers.AutoModelForCausalLM.from_pretrained(str(final), dtype=torch.float32)
    out = merged.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)
    assert out[0, len(prompt) :].tolist()[: len(greedy.token_ids)] == greedy.token_ids
    # only the adapter trained: the base weights under it are the ones loaded
    live = {k.replace("base_layer.", ""): v for k, v in lm.model.state_dict().items() if "lora_" not in k}
    assert all(torch.equal(base[k], live[k]) for k in base)
    assert any(not torch.equal(base[k], v) for k, v in merged.state_dict().items() if k in base)


async def test_a_lora_checkpoint_holds_the_adapter_and_resumes_it(tmp_path: Path) -> None:
    lm = load_model(MODEL_DIR)
    with PolicyGateway(lm.model, lm.tokenizer) as gateway:
        trainer = _trainer(gateway, lm)
        _randomise_adapter(lm.model)
        await trainer.step()
        path = trainer.save_checkpoint(tmp_path / "step-000001")
        adapter = {k: v.clone() for k, v in lm.model.state_dict().items() if "lora_" in k}
        ids = torch.tensor([chat_prompt_ids(lm.tokenizer, ROWS[0]["messages"])])
        with torch.no_grad():
            adapted_logits = lm.model(input_ids=ids).logits
    # load_model (plugtune run, eval) takes a LoRA checkpoint as its base with the adapter merged in
    reloaded = load_model(path)
    assert not any("lora_" in name for name, _ in reloaded.model.named_parameters())
    with torch.no_grad():
        torch.testing.assert_close(reloaded.model(input_ids=ids).logits, adapted_logits, rtol=1e-4, atol=1e-4)
    assert not list(path.glob("model*.safetensors"))
    size = (path / lora.ADAPTER_WEIGHTS).stat().st_size
    assert size < (MODEL_DIR / "model.safetensors").stat().st_size / 4

    fresh = load_model(MODEL_DIR)
    with PolicyGateway(fresh.model, fresh.tokenizer) as gateway:
        resumed = _trainer(gateway, fresh)
        resumed.load_checkpoint(path)
        assert resumed.step_count == 1
        now = {k: v for k, v in fresh.model.state_dict().items() if "lora_" in k}
        assert now.keys() == adapter.keys()
        assert all(torch.equal(now[k], adapter[k]) for k in adapter)


def test_lora_settings_in_job_yaml_are_checked_field_by_field() -> None:
    from plugtune.errors import InvalidValueError

    with pytest.raises(InvalidValueError) as caught:
        TrainerConfig.from_dict({"lora": {"r": 0, "alpha": "big", "dropout": 1.0, "targets": ["q_proj"]}})
    fields = {p.field for p in caught.value.problems}
    assert fields == {
        "hyperparameters.lora.r",
        "hyperparameters.lora.alpha",
        "hyperparameters.lora.dropout",
        "hyperparameters.lora.targets",
    }
    config = TrainerConfig.from_dict({"lora": {"r": 8, "target_modules": ["q_proj", "v_proj"]}})
    assert config.lora == lora.LoraSettings(r=8, target_modules=("q_proj", "v_proj"))
    with pytest.raises(ValueError, match="not modules of this model.*q_proj"):
        lora.attach(tiny("llama"), lora.LoraSettings(target_modules=("query",)))
