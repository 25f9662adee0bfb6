"""``TrainerConfig``: the GRPO hyperparameters, typed and documented, validated with field names.

It is the single source for job.yaml's ``hyperparameters`` block: ``TrainerConfig.from_dict``
reports every illegal value as a :class:`plugtune.errors.Problem` naming the file and field.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from typing import Any

from plugtune.errors import InvalidValueError, Problem
from plugtune.trainer.lora import LoraSettings


def _doc(text: str, lo: float, hi: float, *, lo_open: bool = False) -> dict[str, Any]:
    return {"doc": text, "min": lo, "max": hi, "min_exclusive": lo_open}


def _flag(text: str) -> dict[str, Any]:
    return {"doc": text, "flag": True}


@dataclass(frozen=True)
class TrainerConfig:
    """GRPO hyperparameters. Every field's meaning and range is in ``TrainerConfig.docs()``."""

    steps: int = field(default=10, metadata=_doc("Optimizer steps to run.", 1, 1_000_000))
    batch_size: int = field(default=4, metadata=_doc("Prompts (dataset rows) per step.", 1, 4096))
    group_size: int = field(
        default=4, metadata=_doc("Rollouts per prompt; advantages are normalised within a group.", 2, 1024)
    )
    learning_rate: float = field(default=1e-5, metadata=_doc("AdamW learning rate.", 0.0, 1e38, lo_open=True))
    max_new_tokens: int = field(
        default=64, metadata=_doc("Most tokens the policy samples per model turn.", 1, 65_536)
    )
    temperature: float = field(
        default=1.0, metadata=_doc("Sampling temperature of the policy.", 0.0, 10.0, lo_open=True)
    )
    top_p: float = field(
        default=1.0, metadata=_doc("Nucleus sampling mass of the policy.", 0.0, 1.0, lo_open=True)
    )
    kl_coef: float = field(
        default=0.0,
        metadata=_doc("Weight of the KL penalty to the initial model (0 = no reference model).", 0.0, 100.0),
    )
    clip_ratio: float = field(
        default=0.2,
        metadata=_doc("PPO clip range epsilon of the probability ratio.", 0.0, 10.0, lo_open=True),
    )
    grad_clip: float = field(
        default=1.0, metadata=_doc("Maximum global gradient norm (clipped above it).", 0.0, 1e9, lo_open=True)
    )
    weight_decay: float = field(default=0.0, metadata=_doc("AdamW weight decay.", 0.0, 1.0))
    save_every_n_steps: int = field(
        default=10, metadata=_doc("Write a resumable checkpoint every N steps.", 1, 1_000_000)
    )
    eval_every_n_steps: int = field(
        default=10,
        metadata=_doc(
            "Evaluate data.validation every N steps (and before the first, as step 0, and after the "
            "last); ignored without it.",
            1,
            1_000_000,
        ),
    )
    seed: int = field(
        default=0, metadata=_doc("Seed of data order, sampling and initialisation.", 0, 2**32 - 1)
    )
    overlap_rollouts: bool = field(
        default=False,
        metadata=_flag(
            "Start the next step's rollouts while this step trains; their policy calls wait for the "
            "new weights, so training stays on-policy. Pays off when rollouts work before they ask "
            "the policy (environment set-up, tools); on a machine whose cores training already fills "
            "it only adds contention."
        ),
    )
    lora: LoraSettings | None = field(default=None, metadata={"doc": LoraSettings.docs(), "nested": True})

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise InvalidValueError(problems)

    def problems(self, file: str = "job.yaml", prefix: str = "hyperparameters") -> list[Problem]:
        """What is illegal in this config ([] when every value is fine)."""
        return [
            Problem(file=file, field=f"{prefix}.{name}", message=message)
            for name, message in _field_problems(dataclasses.asdict(self))
        ]

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], *, file: str = "job.yaml", prefix: str = "hyperparameters"
    ) -> TrainerConfig:
        """Build from a mapping (e.g. job.yaml); raises InvalidValueError listing every problem."""
        known = {f.name for f in fields(cls)}
        problems = [
            Problem(
                file=file,
                field=f"{prefix}.{key}",
                message=f"unknown hyperparameter; known ones are: {', '.join(sorted(known))}",
            )
            for key in data
            if key not in known
        ]
        values = {k: v for k, v in data.items() if k in known}
        problems += [
            Problem(file=file, field=f"{prefix}.{name}", message=message)
            for name, message in _field_problems({**_defaults(), **values})
        ]
        problems += [
            Problem(file=file, field=f"{prefix}.lora{suffix}", message=message)
            for suffix, message in LoraSettings.problems_of(values.get("lora"))
        ]
        if problems:
            raise InvalidValueError(problems)
        converted: dict[str, Any] = {k: (float(v) if _is_float_field(k) else v) for k, v in values.items()}
        if isinstance(values.get("lora"), dict):
            converted["lora"] = LoraSettings.from_value(values["lora"])
        return cls(**converted)

    @classmethod
    def docs(cls) -> dict[str, str]:
        """Field name -> one line of documentation with its default and range."""
        out = {}
        for f in fields(cls):
            m = f.metadata
            if m.get("nested"):
                out[f.name] = m["doc"]
                continue
            if m.get("flag"):
                out[f.name] = f"{m['doc']} Default {f.default!r} (true or false)."
                continue
            lo = "(" if m["min_exclusive"] else "["
            out[f.name] = f"{m['doc']} Default {f.default!r}, range {lo}{m['min']:g}, {m['max']:g}]."
        return out


def _defaults() -> dict[str, Any]:
    return {f.name: f.default for f in fields(TrainerConfig)}


def _is_float_field(name: str) -> bool:
    return {f.name: f.type for f in fields(TrainerConfig)}[name] == "float"


def _field_problems(values: dict[str, Any]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for f in fields(TrainerConfig):
        value = values[f.name]
        m = f.metadata
        if m.get("nested"):  # checked by its own type
            continue
        if m.get("flag"):
            if not isinstance(value, bool):
                out.append((f.name, f"must be true or false, got {value!r}"))
            continue
        if f.type == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                out.append((f.name, f"must be a whole number, got {value!r}"))
                continue
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            out.append((f.name, f"must be a number, got {value!r}"))
            continue
        elif not math.isfinite(value):
            out.append((f.name, f"must be finite, got {value!r}"))
            continue
        too_low = value <= m["min"] if m["min_exclusive"] else value < m["min"]
        if too_low or value > m["max"]:
            lo = "(" if m["min_exclusive"] else "["
            out.append((f.name, f"{value!r} is outside the allowed range {lo}{m['min']:g}, {m['max']:g}]"))
    return out
