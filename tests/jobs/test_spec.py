from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from plugtune.sdk import Runtime
from plugtune.spec.models import (
    BUILTIN_ROLLOUT,
    JobSpec,
    RuntimeOverrides,
    merge_runtime,
    parse_entry,
    resolve_model,
    spec_reference,
)
from plugtune.trainer.config import TrainerConfig, config_message

MINIMAL = {
    "name": "arith",
    "model": "models/tiny",
    "data": {"train": "data/train.jsonl"},
    "plugins": {"graders": [{"entry": "plugins/grader.py:exact"}]},
}


def test_minimal_spec_gets_documented_defaults() -> None:
    spec = JobSpec.model_validate(MINIMAL)
    assert spec.algorithm == "grpo"
    assert spec.failure_policy.max_attempts == 3
    assert spec.failure_policy.on_exhausted == "fail_job"
    assert spec.retry.platform_delay_s == 900
    assert spec.retry.max_auto_retries == 3
    assert spec.circuit_breaker.max_error_share == 0.5
    assert spec.rollout_entry() == BUILTIN_ROLLOUT
    assert spec.hyperparameters.group_size >= 2


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"algorithm": "ppo"}, ("algorithm",)),
        ({"surprise": 1}, ("surprise",)),
        ({"failure_policy": {"on_exhausted": "ignore"}}, ("failure_policy", "on_exhausted")),
        ({"circuit_breaker": {"max_error_share": 0}}, ("circuit_breaker", "max_error_share")),
        ({"model": "builtin:huge"}, ("model",)),
        ({"name": "has space"}, ("name",)),
    ],
)
def test_illegal_values_are_rejected_at_their_field(patch: dict, field: tuple) -> None:
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate({**MINIMAL, **patch})
    assert field in [tuple(e["loc"]) for e in info.value.errors()]


@pytest.mark.parametrize(
    "patch",
    [
        {"batch_size": 0},
        {"group_size": 1},
        {"learning_rate": 0.0},
        {"steps": True},
        {"steps": "10"},
        {"top_p": 1.5},
    ],
)
def test_illegal_hyperparameters_are_rejected_by_the_trainer_config(patch: dict) -> None:
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate({**MINIMAL, "hyperparameters": patch})
    (error,) = info.value.errors()
    name = next(iter(patch))
    assert error["loc"] == ("hyperparameters", name)  # the trainer's model, nested in the spec
    field, message = config_message({**error, "loc": error["loc"][1:]})  # in the trainer's own words
    assert field == name
    assert message.startswith(("must be a whole number", f"{patch[name]!r} is outside the allowed range"))


def test_hyperparameters_are_the_trainers_config() -> None:
    spec = JobSpec.model_validate({**MINIMAL, "hyperparameters": {"steps": 3, "weight_decay": 0.01}})
    assert isinstance(spec.hyperparameters, TrainerConfig)
    assert spec.hyperparameters.steps == 3 and spec.hyperparameters.weight_decay == 0.01
    assert spec.hyperparameters.batch_size == TrainerConfig().batch_size
    assert JobSpec.model_validate(MINIMAL).hyperparameters == TrainerConfig()


def test_grader_weight_must_be_positive_and_some_grader_is_needed() -> None:
    bad = {**MINIMAL, "plugins": {"graders": [{"entry": "g.py:f", "weight": -1.0}]}}
    with pytest.raises(ValidationError):
        JobSpec.model_validate(bad)
    with pytest.raises(ValidationError, match="at least one grader"):
        JobSpec.model_validate({**MINIMAL, "plugins": {"graders": []}})


def test_runtime_overrides_win_over_the_decorator() -> None:
    decorator = Runtime(memory_mb=512, timeout_s=30, max_concurrency=2)
    merged = merge_runtime(decorator, RuntimeOverrides(timeout_s=5.0, max_instances=2))
    assert merged.timeout_s == 5.0
    assert merged.max_instances == 2
    assert merged.memory_mb == 512 and merged.max_concurrency == 2
    assert merge_runtime(decorator, None) is decorator


def test_runtime_overrides_check_limits_and_ordering() -> None:
    with pytest.raises(ValidationError):
        RuntimeOverrides(memory_mb=1)
    with pytest.raises(ValidationError, match="min_instances"):
        RuntimeOverrides(min_instances=5, max_instances=2)


def test_runtime_overrides_take_the_sandbox_limits() -> None:
    merged = merge_runtime(Runtime(), RuntimeOverrides(tmp_mb=64, max_pids=32))
    assert (merged.tmp_mb, merged.max_pids) == (64, 32)
    with pytest.raises(ValidationError, match="tmp_mb"):
        RuntimeOverrides(tmp_mb=0)
    with pytest.raises(ValidationError, match="max_pids"):
        RuntimeOverrides(max_pids=10_000_000)


def test_parse_entry_forms() -> None:
    ref = parse_entry("plugins/rollout.py:solve")
    assert (ref.file, ref.function, ref.module) == ("plugins/rollout.py", "solve", None)
    builtin = parse_entry(BUILTIN_ROLLOUT)
    assert builtin.file is None and builtin.module == "plugtune.jobs.builtin_rollout"
    for bad in ("plugins/rollout.py", "rollout:solve", "a.py:1x", "a.py:f:g"):
        with pytest.raises(ValueError, match="file.py:function"):
            parse_entry(bad)


def test_resolve_model(tmp_path: Path) -> None:
    assert resolve_model("models/m", tmp_path) == (tmp_path / "models/m").resolve()
    builtin = resolve_model("builtin:tiny-chat", tmp_path)
    assert builtin.parts[-3:] == ("plugtune", "demo", "model")
    with pytest.raises(ValueError, match="unknown builtin"):
        resolve_model("builtin:nope", tmp_path)


def test_every_field_is_documented() -> None:
    rows = spec_reference()
    paths = {r.path for r in rows}
    assert {"hyperparameters.kl_coef", "plugins.graders[].weight", "retry.platform_delay_s"} <= paths
    assert {f"hyperparameters.{name}" for name in TrainerConfig.docs()} <= paths
    assert "plugins.rollout.runtime.timeout_s" in paths
    undocumented = [r.path for r in rows if not r.description]
    assert undocumented == []
