"""The job commands as a user runs them: exit codes, printed errors, and one JSON document each."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.settings import Settings
from tests.jobs.jobkit import make_job

runner = CliRunner()


def _json(args: list[str]) -> dict:  # type: ignore[type-arg]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.slow
def test_run_then_read_commands(tmp_path: Path, home: Settings) -> None:
    crashing = """
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    ctx.logger.error("about to fail on %s", trajectory.trajectory_id)
    raise KeyError("answer")
"""
    job_file = make_job(tmp_path / "cli", grader=crashing)
    result = runner.invoke(app, ["run", str(job_file)])
    assert result.exit_code == 1
    assert "Call plugin error (plugin): 500" in result.output
    assert "plugtune doctor 1" in result.output
    assert re.search(r"plugin errors [1-9]", result.output), result.output  # the calls that failed it

    shown = _json(["jobs", "show", "1", "--json"])
    assert shown["status"] == "failed"
    assert {k: shown["error"][k] for k in ("type", "owner", "cause")} == {
        "type": "Call plugin error",
        "owner": "plugin",
        "cause": "500",
    }
    assert "traceback" in shown["error"]["hint"] or shown["error"]["hint"]
    assert _json(["jobs", "list", "--json"])["jobs"][0]["id"] == 1

    logs = _json(["logs", "1", "--plugin", "exact", "--level", "error", "--json"])["logs"]
    assert logs and all(line["plugin"] == "exact" and line["level"] == "ERROR" for line in logs)

    trajectories = _json(["trajectories", "1", "--status", "failed", "--json"])["trajectories"]
    assert trajectories and trajectories[0]["status"] == "failed"

    doctor = _json(["doctor", "1", "--json"])
    assert doctor["error"]["cause"] == "500"
    assert "grader.py" in doctor["traceback"] and "KeyError" in doctor["traceback"]
    assert doctor["plugin"]["name"] == "exact" and doctor["plugin"]["status"] == "failed"
    assert any("about to fail" in line["message"] for line in doctor["recent_logs"])

    text = runner.invoke(app, ["doctor", "1"]).output
    assert "what to do:" in text and "grader.py" in text

    retried = runner.invoke(app, ["jobs", "retry", "1"])
    assert retried.exit_code == 0 and "queued" in retried.output
    assert _json(["jobs", "show", "1", "--json"])["status"] == "queued"
    cancelled = runner.invoke(app, ["jobs", "cancel", "1"])
    assert cancelled.exit_code == 0
    assert _json(["jobs", "show", "1", "--json"])["status"] == "cancelled"


@pytest.mark.slow
def test_a_run_that_succeeds_says_where_the_trained_model_is(tmp_path: Path, home: Settings) -> None:
    job_file = make_job(tmp_path / "ok", hyper={"steps": 1})
    result = runner.invoke(app, ["run", str(job_file)])
    assert result.exit_code == 0, result.output
    final = (home.home / "jobs" / "1" / "final").resolve()
    assert f"trained model: {final}" in " ".join(result.output.split()), result.output
    assert (final / "config.json").is_file()


def test_invalid_job_is_recorded_and_run_exits_non_zero(tmp_path: Path, home: Settings) -> None:
    job_file = make_job(tmp_path / "bad", hyper={"batch_size": 0}, rows=["{oops"])
    result = runner.invoke(app, ["run", str(job_file)])
    assert result.exit_code == 1
    assert "Invalid value (data)" in result.output
    assert "batch_size" in result.output and "train.jsonl:1" in result.output
    shown = _json(["jobs", "show", "1", "--json"])
    assert shown["status"] == "failed" and shown["error"]["type"] == "Invalid value"


def test_a_validation_failure_never_prints_an_empty_cause(tmp_path: Path, home: Settings) -> None:
    """A validation error has no cause: the title is its type alone, and a one-line listing shows
    the message's first line instead of "Invalid value: " with nothing after it."""
    ran = runner.invoke(app, ["run", str(make_job(tmp_path / "bad", hyper={"steps": 0}))])
    assert ran.exit_code == 1
    title = ran.output.splitlines()[1]
    assert title == "Invalid value (data)", ran.output
    listed = runner.invoke(app, ["jobs", "list"]).output.strip()
    assert re.search(r"bad\s+Invalid value: \S.*\[hyperparameters.steps\]: 0 is outside", listed), listed
    shown = runner.invoke(app, ["jobs", "show", "1"]).output
    assert "Invalid value (data)\n" in shown and "Invalid value: \n" not in shown, shown


def test_submit_queues_and_unknown_ids_are_clear(tmp_path: Path, home: Settings) -> None:
    result = runner.invoke(app, ["submit", str(make_job(tmp_path / "q"))])
    assert result.exit_code == 0 and "job 1 queued" in result.output
    missing = runner.invoke(app, ["jobs", "show", "42"])
    assert missing.exit_code == 2 and "there is no job 42" in missing.output
    bad_status = runner.invoke(app, ["jobs", "list", "--status", "sleeping"])
    assert bad_status.exit_code == 2 and "unknown status" in bad_status.output
