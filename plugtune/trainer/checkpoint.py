"""Checkpoints that resume exactly: weights, optimizer, data cursor, RNG states and step.

A checkpoint directory is also a Hugging Face model directory (``save_pretrained`` + tokenizer),
plus ``trainer_state.pt`` with the rest; with LoRA it is a peft adapter directory instead (the
adapter's ``save_pretrained``: a few MiB, not the whole model) + tokenizer + ``trainer_state.pt``.
It is written to a temporary sibling and renamed, so a crash mid-write never leaves a half
checkpoint under the final name.
"""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from plugtune.home import private_dir
from plugtune.trainer import lora
from plugtune.trainer.data import DataCursor

STATE_FILE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def latest(directory: Path) -> Path | None:
    """The checkpoint with the highest step under ``directory`` (None when there is none)."""
    if not directory.is_dir():
        return None
    found = [
        (int(m.group(1)), p)
        for p in directory.iterdir()
        if (m := _STEP_DIR.match(p.name)) and (p / STATE_FILE).is_file()
    ]
    return max(found)[1] if found else None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_model(path: Path, model: PreTrainedModel, tokenizer: Any) -> Path:
    """Write ``model`` and ``tokenizer`` as a Hugging Face directory at ``path`` (owner-only)."""
    private_dir(path)
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


def save(
    path: Path,
    model: PreTrainedModel,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    cursor: DataCursor,
    step: int,
    adapter: Any | None = None,
) -> Path:
    """Write a resumable checkpoint of the state after ``step`` at ``path`` (atomically); with
    ``adapter`` (the PeftModel around ``model``) the adapter's weights instead of the model's."""
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if adapter is None:
        save_model(tmp, model, tokenizer)
    else:
        lora.save_adapter(adapter, tmp)
        tokenizer.save_pretrained(str(tmp))
    torch.save(
        {"step": step, "optimizer": optimizer.state_dict(), "cursor": cursor.state(), "rng": rng_state()},
        tmp / STATE_FILE,
    )
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return path


def load(
    path: Path,
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    cursor: DataCursor,
    adapter: Any | None = None,
) -> int:
    """Restore everything ``save`` wrote into the live objects; returns the step."""
    state_file = path / STATE_FILE
    if not state_file.is_file():
        raise FileNotFoundError(f"{path} is not a plugtune checkpoint: {STATE_FILE} is missing")
    state = torch.load(state_file, weights_only=False)
    if adapter is None:
        _load_weights(path, model)
    else:
        lora.load_adapter(adapter, path)
    optimizer.load_state_dict(state["optimizer"])
    cursor.restore(state["cursor"])
    set_rng_state(state["rng"])
    return int(state["step"])


def _load_weights(path: Path, model: PreTrainedModel) -> None:
    from safetensors.torch import load_file

    weights = {}
    for shard in sorted(path.glob("*.safetensors")):
        weights.update(load_file(str(shard)))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # tied weights (lm_head = embed_tokens) are saved once; anything else missing is a mismatch
    missing = [k for k in missing if k not in _tied_keys(model)]
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {path} does not match the model: missing {missing}, unexpected {unexpected}"
        )


def _tied_keys(model: PreTrainedModel) -> set[str]:
    names = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    unique = {name for name, _ in model.named_parameters()}
    return names - unique
