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
    """A causal LM (in eval mode; float32 on the CPU unless asked otherwise) and its tokenizer,
    which carries a chat template."""

    model: PreTrainedModel
    tokenizer: Any
    path: Path


def placement(
    device: str = "cpu", dtype: str = "float32", *, file: str = "job.yaml"
) -> tuple[torch.device, torch.dtype]:
    """The torch device and dtype for ``hyperparameters.device`` / ``.dtype`` (``auto``: a GPU when
    torch sees one, bfloat16 on a GPU that supports it); InvalidValueError naming the field when
    the machine cannot give what was asked."""
    cuda = torch.cuda.is_available()
    if device == "cuda" and not cuda:
        message = (
            "device is cuda, but torch sees no GPU on this machine (torch.cuda.is_available() is False: "
            "no GPU, no driver, or a CPU build of torch); set it to auto or cpu"
        )
        raise InvalidValueError([Problem(file=file, field="hyperparameters.device", message=message)])
    if device not in ("auto", "cpu", "cuda"):
        raise InvalidValueError(
            [Problem(file=file, field="hyperparameters.device", message=f"{device!r}: use auto, cpu or cuda")]
        )
    where = torch.device("cuda" if device == "cuda" or (device == "auto" and cuda) else "cpu")
    if dtype == "auto":
        bf16 = where.type == "cuda" and torch.cuda.is_bf16_supported()
        return where, torch.bfloat16 if bf16 else torch.float32
    if dtype not in DTYPES:
        message = f"{dtype!r}: use auto, {', '.join(DTYPES)}"
        raise InvalidValueError([Problem(file=file, field="hyperparameters.dtype", message=message)])
    if dtype == "bfloat16" and where.type == "cuda" and not torch.cuda.is_bf16_supported():
        message = "bfloat16, but this GPU does not support it; set dtype to float32 or auto"
        raise InvalidValueError([Problem(file=file, field="hyperparameters.dtype", message=message)])
    return where, DTYPES[dtype]


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_model(
    path: str | Path,
    *,
    field: str = "model",
    file: str = "job.yaml",
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> LoadedModel:
    """Load the model and tokenizer in ``path`` offline, in ``dtype`` on ``device`` (default: the
    CPU); errors name the path and what to do."""
    where = Path(path).expanduser()
    if (where / "adapter_config.json").is_file() and not (where / "config.json").is_file():
        return _load_adapted(where, field=field, file=file, device=device, dtype=dtype)
    _check_directory(where, field=field, file=file)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(where), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(str(where), local_files_only=True, dtype=dtype)
        if device is not None and device.type != "cpu":
            torch.nn.Module.to(model, device)  # in place (transformers types its own .to narrowly)
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


def _load_adapted(
    where: Path, *, field: str, file: str, device: torch.device | None, dtype: torch.dtype
) -> LoadedModel:
    """The base model named in ``adapter_config.json`` with the adapter in ``where`` merged in."""
    base = json.loads((where / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base or not Path(base).is_dir():
        message = (
            f"{where} is a LoRA adapter whose base model {base!r} is not a local folder; "
            "load the base model and the adapter with peft, or point to the job's final/ folder"
        )
        raise InvalidDataError([Problem(file=file, field=field, message=message)])
    loaded = load_model(base, field=field, file=file, device=device, dtype=dtype)
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
