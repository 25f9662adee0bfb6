"""failure_policy.group in a real job (plugtune's trainer through the scheduler): a group with too
few scored trajectories is dropped, its trajectories say why and the step counts it."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import run_job
from plugtune.settings import Settings
from plugtune.store import Store
from tests.jobs.jobkit import make_job

pytestmark = pytest.mark.slow

FIRST_UNSCORABLE = """
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    return None if ctx.rollout_index == 0 else 1.0
"""


def test_a_job_drops_the_groups_its_group_rule_drops(tmp_path: Path, store: Store, home: Settings) -> None:
    policy = {"max_attempts": 1, "on_exhausted": "fail_job", "group": {"min_scored": 2}}
    job = make_job(tmp_path, grader=FIRST_UNSCORABLE, hyper={"steps": 1}, extra={"failure_policy": policy})
    job_id, invalid = create_job(store, job)
    assert invalid is None, invalid
    run_job(store, home, job_id)

    assert store.metrics(job_id)["groups/dropped_by_rule"][0].value == 2  # both groups of the step
    trajectories = store.trajectories(job_id, limit=100)
    records = store.trajectory_records(job_id, [t.trajectory_id for t in trajectories])
    assert len(records) == 4 and {r.status for r in records} == {"discard"}
    why = "1 of its 2 trajectories scored, fewer than min_scored 2"
    assert {r.discard_reason for r in records} == {f"its group was dropped by failure_policy.group: {why}"}
