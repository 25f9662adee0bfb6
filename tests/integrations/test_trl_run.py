"""``trainer: trl`` in job.yaml: ``plugtune run`` trains the job with TRL's GRPOTrainer."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from plugtune.errors import InvalidValueError
from plugtune.jobs.validation import validate_job
from plugtune.settings import Settings
from plugtune.store import Store
from tests.integrations.conftest import TASK

pytest.importorskip("trl")


def test_an_unknown_trainer_is_invalid_value_naming_the_field(tmp_path: Path) -> None:
    shutil.copytree(TASK, tmp_path / "task")
    job_file = tmp_path / "task" / "job.yaml"
    job_file.write_text(job_file.read_text().replace("trainer: trl", "trainer: verl"))
    with pytest.raises(InvalidValueError) as raised:
        validate_job(job_file)
    assert "trainer" in str(raised.value) and "'plugtune'" in str(raised.value)


@pytest.mark.slow
def test_plugtune_run_drives_a_trl_job_to_the_end(home: Settings) -> None:
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    done = subprocess.run(
        [sys.executable, "-m", "plugtune.cli", "run", str(TASK / "job.yaml")],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "succeeded after 2/2 steps" in done.stdout
    store = Store.open(home.database_url)
    try:
        (job,) = store.list_jobs()
        assert job.status == "succeeded" and job.spec["trainer"] == "trl"
        assert store.count_trajectories(job.id) == 8
        assert {p.name for p in store.list_plugins(job.id)} == {"with_tool", "exact_match", "picky"}
    finally:
        store.close()
    assert (home.home / "jobs" / str(job.id) / "final" / "config.json").is_file()
