"""The verl dry run (python -m plugtune.integrations.verl_dry_run) given careless inputs: a job.yaml
that does not validate, a multi-task job, a --model that is no model, a job in a folder whose
name has spaces, commas, '#', '=' and a quote. Each bad input is one clear message (file:line
[field] or the option) and exit 2, with no traceback; a job with tasks: is refused before the
model loads; the odd folder runs (it was a Hydra override parse error)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from plugtune.settings import Settings
from plugtune.store import Store

pytest.importorskip("verl", reason="verl is installed by `make test` (pip install --no-deps)")

TASK = Path(__file__).parent / "verl_task"


def _dry_run(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "plugtune.integrations.verl_dry_run", *args]
    env = {k: v for k, v in os.environ.items() if k != "PLUGTUNE_RUN"}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def _job(where: Path, extra: str = "") -> Path:
    shutil.copytree(TASK, where)
    job = where / "job.yaml"
    job.write_text(job.read_text() + extra)
    return job


def _refused(done: subprocess.CompletedProcess[str], said: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert said in done.stderr, done.stderr[-2000:]


def test_bad_jobs_and_options_are_one_clear_message(home: Settings, tmp_path: Path) -> None:
    bad = _job(tmp_path / "bad", "bogus_key: 1\n")
    _refused(_dry_run(str(bad)), f"{bad}:12 [bogus_key]: unknown key")
    tasks = _job(tmp_path / "tasks", "tasks:\n  other:\n    graders: [exact_match]\n")
    _refused(_dry_run(str(tasks)), f"{tasks}:12 [tasks]: tasks: (multi-task jobs) runs on plugtune's trainer")
    job = str(TASK / "job.yaml")
    _refused(_dry_run(job, "--model", str(tmp_path / "nowhere")), "--model ")
    _refused(_dry_run(job, "--model", str(tmp_path)), "is not a Hugging Face model folder")
    _refused(_dry_run(job, "--steps", "abc"), "argument --steps: invalid int value")
    interpolated = _job(tmp_path / "${oc.env:HOME}")
    _refused(_dry_run(str(interpolated)), "reads ${...} in a path as an interpolation")
    store = Store.open(home.database_url)
    assert store.list_jobs() == []  # nothing was recorded for any of them (the tasks job neither)


def test_a_job_in_a_folder_with_spaces_commas_hashes_and_quotes_runs(home: Settings, tmp_path: Path) -> None:
    job = _job(tmp_path / "it's odd" / "my jobs, #1=x")
    done = _dry_run(str(job), "--steps", "1", "--rows", "1", "--n", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    [found] = Store.open(home.database_url).list_jobs()
    assert found.status == "succeeded" and f"plugtune job {found.id}: succeeded" in done.stdout
