"""An engine's run recorded as a plugtune job: real plugins in the local runtime, a real store."""

from __future__ import annotations

import pytest

from plugtune.errors import PluginCallError
from plugtune.integrations.recording import EngineRun
from plugtune.sdk import Context, Sample, Trajectory
from plugtune.spec.models import FailurePolicy
from plugtune.store import Store
from tests.integrations.conftest import TASK

GRADERS = [f"{TASK}/plugins/grader.py:exact_match", f"{TASK}/plugins/grader.py:picky"]


def _args(crash: bool) -> tuple[Sample, Trajectory]:
    sample = Sample(messages=[{"role": "user", "content": "1+1=?"}], extra={"answer": "2", "crash": crash})
    reply = {"role": "assistant", "content": "2"}
    return sample, Trajectory(trajectory_id="t-1", messages=[*sample.messages, reply])


def test_a_run_is_a_job_with_its_plugins_code_and_logs(store: Store) -> None:
    run = EngineRun.open(engine="test", graders=GRADERS, store=store)
    exact, picky = run.graders
    assert run.call(exact, Context(step=1), *_args(crash=False)).value == 1.0
    assert run.call(picky, Context(step=1), *_args(crash=False)).value == 0.5
    run.flush(step=1)
    run.close()

    job = store.get_job(run.job_id)
    assert job is not None and job.status == "succeeded"
    plugins = {p.name: p for p in store.list_plugins(run.job_id)}
    assert set(plugins) == {"exact_match", "picky"}
    assert b"def picky" in store.get_code(plugins["picky"].code_hash)["grader.py"]
    assert any("picky scored" in row.message for row in store.logs(run.job_id, plugin="picky"))
    assert [p.value for p in store.metrics(run.job_id)["plugin/calls"]] == [2.0]


def test_a_crash_under_fail_job_ends_the_job_with_the_classified_error(store: Store) -> None:
    policy = FailurePolicy(max_attempts=1, on_exhausted="fail_job")
    run = EngineRun.open(engine="test", graders=GRADERS, store=store, failure_policy=policy)
    with pytest.raises(PluginCallError) as raised:
        run.call(run.graders[1], Context(step=1), *_args(crash=True))
    assert raised.value.cause == "500" and "picky cannot score" in raised.value.message
    run.close()

    job = store.get_job(run.job_id)
    assert job is not None and job.status == "failed"
    assert job.error is not None
    assert (job.error.type, job.error.owner, job.error.cause) == ("Call plugin error", "plugin", "500")
    assert "picky cannot score" in job.error.message and job.error.evidence["plugin"] == "picky"
    assert {p.name: p.status for p in store.list_plugins(run.job_id)}["picky"] == "failed"


def test_a_crash_under_drop_sample_is_raised_and_the_run_goes_on(store: Store) -> None:
    policy = FailurePolicy(max_attempts=2, on_exhausted="drop_sample")
    run = EngineRun.open(engine="test", graders=GRADERS, store=store, failure_policy=policy)
    with pytest.raises(PluginCallError):
        run.call(run.graders[1], Context(step=1), *_args(crash=True))
    assert run.stopped is None
    assert run.call(run.graders[1], Context(step=1), *_args(crash=False)).value == 0.5
    run.flush(step=1)
    run.close()
    job = store.get_job(run.job_id)
    assert job is not None and job.status == "succeeded"
    assert [p.value for p in store.metrics(run.job_id)["plugin/failed_calls"]] == [2.0]
