"""A real job with ``hyperparameters.dtype: bfloat16`` trains on the CPU and reports the memory a
step needed; ``device: cuda`` on a machine without a GPU fails at once as Invalid value naming the
field (issue 29 item 3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.settings import Settings
from tests.jobs.jobkit import make_job

pytestmark = pytest.mark.slow
runner = CliRunner()


def test_a_bfloat16_job_with_checkpointing_trains_and_shows_its_step_memory(
    tmp_path: Path, home: Settings
) -> None:
    job_file = make_job(
        tmp_path / "bf16", hyper={"dtype": "bfloat16", "device": "cpu", "gradient_checkpointing": True}
    )
    result = runner.invoke(app, ["run", str(job_file)])
    assert result.exit_code == 0, result.output
    doc = json.loads(runner.invoke(app, ["jobs", "show", "1", "--json"]).stdout)
    assert doc["status"] == "succeeded"
    assert doc["metrics"]["memory/peak_mib"] > 50  # the process's peak, in MiB
    assert "loss" in doc["metrics"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_device_cuda_without_a_gpu_fails_as_invalid_value_naming_the_field(
    tmp_path: Path, home: Settings
) -> None:
    job_file = make_job(tmp_path / "gpu", hyper={"device": "cuda"}, extra={"retry": {"max_auto_retries": 0}})
    result = runner.invoke(app, ["run", str(job_file)])
    assert result.exit_code == 1, result.output
    error = json.loads(runner.invoke(app, ["jobs", "show", "1", "--json"]).stdout)["error"]
    assert error["type"] == "Invalid value", error
    assert "hyperparameters.device" in error["message"] and "torch sees no GPU" in error["message"], error
