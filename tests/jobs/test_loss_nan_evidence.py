"""A Loss nan job points at its step's trajectories (issue 24, item 13): the job page's banner
links them and `plugtune doctor` lists them, the largest rewards (the likeliest causes) first."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.jobs.control import create_job
from plugtune.jobs.report import doctor_document
from plugtune.jobs.scheduler import run_job
from plugtune.settings import Settings
from plugtune.store import Store
from plugtune.web import create_app
from tests.jobs.jobkit import make_job

pytestmark = pytest.mark.slow

HUGE = """
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    return 1e308 if ctx.rollout_index == 0 else 0.0
"""


def test_a_loss_nan_jobs_trajectories_are_linked_on_its_page_and_listed_by_doctor(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    # a weight of 10 on rewards near the float maximum overflows the summed reward to inf
    job_id, invalid = create_job(store, make_job(tmp_path / "n", grader=HUGE, grader_weight=10.0))
    assert invalid is None, invalid
    assert run_job(store, home, job_id) == "failed"
    job = store.get_job(job_id)
    assert job is not None and job.error is not None and job.error.type == "Loss nan"
    ids = job.error.evidence["trajectory_ids"]
    assert ids and all(store.get_trajectory(job_id, t) is not None for t in ids)  # each link opens

    html = TestClient(create_app(store), base_url="http://127.0.0.1:8321").get(f"/jobs/{job_id}").text
    banner = html[
        html.index('id="failure-banner"') : html.index("</section>", html.index('id="failure-banner"'))
    ]
    assert "Step&#39;s trajectories" in banner or "Step's trajectories" in banner
    linked = re.findall(rf'href="/jobs/{job_id}/trajectories\?t=([^"]+)"', banner)
    assert linked == ids[:10], (linked, ids)

    batch = doctor_document(store, job_id)["loss_nan_batch"]
    assert sorted(b["trajectory_id"] for b in batch) == sorted(ids)
    assert batch[0]["reward"] is not None and abs(batch[0]["reward"]) > 1e300  # the culprit first
    said = CliRunner().invoke(app, ["doctor", str(job_id)]).output
    assert f"the {len(ids)} trajectories of step 1, the largest rewards first:" in said, said
    assert f"    {batch[0]['trajectory_id']} (reward " in said
