"""`plugtune jobs retry ID --code DIR`: a job whose grader fails resumes from its checkpoint with the
fixed grader (linted and tested on the job's own trajectories first), each attempt records the code
it ran, the steps before the retry stand; broken code is refused naming the problem, changing nothing."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.jobs import revision
from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import run_job
from plugtune.pretest.replay import replay
from plugtune.settings import Settings
from plugtune.store import Store
from tests.jobs.jobkit import make_job

runner = CliRunner()

#: Scores steps 1 (and the fixed version every step); raises from step 2 on: the job fails at step 2
#: after the checkpoint of step 1.
BROKEN = """
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    if ctx.step >= 2:
        raise ValueError(f"broken at step {ctx.step}")
    return 0.25
"""
FIXED = BROKEN.replace('raise ValueError(f"broken at step {ctx.step}")', "return 0.75")
LINT_BROKEN = """
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    if trajectory.completion:
        return 1.0
"""
RAISE = 'raise ValueError(f"broken at step {ctx.step}")'
RAISES_ELSEWHERE = BROKEN.replace(RAISE, 'raise KeyError("no answer")')


def _failed_job(root: Path, store: Store, home: Settings) -> tuple[Path, int]:
    job_file = make_job(root, grader=BROKEN, hyper={"steps": 3})
    job_id, invalid = create_job(store, job_file)
    assert invalid is None
    assert run_job(store, home, job_id) == "failed"
    job = store.get_job(job_id)
    assert job is not None and job.error is not None and job.error.cause == "500", job
    assert job.steps_done == 1 and store.latest_checkpoint(job_id) is not None
    return root, job_id


def _copy_with_grader(project: Path, target: Path, grader: str) -> Path:
    shutil.copytree(project, target)
    (target / "plugins" / "grader.py").write_text(textwrap.dedent(grader))
    return target


def _state(store: Store, job_id: int) -> dict[str, Any]:
    """What a refused retry must leave as it was."""
    job = store.get_job(job_id)
    assert job is not None
    with store._db.read("counting code") as conn:  # the code store itself: nothing added
        from sqlalchemy import func, select

        from plugtune.store.schema import code_files

        code_rows = conn.execute(select(func.count()).select_from(code_files)).scalar()
    return {
        "status": job.status,
        "spec": job.spec,
        "transitions": len(store.list_transitions(job_id)),
        "code_rows": code_rows,
        "attempts": len(store.list_attempts(job_id)),
    }


@pytest.mark.slow
def test_a_failed_job_resumes_from_its_checkpoint_with_the_fixed_grader(
    tmp_path: Path, home: Settings, store: Store
) -> None:
    project, job_id = _failed_job(tmp_path / "task", store, home)
    before = {t.trajectory_id: t for t in store.trajectories(job_id, step=1, limit=100)}
    assert before and {t.reward for t in before.values()} == {0.25}
    fixed = _copy_with_grader(project, tmp_path / "fixed", FIXED)

    retried = runner.invoke(app, ["jobs", "retry", str(job_id), "--code", str(fixed)])
    assert retried.exit_code == 0, retried.output
    assert "queued for retry with code" in retried.output and "tested: s2" in retried.output, retried.output
    assert run_job(store, home, job_id) == "succeeded"

    job = store.get_job(job_id)
    assert job is not None and job.steps_done == 3
    first, second = store.list_attempts(job_id)
    assert (first.status, second.status, second.resumed_from_step) == ("failed", "succeeded", 1)
    ran = store.attempt_code(job_id)
    assert [c.attempt for c in ran] == [1, 2]
    assert ran[0].code_hash != ran[1].code_hash and ran[0].source == "submitted"
    assert ran[1].source == str(fixed)
    # The steps before the retry were not run again: the same records, scored by the old grader.
    after = {t.trajectory_id: t for t in store.trajectories(job_id, step=1, limit=100)}
    assert {k: (t.id, t.reward) for k, t in after.items()} == {k: (t.id, t.reward) for k, t in before.items()}
    assert {t.reward for s in (2, 3) for t in store.trajectories(job_id, step=s, limit=100)} == {0.75}
    old = store.get_trajectory(job_id, next(iter(before)))
    new = store.trajectories(job_id, step=3, limit=1)[0]
    new_record = store.get_trajectory(job_id, new.trajectory_id)
    assert old is not None and new_record is not None
    assert old.code_hash["exact"] != new_record.code_hash["exact"]  # each trajectory names its code
    assert b"return 0.75" in store.get_code(new_record.code_hash["exact"])["grader.py"]
    # Steps by code, and the diff between the attempts' code.
    spans = [(s.attempt, s.code_hash, s.first_step, s.last_step) for s in revision.timeline(store, job_id)]
    assert spans == [(1, ran[0].code_hash, 1, 1), (2, ran[1].code_hash, 2, 3)]
    diff = revision.diff(store, ran[0].plugins, ran[1].plugins)
    assert "--- a/plugins/grader.py" in diff and "+++ b/plugins/grader.py" in diff
    assert f"-        {RAISE}" in diff and "+        return 0.75" in diff
    assert "rollout.py" not in diff  # unchanged files are not in it
    assert diff.count("+++ b/plugins/grader.py") == 1  # both plugins' folder, diffed once
    (grader,) = [p for p in store.list_plugins(job_id) if p.role == "grader"]
    assert grader.entry == f"{fixed / 'plugins' / 'grader.py'}:exact"  # the console names where it came from
    shown = runner.invoke(app, ["jobs", "show", str(job_id)])
    assert f"attempt 2: succeeded (from step 1, code {ran[1].code_hash[:12]} ({fixed}))" in shown.output
    assert f"attempt 1: failed (from step 0, code {ran[0].code_hash[:12]} (submitted))" in shown.output
    # A plain retry afterwards would run this code, not what is on disk: the job's code is the stored one.
    assert revision.set_hash(revision.plugins_to_run(job.spec)) == ran[1].code_hash
    # A replay runs the code its trajectory ran (the job's plugins now name the fix): step 1's the
    # submitted grader, step 3's the fixed one, neither read from disk.
    (project / "plugins" / "grader.py").write_text("raise SystemExit('not the code the job ran')\n")
    earlier = replay(store, job_id, old.trajectory_id)
    assert (earlier["verdict"], earlier["replayed"]["reward"]) == ("reproduced", 0.25), earlier
    later = replay(store, job_id, new_record.trajectory_id)
    assert (later["verdict"], later["replayed"]["reward"]) == ("reproduced", 0.75), later


@pytest.mark.slow
def test_broken_code_is_refused_naming_the_problem_and_the_job_is_unchanged(
    tmp_path: Path, home: Settings, store: Store
) -> None:
    project, job_id = _failed_job(tmp_path / "task", store, home)
    unchanged = _state(store, job_id)

    linted = _copy_with_grader(project, tmp_path / "lint", LINT_BROKEN)
    refused = runner.invoke(app, ["jobs", "retry", str(job_id), "--code", str(linted)])
    assert refused.exit_code == 1, refused.output
    assert "plugtune lint" in refused.output and "PT203" in refused.output, refused.output
    assert str(linted / "plugins" / "grader.py") in refused.output and "nothing was changed" in refused.output
    assert _state(store, job_id) == unchanged

    raising = _copy_with_grader(project, tmp_path / "raises", RAISES_ELSEWHERE)
    refused = runner.invoke(app, ["jobs", "retry", str(job_id), "--code", str(raising)])
    assert refused.exit_code == 1, refused.output
    assert "quick test" in refused.output and "KeyError" in refused.output, refused.output
    assert "[exact]" in refused.output and "s2-" in refused.output  # the plugin and the trajectory
    assert _state(store, job_id) == unchanged

    missing = _copy_with_grader(project, tmp_path / "missing", FIXED)
    (missing / "plugins" / "grader.py").unlink()
    refused = runner.invoke(app, ["jobs", "retry", str(job_id), "--code", str(missing)])
    assert refused.exit_code == 1, refused.output
    assert "has no plugins/grader.py" in refused.output, refused.output
    assert _state(store, job_id) == unchanged

    gone = runner.invoke(app, ["jobs", "retry", str(job_id), "--code", str(tmp_path / "nowhere")])
    assert gone.exit_code != 0 and "nowhere" in gone.output
    assert _state(store, job_id) == unchanged
