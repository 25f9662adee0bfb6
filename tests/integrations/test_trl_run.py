"""``trainer: trl`` in job.yaml: ``plugtune run`` trains the job with TRL's GRPOTrainer."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from plugtune.errors import InvalidValueError
from plugtune.jobs.control import create_job
from plugtune.settings import Settings
from plugtune.spec.validation import validate_job
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


def _attempt(job_id: int) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    command = [sys.executable, "-m", "plugtune.jobs.attempt", str(job_id)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_retried_trl_attempt_resumes_from_its_last_checkpoint(
    home: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = tmp_path / "task"
    shutil.copytree(TASK, task)
    job_file = task / "job.yaml"
    text = job_file.read_text().replace("steps: 2,", "steps: 3, save_every_n_steps: 1,")
    text = text.replace("max_attempts: 2, on_exhausted: drop_sample", "on_exhausted: fail_job")
    job_file.write_text(text + "secrets: [PT_CRASH_AT_STEP]\n")
    # A retry runs the data and code that were submitted: the fault is in the attempt's environment
    # (a secret, read at every attempt), picky crashing at the step it names.
    grader = task / "plugins" / "grader.py"
    crash = 'os.environ["PT_CRASH_AT_STEP"] == str(ctx.step)'
    grader.write_text(grader.read_text().replace('sample.extra.get("crash_at_step") == ctx.step', crash))
    data = task / "data" / "train.jsonl"
    rows = [
        '{"messages": [{"role": "user", "content": "21+38=?"}], "extra": {"answer": "59"}}',
        '{"messages": [{"role": "user", "content": "40+15=?"}], "extra": {"answer": "55"}}',
    ]
    data.write_text("\n".join(rows) + "\n")
    monkeypatch.setenv("PT_CRASH_AT_STEP", "3")  # picky crashes at step 3
    store = Store.open(home.database_url)
    try:
        job_id, problem = create_job(store, job_file)
        assert problem is None

        first = _attempt(job_id)
        assert first.returncode != 0
        checkpoint = store.latest_checkpoint(job_id)
        assert checkpoint is not None and checkpoint.step == 2 and Path(checkpoint.path).is_dir()
        failed = store.list_attempts(job_id)[0]
        assert failed.status == "failed" and failed.error is not None
        assert (failed.error.type, failed.error.cause) == ("Call plugin error", "500")
        before = {t.trajectory_id for t in store.trajectories(job_id, limit=100)}
        assert {t.step for t in store.trajectories(job_id, limit=100)} == {1, 2}

        monkeypatch.setenv("PT_CRASH_AT_STEP", "0")  # fixed: the retry goes past step 3
        second = _attempt(job_id)
        assert second.returncode == 0, second.stderr[-3000:]
        retry = store.list_attempts(job_id)[1]
        assert retry.status == "succeeded" and retry.resumed_from_step == 2
        after = store.trajectories(job_id, limit=100)
        assert before < {t.trajectory_id for t in after}  # steps 1-2 kept, not trained again
        assert sorted(t.step for t in after) == [1] * 4 + [2] * 4 + [3] * 4
        job = store.get_job(job_id)
        assert job is not None and job.steps_done == 3
    finally:
        store.close()
    assert (home.home / "jobs" / str(job_id) / "final" / "config.json").is_file()
