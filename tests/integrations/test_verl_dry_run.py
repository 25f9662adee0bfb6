"""The documented way to try a job's verl path on one machine: `python -m
plugtune.integrations.verl_dry_run job.yaml` runs verl's real AgentLoopWorker and the reward function
verl loads, on CPU, into one plugtune job."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from plugtune.settings import Settings
from plugtune.store import Store

pytest.importorskip("verl", reason="verl is installed by `make test` (pip install --no-deps)")

JOB = Path(__file__).parent / "verl_task" / "job.yaml"


def _dry_run(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "plugtune.integrations.verl_dry_run", *args]
    env = {k: v for k, v in os.environ.items() if k != "PLUGTUNE_RUN"}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def test_the_dry_run_rolls_out_and_scores_with_verls_classes_into_one_job(home: Settings) -> None:
    done = _dry_run(str(JOB), "--steps", "2", "--rows", "2", "--n", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("step ")]
    assert len(lines) == 8  # 2 steps x 2 rows x 2 trajectories
    assert all("reward function" in line for line in lines)
    assert sum("row 1: failed" in line for line in lines) == 4  # picky crashes on row 1
    store = Store.open(home.database_url)
    [job] = store.list_jobs()
    assert job.status == "succeeded" and str(job.spec["run_key"]).startswith("dry-run-")
    assert f"plugtune job {job.id}: succeeded" in done.stdout
    records = store.trajectories(job.id)
    assert len(records) == 16  # 8 from the agent loop, 8 from the reward function
    assert sorted(r.step for r in records) == [1] * 8 + [2] * 8  # the reward function's too


def test_the_dry_run_says_what_is_wrong_with_its_arguments(home: Settings, tmp_path: Path) -> None:
    done = _dry_run(str(JOB), "--n", "0")
    assert done.returncode == 2 and "--n must be between 1 and 10000, not 0" in done.stderr
    done = _dry_run(str(tmp_path / "nowhere.yaml"))
    assert done.returncode == 2 and "nowhere.yaml does not exist" in done.stderr
