"""A job whose steps gave the policy no gradient does not end as a plain "succeeded" (issue 24,
item 7): a real job with a constant grader warns, with example trajectories, wherever the job is
shown; a healthy job does not."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.jobs.control import create_job
from plugtune.jobs.report import job_document
from plugtune.jobs.scheduler import run_job
from plugtune.settings import Settings
from plugtune.store import Store
from plugtune.trainer.health import warning_examples
from plugtune.web import create_app
from tests.jobs.jobkit import make_job

pytestmark = pytest.mark.slow

CONSTANT = """
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    return 1.0
"""

# the rollout's index in its group: a group's rewards always differ (a reward by the completion's
# length tied when every reply ran to max_new_tokens in one-character tokens)
BY_INDEX = """
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    return float(ctx.rollout_index)
"""

HYPER = {"steps": 1, "batch_size": 2, "group_size": 4, "max_new_tokens": 12}


def _run(store: Store, home: Settings, root: Path, grader: str) -> int:
    job_id, invalid = create_job(store, make_job(root, grader=grader, hyper=HYPER))
    assert invalid is None, invalid
    assert run_job(store, home, job_id) == "succeeded"
    return job_id


def test_a_constant_grader_job_warns_with_example_trajectories(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    job_file = make_job(tmp_path / "constant", grader=CONSTANT, hyper=HYPER)
    ran = CliRunner().invoke(app, ["run", str(job_file)])  # plugtune run, in the home fixture's store
    assert ran.exit_code == 0, ran.output
    [job] = store.list_jobs()
    job_id = job.id
    assert f"job {job_id} succeeded" in ran.output and "warning: step 1: 2 of 2 groups" in ran.output
    doc = job_document(store, job_id)  # jobs show --json
    [warning] = [w for w in doc["warnings"] if "no gradient" in w]
    assert warning.startswith("step 1: 2 of 2 groups (100%) gave the policy no gradient")
    examples = warning_examples(warning)
    assert examples and all(store.get_trajectory(job_id, t) is not None for t in examples)
    assert doc["metrics"]["groups/zero_variance_share"] == 1.0
    assert doc["metrics"]["trajectories/trained"] == 0 and doc["metrics"]["trajectories/total"] == 8
    shown = CliRunner().invoke(app, ["jobs", "show", str(job_id)])
    assert shown.exit_code == 0 and "warning: step 1: 2 of 2 groups (100%)" in shown.output
    assert examples[0] in shown.output
    client = TestClient(create_app(store), base_url="http://127.0.0.1:8321")
    assert warning in client.get(f"/api/jobs/{job_id}").json()["warnings"]
    html = client.get(f"/jobs/{job_id}").text  # the job page's note links each example
    assert 'id="job-warnings"' in html and "gave the policy no gradient" in html
    for t in examples:
        assert f'href="/jobs/{job_id}/trajectories?t={t}"' in html


def test_a_job_whose_groups_differ_has_no_warning(tmp_path: Path, store: Store, home: Settings) -> None:
    job_id = _run(store, home, tmp_path / "healthy", BY_INDEX)
    doc = job_document(store, job_id)
    assert doc["warnings"] == []
    assert doc["metrics"]["groups/zero_variance_share"] < 0.5
    assert doc["metrics"]["trajectories/trained"] > 0
