"""TrainerConfig: defaults, and every illegal value reported with its field name."""

from __future__ import annotations

import pytest

from plugtune.errors import InvalidValueError
from plugtune.trainer.config import TrainerConfig


def test_defaults_are_legal_and_documented() -> None:
    config = TrainerConfig()
    assert config.problems() == []
    docs = TrainerConfig.docs()
    assert set(docs) >= {"steps", "batch_size", "group_size", "learning_rate", "kl_coef", "seed"}
    assert "Default 4" in docs["group_size"]


def test_from_dict_converts_ints_to_float_fields() -> None:
    config = TrainerConfig.from_dict({"learning_rate": 1, "steps": 3})
    assert config.learning_rate == 1.0 and isinstance(config.learning_rate, float)
    assert config.steps == 3


def test_from_dict_reports_every_problem_with_file_and_field() -> None:
    with pytest.raises(InvalidValueError) as info:
        TrainerConfig.from_dict(
            {"steps": 0, "group_size": 1, "learning_rate": "fast", "top_p": 1.5, "batch": 2, "seed": 1.5},
            file="jobs/a.yaml",
        )
    err = info.value
    fields = {p.field for p in err.problems}
    assert fields == {
        "hyperparameters.steps",
        "hyperparameters.group_size",
        "hyperparameters.learning_rate",
        "hyperparameters.top_p",
        "hyperparameters.batch",
        "hyperparameters.seed",
    }
    assert all(p.file == "jobs/a.yaml" for p in err.problems)
    assert err.type == "Invalid value"
    assert "jobs/a.yaml [hyperparameters.top_p]: 1.5 is outside the allowed range (0, 1]" in err.message


def test_constructor_rejects_illegal_values() -> None:
    with pytest.raises(InvalidValueError, match="hyperparameters.temperature"):
        TrainerConfig(temperature=0.0)
    with pytest.raises(InvalidValueError, match="must be finite"):
        TrainerConfig(kl_coef=float("nan"))
    with pytest.raises(InvalidValueError, match="whole number"):
        TrainerConfig(batch_size=True)
    with pytest.raises(InvalidValueError, match=r"overlap_rollouts\]: must be true or false, got 'yes'"):
        TrainerConfig.from_dict({"overlap_rollouts": "yes"})
    assert TrainerConfig.from_dict({"overlap_rollouts": True}).overlap_rollouts is True
    assert "true or false" in TrainerConfig.docs()["overlap_rollouts"]
