"""A job that stops mid-step keeps every trajectory of that step, each with its status and error,
and a plugin's own Status.FAILURE is reported as such (real jobs: attempt process, runtime, store)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.errors import HINTS, StatusCause
from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import AttemptRunner, run_job
from plugtune.settings import Settings
from plugtune.store import Store
from plugtune.web import create_app
from tests.jobs.jobkit import make_job

pytestmark = pytest.mark.slow

REASON = "the calculator tool answered HTTP 503"

# r0 ends at once, r1 reports failure itself after a second, r2 is still running when the job stops.
VERDICT = f"""
import time
from plugtune import RolloutResult, Status, rollout

@rollout
def answer(ctx, policy, sample):
    policy.chat(sample.messages, max_tokens=2)
    ctx.logger.info("rolled out %s", ctx.trajectory_id)
    if ctx.rollout_index == 1:
        time.sleep(1.0)
        return RolloutResult(status=Status.FAILURE, reason="{REASON}")
    if ctx.rollout_index == 2:
        time.sleep(30)
    return None
"""


def _log_trajectories(store: Store, job_id: int) -> set[str]:
    return {line.trajectory_id for line in store.logs(job_id, limit=1000) if line.trajectory_id}


def test_status_failure_is_the_plugins_verdict_and_the_whole_step_is_kept(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    job_file = make_job(tmp_path / "verdict", rollout=VERDICT, hyper={"group_size": 3})
    job_id, invalid = create_job(store, job_file)
    assert invalid is None, invalid
    assert run_job(store, home, job_id) == "failed"

    job = store.get_job(job_id)
    assert job is not None and job.error is not None
    error = job.error
    assert (error.type, error.owner, error.cause) == ("Call plugin error", "plugin", "Status failure")
    assert REASON in error.message and "returned Status.FAILURE" in error.message
    assert error.hint == HINTS[StatusCause.FAILURE]
    assert error.evidence.get("plugin") == "answer" or "answer" in error.message

    # every trajectory of step 1 is stored: the finished, the failing and the unfinished ones
    rows = {t.trajectory_id: t for t in store.trajectories(job_id, limit=100)}
    assert len(rows) == 2 * 3, sorted(rows)
    assert _log_trajectories(store, job_id) <= set(rows), "a log line links to a trajectory never stored"
    by_index: dict[int, list[str]] = {}
    for t in rows.values():
        by_index.setdefault(t.rollout_index, []).append(t.status)
        assert t.discard_reason.startswith("step 1 was not applied (the job stopped: Call plugin error: ")
    assert by_index[0] == ["success", "success"] and set(by_index[2]) == {"failed"}
    records = store.trajectory_records(job_id, list(rows))
    causes = {r.trajectory_id: [e.cause for e in r.errors] for r in records}
    failing = [tid for tid, c in causes.items() if c == ["Status failure"]]
    assert len(failing) >= 1
    failed = next(r for r in records if r.trajectory_id == failing[0])
    assert REASON in failed.errors[0].message and failed.errors[0].plugin == "answer"
    assert failed.code_hash.get("answer")  # the code that ran, for the Plugin tab and replay
    for r in records:
        if r.rollout_index == 2:  # still running: failed, the job's error named
            assert r.stop_reason == "job stopped" and causes[r.trajectory_id] == ["step stopped"]
            assert "Status failure" in r.errors[0].message
            assert r.errors[0].type == "Call plugin error" and r.messages

    # the same everywhere a user looks: jobs show, trajectories, the API and the console
    shown = CliRunner().invoke(app, ["jobs", "show", str(job_id)])
    assert "Call plugin error (plugin): Status failure" in shown.output and REASON in shown.output
    assert "raised an exception" not in shown.output
    listed = CliRunner().invoke(app, ["trajectories", str(job_id)])
    assert listed.exit_code == 0 and "step 1 was not applied" in listed.output
    assert "Status failure" in listed.output and "step stopped" in listed.output
    as_json = json.loads(CliRunner().invoke(app, ["trajectories", str(job_id), "--json"]).stdout)
    assert all(t["discard_reason"] for t in as_json["trajectories"])
    client = TestClient(create_app(store), base_url="http://127.0.0.1:8321")
    api = client.get(f"/api/jobs/{job_id}").json()["job"]["error"]
    assert (api["cause"], api["owner"], api["plugin"]) == ("Status failure", "plugin", "answer")
    assert REASON in api["message"] and api["hint"] == HINTS[StatusCause.FAILURE]
    page = client.get(f"/jobs/{job_id}")
    assert "Status failure" in page.text and REASON in page.text
    detail = client.get(f"/api/jobs/{job_id}/trajectories/{failing[0]}").json()
    assert detail["errors"][0]["cause"] == "Status failure" and detail["discard_reason"]
    summaries = client.get(f"/api/jobs/{job_id}/trajectories").json()["items"]
    assert len(summaries) == 6 and all(s["discard_reason"] for s in summaries)


SLEEPY = """
import time
from plugtune import rollout

@rollout
def answer(ctx, policy, sample):
    policy.chat(sample.messages, max_tokens=2)
    ctx.logger.info("rolled out %s", ctx.trajectory_id)
    time.sleep(0 if ctx.rollout_index == 0 else 30)
"""


def test_a_job_cancelled_mid_step_keeps_every_trajectory_of_it(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    job_id, _ = create_job(store, make_job(tmp_path / "cancel", rollout=SLEEPY, hyper={"steps": 3}))
    runner = AttemptRunner(store, home)
    deadline = time.monotonic() + 120

    def cancel_once_every_rollout_logged(jid: int) -> None:
        if len(_log_trajectories(store, jid)) >= 4 or time.monotonic() > deadline:
            runner.cancel()

    assert (
        run_job(store, home, job_id, runner=runner, progress=cancel_once_every_rollout_logged) == "cancelled"
    )
    rows = {t.trajectory_id: t for t in store.trajectories(job_id, limit=100)}
    assert len(rows) == 2 * 2 and _log_trajectories(store, job_id) <= set(rows)
    for t in rows.values():
        assert t.discard_reason == "step 1 was not applied (the job was cancelled)"
        assert t.status == ("success" if t.rollout_index == 0 else "failed")
        assert t.stop_reason != "job cancelled" if t.rollout_index == 0 else t.stop_reason == "job cancelled"
    assert store.list_attempts(job_id)[-1].status == "cancelled"


def test_no_plugin_stays_running_after_its_attempt_process_is_killed(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    job_file = make_job(
        tmp_path / "killed",
        rollout=SLEEPY,
        hyper={"steps": 3},
        extra={"retry": {"platform_delay_s": 0.5, "max_auto_retries": 0}},
    )
    job_id, _ = create_job(store, job_file)
    seen: set[str] = set()
    deadline = time.monotonic() + 120

    def kill_once_deployed(jid: int) -> None:
        statuses = {p.status for p in store.list_plugins(jid)}
        seen.update(statuses)
        attempts = store.list_attempts(jid)
        if attempts and attempts[-1].pid and (statuses == {"running"} or time.monotonic() > deadline):
            os.kill(attempts[-1].pid, signal.SIGKILL)

    assert run_job(store, home, job_id, progress=kill_once_deployed) == "failed"
    assert "running" in seen
    job = store.get_job(job_id)
    assert job is not None and job.error is not None and job.error.type == "internal error"
    plugins = store.list_plugins(job_id)
    assert {p.status for p in plugins} == {"completed"} and all(p.ended_at for p in plugins)


EVAL_VERDICT = f"""
import time
from plugtune import RolloutResult, Status, rollout

@rollout
def answer(ctx, policy, sample):
    policy.chat(sample.messages, max_tokens=2)
    ctx.logger.info("rolled out %s", ctx.trajectory_id)
    if ctx.phase == "eval" and sample.index == 0 and ctx.rollout_index == 0:
        return RolloutResult(status=Status.FAILURE, reason="{REASON}")
    if ctx.phase == "eval":
        time.sleep(30)
"""


def test_an_evaluation_that_stops_the_job_keeps_every_trajectory_of_it(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    from tests.jobs.test_eval_job import _eval_job

    job_id, _ = create_job(store, _eval_job(tmp_path / "evalstop", rollout=EVAL_VERDICT))
    assert run_job(store, home, job_id) == "failed"
    job = store.get_job(job_id)
    assert job is not None and job.error is not None and job.error.cause == "Status failure"
    rows = {t.trajectory_id: t for t in store.trajectories(job_id, phase="eval", limit=100)}
    # rows 0 and 1 were in flight (batch_size rows at a time), each one greedy reply and three
    # sampled; row 2 never started, so it has neither trajectories nor log lines
    assert len(rows) == 2 * (1 + 3) and {t.sample_index for t in rows.values()} == {0, 1}
    assert _log_trajectories(store, job_id) <= set(rows)
    assert all(t.discard_reason.startswith("its evaluation after step 0 was stopped") for t in rows.values())
    records = store.trajectory_records(job_id, list(rows))
    assert any([e.cause for e in r.errors] == ["Status failure"] for r in records)
    assert all(r.errors and r.stop_reason == "job stopped" for r in records)
