"""Load any Hugging Face causal LM and its tokenizer from a local directory (``model:`` in job.yaml).

A LoRA checkpoint (a peft adapter directory, as a LoRA job's checkpoints are) loads as its base
model with the adapter merged in.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from plugtune.errors import InvalidDataError, InvalidValueError, Problem

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    """A causal LM (float32, CPU, eval mode) and its tokenizer, which carries a chat template."""

    model: PreTrainedModel
    tokenizer: Any
    path: Path


def load_model(path: str | Path, *, field: str = "model", file: str = "job.yaml") -> LoadedModel:
    """Load the model and tokenizer in ``path`` offline; errors name the path and what to do."""
    where = Path(path).expanduser()
    if (where / "adapter_config.json").is_file() and not (where / "config.json").is_file():
        return _load_adapted(where, field=field, file=file)
    _check_directory(where, field=field, file=file)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(where), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(str(where), local_files_only=True, dtype=torch.float32)
    except (OSError, ValueError, KeyError) as exc:
        raise InvalidDataError(
            [
                Problem(
                    file=file,
                    field=field,
                    message=f"{where} is not a loadable Hugging Face causal LM directory: {exc}",
                )
            ]
        ) from exc
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidValueError(
            [
                Problem(
                    file=file,
                    field=field,
                    message=f"the tokenizer in {where} has no chat template; use a chat model or add "
                    "'chat_template' to its tokenizer_config.json",
                )
            ]
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.eval()
    log.info("loaded %s (%d parameters)", where, sum(p.numel() for p in model.parameters()))
    return LoadedModel(model=model, tokenizer=tokenizer, path=where)


def _load_adapted(where: Path, *, field: str, file: str) -> LoadedModel:
    """The base model named in ``adapter_config.json`` with the adapter in ``where`` merged in."""
    base = json.loads((where / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base or not Path(base).is_dir():
        message = (
            f"{where} is a LoRA adapter whose base model {base!r} is not a local folder; "
            "load the base model and the adapter with peft, or point to the job's final/ folder"
        )
        raise InvalidDataError([Problem(file=file, field=field, message=message)])
    loaded = load_model(base, field=field, file=file)
    from peft import PeftModel

    merged = PeftModel.from_pretrained(loaded.model, str(where)).merge_and_unload()
    merged.eval()
    return LoadedModel(model=merged, tokenizer=loaded.tokenizer, path=where)


def _check_directory(where: Path, *, field: str, file: str) -> None:
    if not where.exists():
        message = f"model directory {where} does not exist; set {field} to a local Hugging Face model folder"
    elif not where.is_dir():
        message = f"{where} is a file; {field} must be a Hugging Face model folder (with config.json)"
    elif not (where / "config.json").is_file():
        message = f"{where} has no config.json, so it is not a Hugging Face model folder"
    else:
        return
    raise InvalidDataError([Problem(file=file, field=field, message=message)])
