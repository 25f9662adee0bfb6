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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from plugtune.home import private_dir

#: Every projection of a Llama-family layer (what ``target_modules: all-linear`` means there).
LLAMA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER_DIR = "adapter"  # under a checkpoint or the final model
ADAPTER_WEIGHTS = "adapter_model.safetensors"


class LoraSettings(BaseModel):
    """``hyperparameters.lora``: train a low-rank adapter instead of every weight."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)

    r: int = Field(default=16, ge=1, le=1024, description="Rank of the update (1 .. 1024).")
    alpha: float = Field(
        default=32.0, gt=0, le=1e6, description="Scale numerator: the update is (alpha / r) B A."
    )
    dropout: float = Field(
        default=0.0, ge=0, lt=1, description="Dropout on the adapter's input in training [0, 1)."
    )
    target_modules: tuple[str, ...] = Field(
        default=LLAMA_PROJECTIONS,
        description="Module names that get an adapter (default: every attention and MLP projection).",
    )

    @model_validator(mode="before")
    @classmethod
    def _peft_installed(cls, value: Any) -> Any:
        if importlib.util.find_spec("peft") is None:
            raise ValueError(_NO_PEFT)
        return value

    @field_validator("target_modules", mode="before")
    @classmethod
    def _module_names(cls, value: Any) -> Any:
        names = list(value) if isinstance(value, (list, tuple)) else None
        if not names or not all(isinstance(t, str) and t for t in names):
            raise ValueError(f"must be a non-empty list of module names, got {value!r}")
        return tuple(names)

    @classmethod
    def docs(cls) -> str:
        parts = [
            f"{name} ({info.description} Default {_shown(info.default)})"
            for name, info in cls.model_fields.items()
        ]
        return "LoRA adapter through peft (absent: full fine-tuning): " + "; ".join(parts) + "."


_NO_PEFT = "LoRA needs peft installed: pip install -e '.[lora]'"
#: How each setting's problems are worded (followed by ``, got <value>``).
_WANTED = {
    "r": "must be a whole number in [1, 1024]",
    "alpha": "must be a number in (0, 1e6]",
    "dropout": "must be a number in [0, 1)",
}


def lora_message(loc: tuple[str, ...], kind: str, value: Any, text: str) -> tuple[str, str]:
    """(field suffix below ``lora``, message) of one pydantic error of a job.yaml ``lora`` mapping."""
    text = text.removeprefix("Value error, ")
    if not loc:
        if kind in ("model_type", "model_attributes_type", "dict_type"):
            return "", f"must be a mapping with r, alpha, dropout, target_modules; got {value!r}"
        return "", text
    name = loc[0]
    if kind == "extra_forbidden":
        return f".{name}", f"unknown LoRA setting; known: {', '.join(LoraSettings.model_fields)}"
    if name in _WANTED:
        return f".{name}", f"{_WANTED[name]}, got {value!r}"
    return f".{name}", text


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
