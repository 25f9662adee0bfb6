"""``plugtune test`` samples with the job's settings, as the job does: a conflicting rollout fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugtune.init_project import create_project
from plugtune.pretest.command import local_test
from tests.pretest.helpers import options


@pytest.mark.slow  # the rollout's Retry is tried max_attempts times per sample
def test_a_rollout_asking_another_temperature_fails_in_test_not_in_the_job(tmp_path: Path) -> None:
    create_project(tmp_path / "p")
    rollout = tmp_path / "p" / "plugins" / "rollout.py"
    source = rollout.read_text()
    assert '"temperature": sample.sampling.temperature' in source
    rollout.write_text(source.replace('"temperature": sample.sampling.temperature', '"temperature": 0.7'))
    doc = local_test(options(tmp_path / "p" / "job.yaml", samples=2))
    assert not doc["summary"]["ok"]
    for t in doc["trajectories"]:
        assert t["status"] == "failed"
        message = t["errors"][0]["message"]
        assert "temperature=0.7 conflicts with the job's hyperparameters.temperature=1" in message, message
