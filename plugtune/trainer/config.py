"""``TrainerConfig``: the GRPO hyperparameters, a pydantic model like the rest of job.yaml.

It is the single source for job.yaml's ``hyperparameters`` block: its fields' types, defaults,
ranges and descriptions make the checks, :meth:`TrainerConfig.docs` (CLI help, the console, the
spec reference) and the spec's ``hyperparameters:`` section. An illegal value is reported in the
trainer's own words as a :class:`plugtune.errors.Problem` naming the file and field
(:func:`problems_of`), whether the config is built in code (``InvalidValueError``), read with
:meth:`TrainerConfig.from_dict`, or validated as part of the job's spec.
"""

from __future__ import annotations

from typing import Any, Literal, get_args, get_origin

import annotated_types
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo

from plugtune.errors import InvalidValueError, Problem
from plugtune.trainer.lora import LoraSettings, lora_message


def _ranged(default: float, doc: str, lo: float, hi: float, *, lo_open: bool = False) -> Any:
    """A number field of ``default`` in [lo, hi] (or (lo, hi] with ``lo_open``), described by ``doc``."""
    if lo_open:
        return Field(default=default, gt=lo, le=hi, description=doc)
    return Field(default=default, ge=lo, le=hi, description=doc)


class TrainerConfig(BaseModel):
    """GRPO hyperparameters. Every field's meaning and range is in ``TrainerConfig.docs()``."""

    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, allow_inf_nan=False, validate_default=True
    )

    steps: int = _ranged(10, "Optimizer steps to run.", 1, 1_000_000)
    batch_size: int = _ranged(4, "Prompts (dataset rows) per step.", 1, 4096)
    group_size: int = _ranged(4, "Rollouts per prompt; advantages are normalised within a group.", 2, 1024)
    learning_rate: float = _ranged(1e-5, "AdamW learning rate.", 0.0, 1e38, lo_open=True)
    max_new_tokens: int = _ranged(64, "Most tokens the policy samples per model turn.", 1, 65_536)
    temperature: float = _ranged(1.0, "Sampling temperature of the policy.", 0.0, 10.0, lo_open=True)
    top_p: float = _ranged(1.0, "Nucleus sampling mass of the policy.", 0.0, 1.0, lo_open=True)
    kl_coef: float = _ranged(
        0.0, "Weight of the KL penalty to the initial model (0 = no reference model).", 0.0, 100.0
    )
    clip_ratio: float = _ranged(
        0.2, "PPO clip range epsilon of the probability ratio.", 0.0, 10.0, lo_open=True
    )
    grad_clip: float = _ranged(
        1.0, "Maximum global gradient norm (clipped above it).", 0.0, 1e9, lo_open=True
    )
    weight_decay: float = _ranged(0.0, "AdamW weight decay.", 0.0, 1.0)
    save_every_n_steps: int = _ranged(10, "Write a resumable checkpoint every N steps.", 1, 1_000_000)
    eval_every_n_steps: int = _ranged(
        10,
        "Evaluate data.validation every N steps (and before the first, as step 0, and after the "
        "last); ignored without it.",
        1,
        1_000_000,
    )
    seed: int = _ranged(
        0,
        "Seed of data order and initialisation (a LoRA adapter's too). Replies are sampled from the "
        "policy gateway's own generator, so two runs' replies differ; a policy request's own `seed` "
        "reproduces its reply.",
        0,
        2**32 - 1,
    )
    overlap_rollouts: bool = Field(
        default=False,
        description="Start the next step's rollouts while this step trains; their policy calls wait "
        "for the new weights, so training stays on-policy. Pays off when rollouts work before they "
        "ask the policy (environment set-up, tools); on a machine whose cores training already "
        "fills it only adds contention.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto",
        description="Where the trainer and the policy gateway run the model: `cuda` (the first GPU), "
        "`cpu`, or `auto` (cuda when torch sees a GPU, else cpu).",
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto",
        description="The model's weights and compute: `auto` is bfloat16 on a GPU that supports it, "
        "else float32; bfloat16 halves the weights' memory (log-probs and the loss stay float32).",
    )
    gradient_checkpointing: bool = Field(
        default=False,
        description="Recompute activations in the backward pass instead of keeping them: less "
        "memory, more compute (the model's own forward runs instead of plugtune's fused one).",
    )
    dynamic_sampling: bool = Field(
        default=False,
        description="Leave out of each step's batch the groups that give no gradient (every scored "
        "trajectory got the same reward, or none was scored) and refill it with new prompts from the "
        "dataset (they are used up, as DAPO's group filter does), so the step trains on batch_size "
        "groups with a reward difference; the dropped groups' trajectories are recorded as discard, "
        "saying why. Each step records dynamic_sampling/filtered_groups, /extra_groups, "
        "/extra_rollouts and /kept_groups.",
    )
    max_extra_batches: int = _ranged(
        2,
        "With dynamic_sampling: the most extra rounds of prompts a step draws to refill its batch, "
        "each as many prompts as the batch lacks groups (so at most max_extra_batches x batch_size "
        "extra prompts); when they run out the step trains on the groups it has and warns "
        "(dynamic_sampling_short).",
        0,
        64,
    )
    poison_after: int = _ranged(
        2,
        "Quarantine a dataset row (the data cursor passes over it, the job warns with Invalid data "
        "naming its file and line) once every trajectory of it failed with the same non-transient "
        "cause (500, EOF, FaaS OOM, Invalid reward, Status failure; never a Dependency error, a "
        "Timeout or a platform fault) on this many different steps; 0 turns it off. Each step "
        "records data/poison_groups, data/poison_calls (the failed calls they cost) and "
        "data/quarantined_rows. On plugtune's trainer (the TRL path does not quarantine rows).",
        0,
        1000,
    )
    lora: LoraSettings | None = Field(default=None, description=LoraSettings.docs())

    def __init__(self, **values: Any) -> None:
        """Build from keyword values; raises InvalidValueError listing every illegal one."""
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise InvalidValueError(problems_of(exc)) from None

    # Validation inside the job's spec keeps pydantic's own errors (each at its field, worded by
    # config_message); only a config built in code raises InvalidValueError. Pydantic calls a
    # custom __init__ for nested values too, unless it is marked as the base one (as RootModel does).
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    def problems(self, file: str = "job.yaml", prefix: str = "hyperparameters") -> list[Problem]:
        """What is illegal in this config ([] when every value is fine; an instance made without
        validation, ``model_construct``, can hold illegal values)."""
        try:
            type(self).model_validate(dict(self))
        except ValidationError as exc:
            return problems_of(exc, file=file, prefix=prefix)
        return []

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], *, file: str = "job.yaml", prefix: str = "hyperparameters"
    ) -> TrainerConfig:
        """Build from a mapping (e.g. job.yaml); raises InvalidValueError listing every problem."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise InvalidValueError(problems_of(exc, file=file, prefix=prefix)) from None

    @classmethod
    def docs(cls) -> dict[str, str]:
        """Field name -> one line of documentation with its default and range."""
        out = {}
        for name, info in cls.model_fields.items():
            doc = info.description or ""
            if name == "lora":
                out[name] = doc
            elif get_origin(info.annotation) is Literal:
                choices = ", ".join(str(c) for c in get_args(info.annotation))
                out[name] = f"{doc} Default {info.default!r}, one of {choices}."
            elif info.annotation is bool:
                out[name] = f"{doc} Default {info.default!r} (true or false)."
            else:
                out[name] = f"{doc} Default {info.default!r}, range {range_text(info)}."
        return out


def range_text(info: FieldInfo) -> str:
    """A number field's allowed range as the trainer writes it: ``[1, 4096]`` or ``(0, 1]``."""
    lo, hi, lo_open = 0.0, 0.0, False
    for bound in info.metadata:
        if isinstance(bound, annotated_types.Gt):
            lo, lo_open = float(bound.gt), True  # type: ignore[arg-type]
        elif isinstance(bound, annotated_types.Ge):
            lo = float(bound.ge)  # type: ignore[arg-type]
        elif isinstance(bound, annotated_types.Le):
            hi = float(bound.le)  # type: ignore[arg-type]
    return f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"


def problems_of(
    exc: ValidationError, *, file: str = "job.yaml", prefix: str = "hyperparameters"
) -> list[Problem]:
    """The trainer's problems with a config pydantic refused: each names ``file`` and the field."""
    out = []
    for error in exc.errors(include_url=False):
        field, message = config_message(error)
        out.append(Problem(file=file, field=f"{prefix}.{field}" if field else prefix, message=message))
    return out


_RANGE_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")


def config_message(error: Any) -> tuple[str, str]:
    """(dotted field below ``hyperparameters``, the trainer's message) of one pydantic error."""
    loc = tuple(str(part) for part in error["loc"])
    kind, value = error["type"], error.get("input")
    if not loc:
        return "", f"must be a mapping of hyperparameters, got {value!r}"
    if loc[0] == "lora":
        suffix, message = lora_message(loc[1:], kind, value, str(error["msg"]))
        return "lora" + suffix, message
    name = loc[0]
    info = TrainerConfig.model_fields.get(name)
    if kind == "extra_forbidden" or info is None:
        known = ", ".join(sorted(TrainerConfig.model_fields))
        return name, f"unknown hyperparameter; known ones are: {known}"
    if kind == "bool_type":
        return name, f"must be true or false, got {value!r}"
    if kind == "int_type":
        return name, f"must be a whole number, got {value!r}"
    if kind == "float_type":
        return name, f"must be a number, got {value!r}"
    if kind == "finite_number":
        return name, f"must be finite, got {value!r}"
    if kind in _RANGE_ERRORS:
        return name, f"{value!r} is outside the allowed range {range_text(info)}"
    return name, str(error["msg"]).removeprefix("Value error, ")
