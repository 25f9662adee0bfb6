"""`plugtune eval` refuses what it cannot evaluate with the field or argument to fix, before any compute."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.demo import MODEL_DIR
from plugtune.settings import Settings
from tests.jobs.jobkit import make_job

runner = CliRunner()


def test_a_job_without_validation_rows_names_data_validation(tmp_path: Path, home: Settings) -> None:
    job_file = make_job(tmp_path / "noval")
    result = runner.invoke(app, ["eval", str(MODEL_DIR), str(job_file)])
    assert result.exit_code == 1
    assert "[data.validation]" in result.output and "add data.validation" in result.output


def test_a_missing_model_folder_names_the_argument(tmp_path: Path, home: Settings) -> None:
    job_file = make_job(
        tmp_path / "val", extra={"data": {"train": "data/train.jsonl", "validation": "data/train.jsonl"}}
    )
    result = runner.invoke(app, ["eval", str(tmp_path / "nope"), str(job_file)])
    assert result.exit_code == 1
    assert "CHECKPOINT_OR_MODEL" in result.output and "does not exist" in result.output
