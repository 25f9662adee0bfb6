"""job.yaml's runtime.network: checked at validation, carried to the plugin's effective Runtime."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugtune.errors import InvalidValueError
from plugtune.spec.validation import validate_job
from tests.jobs.jobkit import make_job


def test_a_network_setting_reaches_the_rollouts_runtime(tmp_path: Path) -> None:
    job = validate_job(make_job(tmp_path / "net", rollout_runtime={"network": "none"}))
    assert job.spec.plugins.rollout.runtime is not None
    assert job.spec.plugins.rollout.runtime.given()["network"] == "none"


def test_an_unknown_network_is_invalid_value_naming_the_field_and_the_choices(tmp_path: Path) -> None:
    with pytest.raises(InvalidValueError) as info:
        validate_job(make_job(tmp_path / "badnet", rollout_runtime={"network": "lan"}))
    text = str(info.value)
    assert "plugins.rollout.runtime.network" in text
    assert "'none', 'policy-only' or 'any'" in text
