"""A job runs what was submitted: editing job.yaml, a plugin or a dataset after `plugtune submit`
changes nothing a queued job, an attempt or a retry runs; a changed dataset is refused by name."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import Scheduler, run_job
from plugtune.runtime.snapshot import MAX_FILES
from plugtune.settings import Settings
from plugtune.store import Store
from tests.jobs.jobkit import make_job

runner = CliRunner()

#: Fails while the attempt's environment says so (secrets are read from it at every attempt, never
#: kept), else scores a constant: which version of the grader ran shows in the rewards.
GRADER = """
import os
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    if os.environ["PT_BROKEN"] == "1":
        raise ValueError("broken on purpose")
    return {value}
"""


def _project(root: Path, value: float = 0.25) -> Path:
    job_file = make_job(root, grader=GRADER.format(value=value), extra={"secrets": ["PT_BROKEN"]})
    return job_file


def _edit_after_submitting(job_file: Path) -> None:
    """What a user does next: more steps in job.yaml, a grader that scores something else."""
    spec = yaml.safe_load(job_file.read_text())
    spec["hyperparameters"]["steps"] = 3
    job_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    (job_file.parent / "plugins" / "grader.py").write_text(GRADER.format(value=0.75))


def _wait_for(store: Store, job_id: int, status: str, timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = store.get_job(job_id)
        if job is not None and job.status == status and job.next_retry_at is None:
            return
        time.sleep(0.2)
    job = store.get_job(job_id)
    raise AssertionError(f"job {job_id} did not become {status}: {job.status if job else None}")


def _rewards(store: Store, job_id: int) -> set[float | None]:
    return {t.reward for t in store.trajectories(job_id, limit=100)}


@pytest.mark.slow
def test_a_queued_job_and_its_retry_run_the_job_yaml_and_grader_that_were_submitted(
    tmp_path: Path, home: Settings, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_file = _project(tmp_path / "task")
    monkeypatch.setenv("PT_BROKEN", "1")
    submitted = runner.invoke(app, ["submit", str(job_file)])
    assert submitted.exit_code == 0, submitted.output
    _edit_after_submitting(job_file)  # while it is queued: the edited grader would not raise
    scheduler = Scheduler(store, home, poll_s=0.2)
    scheduler.start()
    try:
        _wait_for(store, 1, "failed")
        job = store.get_job(1)
        assert job is not None and job.error is not None and job.error.cause == "500"
        assert "broken on purpose" in str(job.error.evidence.get("traceback"))
        monkeypatch.setenv("PT_BROKEN", "0")
        _edit_after_submitting(job_file)  # and again before the retry
        retried = runner.invoke(app, ["jobs", "retry", "1"])
        assert retried.exit_code == 0, retried.output
        _wait_for(store, 1, "succeeded")
    finally:
        scheduler.stop()
    job = store.get_job(1)
    assert job is not None and job.steps_done == 2 and job.spec["hyperparameters"]["steps"] == 2
    assert "steps: 2" in job.spec_yaml and "steps: 3" not in job.spec_yaml  # the console's Configuration
    assert _rewards(store, 1) == {0.25}  # the submitted grader, not the edited one (0.75)
    (grader,) = [p for p in store.list_plugins(1) if p.role == "grader"]
    code = store.get_code(grader.code_hash)["grader.py"].decode()  # the console's Plugin code
    assert "return 0.25" in code
    assert grader.entry == f"{job_file.parent / 'plugins' / 'grader.py'}:exact"  # the file it came from
    assert [a.status for a in store.list_attempts(1)] == ["failed", "succeeded"]


@pytest.mark.slow
def test_a_data_file_changed_after_submitting_fails_the_attempt_naming_it(
    tmp_path: Path, home: Settings, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PT_BROKEN", "0")
    job_file = _project(tmp_path / "task")
    job_id, invalid = create_job(store, job_file)
    assert invalid is None
    train = tmp_path / "task" / "data" / "train.jsonl"
    row = {"messages": [{"role": "user", "content": "What is 2+2?"}], "extra": {"answer": "4"}}
    train.write_text(train.read_text() + json.dumps(row) + "\n")  # still valid: only its content moved
    assert run_job(store, home, job_id) == "failed"
    job = store.get_job(job_id)
    assert job is not None and job.error is not None
    assert (job.error.type, job.error.owner) == ("Invalid data", "data")
    assert str(train) in job.error.message and "changed since the job was submitted" in job.error.message
    assert "submit the job again" in job.error.message
    assert store.count_trajectories(job_id) == 0  # refused before any compute
    shown = runner.invoke(app, ["jobs", "show", str(job_id)])
    assert "train.jsonl" in shown.output and "changed since the job was submitted" in shown.output


@pytest.mark.slow
def test_a_job_recorded_without_a_snapshot_still_runs_from_its_files_and_says_so(
    tmp_path: Path, home: Settings, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PT_BROKEN", "0")
    job_file = _project(tmp_path / "old")
    job_id, invalid = create_job(store, job_file)
    assert invalid is None
    job = store.get_job(job_id)
    assert job is not None
    old = {k: v for k, v in job.spec.items() if k != "submitted"}  # as an older plugtune stored it
    store.update_job(job_id, spec=old)
    (job_file.parent / "plugins" / "grader.py").write_text(GRADER.format(value=0.75))
    assert run_job(store, home, job_id) == "succeeded"
    assert _rewards(store, job_id) == {0.75}  # read from its files, as before
    shown = runner.invoke(app, ["jobs", "show", str(job_id)])
    assert "holds no snapshot of what was submitted" in shown.output, shown.output
    job = store.get_job(job_id)  # what ran is kept for its later retries, and shown
    assert job is not None and "submitted" in job.spec
    grader = job.spec["submitted"]["plugins"]["plugins/grader.py"]
    assert b"return 0.75" in store.get_code(grader["code_hash"])["grader.py"]


def test_a_plugin_folder_over_the_snapshot_bounds_is_refused_at_submission_naming_its_entry(
    tmp_path: Path, home: Settings, store: Store
) -> None:
    job_file = make_job(tmp_path / "big")
    for i in range(MAX_FILES + 1):
        (tmp_path / "big" / "plugins" / f"f{i}.txt").write_text("x")
    job_id, invalid = create_job(store, job_file)
    assert invalid is not None
    job = store.get_job(job_id)
    assert job is not None and job.status == "failed" and job.error is not None
    assert job.error.type == "Invalid value"
    problems = job.error.evidence.get("problems") or invalid.details()["problems"]
    (problem,) = [p for p in problems if p["field"] == "plugins.rollout.entry"]
    assert f"more than {MAX_FILES} files" in problem["message"] and problem["line"] is not None
    assert store.list_attempts(job_id) == []


def test_the_stored_spec_keeps_each_plugin_folder_and_the_data_fingerprints(
    tmp_path: Path, home: Settings, store: Store
) -> None:
    job_file = make_job(tmp_path / "kept")
    job_id, invalid = create_job(store, job_file)
    assert invalid is None
    job = store.get_job(job_id)
    assert job is not None
    kept = job.spec["submitted"]
    (train,) = kept["data"].values()
    data = (tmp_path / "kept" / "data" / "train.jsonl").read_bytes()
    assert train["bytes"] == len(data) and len(train["sha256"]) == 64
    assert set(kept["plugins"]) == {"plugins/rollout.py", "plugins/grader.py"}
    code = store.get_code(kept["plugins"]["plugins/grader.py"]["code_hash"])
    assert code["grader.py"] == (tmp_path / "kept" / "plugins" / "grader.py").read_bytes()
    assert job.spec_yaml == job_file.read_text()
