"""Choosing the backend: job.yaml's plugins.runtime_backend and the Python API (no cluster needed)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from plugtune.runtime import LocalRuntime, RayRuntime, runtime_for
from plugtune.spec.models import JobSpec

JOB = {
    "name": "arith",
    "model": "models/tiny",
    "data": {"train": "data/train.jsonl"},
    "plugins": {"graders": [{"entry": "plugins/grader.py:exact"}]},
}


def with_backend(backend: str) -> dict[str, object]:
    return {**JOB, "plugins": {**JOB["plugins"], "runtime_backend": backend}}  # type: ignore[dict-item]


def test_job_yaml_chooses_ray_and_defaults_to_local() -> None:
    assert JobSpec.model_validate(JOB).plugins.runtime_backend == "local"
    assert JobSpec.model_validate(with_backend("ray")).plugins.runtime_backend == "ray"


def test_an_unknown_backend_names_the_field_and_the_choices() -> None:
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate(with_backend("k8s"))
    error = info.value.errors()[0]
    assert error["loc"] == ("plugins", "runtime_backend") and "'local' or 'ray'" in error["msg"]


def test_runtime_for_returns_the_backend_asked_for() -> None:
    assert isinstance(runtime_for("ray", "127.0.0.1:6379"), RayRuntime)
    assert isinstance(runtime_for("local"), LocalRuntime)
    with pytest.raises(ValueError, match="use one of local, ray"):
        runtime_for("k8s")
