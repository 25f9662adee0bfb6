"""LoRA through ``peft``: ``hyperparameters.lora`` in job.yaml, the adapter attached, saved and merged.

The adapter is injected into the loaded model in place (``peft.get_peft_model``): the trainer, the
gateway and ``plugtune.llama_family`` keep holding the same Hugging Face model object, whose
projections are now ``lora.Linear`` layers. Only the adapter's matrices require a gradient, so
only they are in the optimizer; the fused forward keeps the update apart in training (no gradient
for the frozen weights) and folds it into the weights for decoding (``layers(merge=True)``), so
the gateway samples from exactly base + adapter.

peft is imported only when a job asks for LoRA (it costs seconds to import).
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from plugtune.home import private_dir

#: Every projection of a Llama-family layer (what ``target_modules: all-linear`` means there).
LLAMA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER_DIR = "adapter"  # under a checkpoint or the final model
ADAPTER_WEIGHTS = "adapter_model.safetensors"


@dataclass(frozen=True)
class LoraSettings:
    """``hyperparameters.lora``: train a low-rank adapter instead of every weight."""

    r: int = field(default=16, metadata={"doc": "Rank of the update (1 .. 1024)."})
    alpha: float = field(default=32.0, metadata={"doc": "Scale numerator: the update is (alpha / r) B A."})
    dropout: float = field(
        default=0.0, metadata={"doc": "Dropout on the adapter's input in training [0, 1)."}
    )
    target_modules: tuple[str, ...] = field(
        default=LLAMA_PROJECTIONS,
        metadata={"doc": "Module names that get an adapter (default: every attention and MLP projection)."},
    )

    @classmethod
    def docs(cls) -> str:
        from dataclasses import fields

        parts = [f"{f.name} ({f.metadata['doc']} Default {_shown(f.default)})" for f in fields(cls)]
        return "LoRA adapter through peft (absent: full fine-tuning): " + "; ".join(parts) + "."

    @classmethod
    def problems_of(cls, value: Any) -> list[tuple[str, str]]:
        """(field suffix, message) for everything wrong in a job.yaml ``lora`` mapping."""
        if value is None:
            return []
        if importlib.util.find_spec("peft") is None:
            return [("", "LoRA needs peft installed: pip install -e '.[lora]'")]
        if not isinstance(value, dict):
            return [("", f"must be a mapping with r, alpha, dropout, target_modules; got {value!r}")]
        known = ("r", "alpha", "dropout", "target_modules")
        out = [(f".{k}", f"unknown LoRA setting; known: {', '.join(known)}") for k in value if k not in known]
        r, alpha, dropout = value.get("r", 16), value.get("alpha", 32.0), value.get("dropout", 0.0)
        if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= 1024:
            out.append((".r", f"must be a whole number in [1, 1024], got {r!r}"))
        if not _is_number(alpha) or not 0 < alpha <= 1e6:
            out.append((".alpha", f"must be a number in (0, 1e6], got {alpha!r}"))
        if not _is_number(dropout) or not 0 <= dropout < 1:
            out.append((".dropout", f"must be a number in [0, 1), got {dropout!r}"))
        targets = value.get("target_modules", list(LLAMA_PROJECTIONS))
        if not isinstance(targets, list) or not targets or not all(isinstance(t, str) and t for t in targets):
            out.append((".target_modules", f"must be a non-empty list of module names, got {targets!r}"))
        return out

    @classmethod
    def from_value(cls, value: dict[str, Any]) -> LoraSettings:
        """From a mapping ``problems_of`` found nothing wrong in."""
        return cls(
            r=int(value.get("r", 16)),
            alpha=float(value.get("alpha", 32.0)),
            dropout=float(value.get("dropout", 0.0)),
            target_modules=tuple(value.get("target_modules", LLAMA_PROJECTIONS)),
        )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _shown(value: Any) -> str:
    return ", ".join(value) if isinstance(value, tuple) else repr(value)


def attach(model: Any, settings: LoraSettings) -> Any:
    """Inject a fresh adapter into ``model`` in place; returns the ``PeftModel`` around it.

    Raises ValueError naming the missing module names when ``target_modules`` matches nothing.
    """
    from peft import LoraConfig, get_peft_model

    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [t for t in settings.target_modules if t not in names]
    if missing:
        linear = sorted(
            {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
        )
        raise ValueError(
            f"target_modules {missing} are not modules of this model; "
            f"its linear layers are: {', '.join(linear)}"
        )
    config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,  # type: ignore[arg-type]  # peft computes alpha / r: a float works
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, config)
    model.eval()  # peft leaves the mode alone; the trainer switches the adapter's dropout itself
    return peft_model


@contextlib.contextmanager
def adapter_dropout(model: Any) -> Iterator[None]:
    """The adapter's dropout modules in training mode for the ``with`` block (the trainer holds
    the weights lock then, so the gateway never decodes with dropout)."""
    drops = [
        m
        for name, m in model.named_modules()
        if ".lora_dropout." in f".{name}." and m.__class__ is torch.nn.Dropout
    ]
    for m in drops:
        m.train()
    try:
        yield
    finally:
        for m in drops:
            m.eval()


def save_adapter(peft_model: Any, path: Path) -> Path:
    """The adapter alone (``adapter_config.json`` + ``adapter_model.safetensors``) at ``path``."""
    private_dir(path)
    peft_model.save_pretrained(str(path))
    return path


def load_adapter(peft_model: Any, path: Path) -> None:
    """Put the adapter weights saved at ``path`` into the live adapter (same settings)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = path / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise FileNotFoundError(f"{path} holds no LoRA adapter: {ADAPTER_WEIGHTS} is missing")
    result = set_peft_model_state_dict(peft_model, load_file(str(weights)))
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise ValueError(f"the adapter at {path} does not match this job's LoRA settings: {unexpected[:5]}")


def save_merged(peft_model: Any, tokenizer: Any, path: Path) -> Path:
    """Base + adapter merged into plain weights, as a Hugging Face model directory at ``path``
    (loads with ``AutoModelForCausalLM`` alone, no peft); the live model is left as it is."""
    merged = copy.deepcopy(peft_model).merge_and_unload()
    private_dir(path)
    merged.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path
