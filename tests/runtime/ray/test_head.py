"""A Ray head lost mid-job is the platform's ``internal error`` (retried automatically), never a
plugin's EOF: the job runs on a cluster of its own whose head the test kills during step 2."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import run_job
from plugtune.runtime.ray import LocalCluster
from plugtune.settings import Settings
from plugtune.store import Store
from tests.runtime.ray.test_job import job_on

pytestmark = pytest.mark.slow

SLOW_ROLLOUT = """
import time
from plugtune import rollout

@rollout
def answer(ctx, policy, sample):
    if ctx.step >= 2:
        time.sleep(2.0)  # in flight on the head's actors when the head goes
    policy.chat(sample.messages, max_tokens=sample.sampling.max_tokens)
"""


@pytest.fixture
def doomed() -> Iterator[LocalCluster]:
    """A one-node cluster (the head, two CPUs) for this test alone."""
    cluster = LocalCluster()
    try:
        cluster.start_head(num_cpus=2)
        yield cluster
    finally:
        cluster.stop()
    assert not cluster.processes()


def test_a_head_lost_mid_job_is_an_internal_error_retried_automatically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, doomed: LocalCluster
) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("PLUGTUNE_HOME", str(state))
    monkeypatch.setenv("PLUGTUNE_DATABASE_URL", f"sqlite:///{state / 'plugtune.db'}")
    monkeypatch.setenv("PLUGTUNE_RAY_ADDRESS", doomed.address)
    home = Settings.from_env()
    store = Store.open(home.database_url)
    job_id, invalid = create_job(
        store, job_on(tmp_path / "job", "ray", rollout=SLOW_ROLLOUT, hyper={"steps": 4})
    )
    assert invalid is None, invalid
    killed: list[bool] = []

    def kill_the_head_in_step_2(jid: int) -> None:
        job = store.get_job(jid)
        if not killed and job is not None and job.steps_done >= 1:
            killed.append(True)
            doomed.stop()

    try:
        status = run_job(store, home, job_id, progress=kill_the_head_in_step_2, wait_for_retries=False)
        assert killed, "the head was killed mid-job"
        assert status == "failed"
        job = store.get_job(job_id)
        assert job is not None and job.error is not None
        error = job.error.to_dict()
        assert (error["type"], error["owner"]) == ("internal error", "platform"), error
        assert "Ray cluster" in error["message"] and doomed.address in error["message"], str(error)[-4000:]
        assert "Traceback" not in error["message"]
        assert job.next_retry_at is not None, "a platform error is retried automatically"
    finally:
        store.close()
