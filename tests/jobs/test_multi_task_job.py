"""A real multi-task job (issue 27 item 5): the demo model, rows of two tasks whose graders differ
(one always 1.0, one always 0.0, one crashing on a row), each row scored by its own task's grader,
and each task's reward, failures and signal health kept apart wherever the job is shown: the stored
metrics, ``jobs show``, the job page's curves, compare, and ``plugtune test`` trying each task."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import run_job
from plugtune.pretest import command as pretest
from plugtune.pretest.regrade import regrade
from plugtune.pretest.replay import replay
from plugtune.settings import Settings
from plugtune.store import Store
from plugtune.web import create_app
from tests.jobs.jobkit import make_job

pytestmark = pytest.mark.slow

TASK_GRADERS = """
from plugtune import grader

@grader
def always_one(ctx, sample, trajectory):
    ctx.logger.info("always_one graded %s", sample.extra["tag"])
    return 1.0

@grader
def always_zero(ctx, sample, trajectory):
    ctx.logger.info("always_zero graded %s", sample.extra["tag"])
    if sample.extra.get("crash"):
        raise RuntimeError("the code grader crashed on purpose")
    return 0.0
"""

ROWS = [
    {
        "messages": [{"role": "user", "content": "1+1?"}],
        "extra": {"tag": "math", "answer": "2"},
        "task": "math",
    },
    {
        "messages": [{"role": "user", "content": "def f"}],
        "extra": {"tag": "code", "answer": "x"},
        "task": "code",
    },
    {
        "messages": [{"role": "user", "content": "2+2?"}],
        "extra": {"tag": "math", "answer": "4"},
        "task": "math",
    },
    {
        "messages": [{"role": "user", "content": "def g"}],
        "extra": {"tag": "code", "answer": "y", "crash": True},
        "task": "code",
    },
]
TASKS = {
    "math": {"graders": [{"entry": "plugins/tasks.py:always_one"}]},
    "code": {"graders": [{"entry": "plugins/tasks.py:always_zero"}]},
}
HYPER = {"steps": 2, "batch_size": 4, "group_size": 2, "max_new_tokens": 4}


def multi_task_job(root: Path, *, top_level_graders: bool = True) -> Path:
    job = make_job(root, rows=ROWS, hyper=HYPER, extra={"tasks": TASKS})
    (root / "plugins" / "tasks.py").write_text(TASK_GRADERS)
    spec = yaml.safe_load(job.read_text())  # a failed grader call drops its trajectory (counted as failed)
    spec["failure_policy"] = {"max_attempts": 1, "on_exhausted": "drop_sample"}
    if not top_level_graders:  # every row names a task: no default plugin set is needed
        del spec["plugins"]["graders"]
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    return job


def newest(store: Store, job_id: int) -> dict[str, float]:
    return {m.name: m.value for m in store.latest_metrics([job_id], plugin="")}


def test_a_two_task_job_scores_each_row_by_its_task_and_keeps_each_tasks_numbers(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    job_id, invalid = create_job(store, multi_task_job(tmp_path / "mix"))
    assert invalid is None, invalid
    assert run_job(store, home, job_id) == "succeeded"

    # each row's trajectories were graded by its task's grader only
    listed = store.trajectories(job_id, limit=100)
    assert len(listed) == 16  # 2 steps x 4 rows x group_size 2
    records = store.trajectory_records(job_id, [t.trajectory_id for t in listed])
    for r in records:
        task = ROWS[r.sample_index]["task"]
        graded = set(r.reward_components)
        assert graded <= {"always_one" if task == "math" else "always_zero"}, (task, graded)
        if task == "math":
            assert r.status == "success" and r.reward == 1.0
    logs = [line.message for line in store.logs(job_id, limit=200)]
    assert any(m == "always_one graded math" for m in logs) and any(
        m == "always_zero graded code" for m in logs
    )
    assert not any(m in ("always_one graded code", "always_zero graded math") for m in logs)
    # plugins of both tasks were deployed (besides the top-level set)
    assert {"answer", "exact", "always_one", "always_zero"} <= {p.name for p in store.list_plugins(job_id)}

    # per-task reward curves that differ, failures per task, signal health per task
    m = newest(store, job_id)
    assert m["task/math/reward/mean"] == 1.0 and m["task/code/reward/mean"] == 0.0
    assert 0.0 < m["reward/mean"] < 1.0  # the mix's one number hides both
    assert m["task/code/trajectories/failed"] == 2.0 and m["task/code/plugin/errors/500"] == 2.0
    assert m["task/math/trajectories/failed"] == 0.0
    assert m["task/math/groups/zero_variance_share"] == 1.0
    series = store.metrics(job_id, "", ["task/math/reward/mean", "task/code/reward/mean"])
    assert [p.step for p in series["task/math/reward/mean"]] == [1, 2]

    # jobs show: one line per task, and each task's own warning
    shown = CliRunner().invoke(app, ["jobs", "show", str(job_id)])
    assert shown.exit_code == 0, shown.output
    assert "task math: reward/mean=1, failed 0 of 4 trajectories, no-gradient groups 100%" in shown.output
    assert "task code: reward/mean=0, failed 2 of 4 trajectories (500 2)" in shown.output
    assert (
        "warning: task math: step" in shown.output and "task/math/groups/zero_variance_share" in shown.output
    )

    # the job page's curves: a series per task
    client = TestClient(create_app(store), base_url="http://127.0.0.1:8321")
    curves = {c["key"]: c for c in client.get(f"/api/jobs/{job_id}/curves").json()["charts"]}
    reward = {s["name"]: [v for _, v in s["points"]] for s in curves["task_reward"]["series"]}
    assert reward["math"] == [1.0, 1.0] and reward["code"] == [0.0, 0.0]
    failures = {s["name"] for s in curves["task_failures"]["series"]}
    assert {"code: failed", "code: failed: 500", "math: failed"} <= failures
    assert {s["name"] for s in curves["task_signal"]["series"]} >= {"math: groups/zero_variance_share"}
    assert not [k for k in curves if k.startswith("metric:task")]  # no task metric left to an extra chart

    # plugtune regrade: each trajectory re-graded by its own task's graders only (nothing flips)
    report = regrade(store, job_id, save=True, label="again")
    assert report["regraded"] == 16 and report["counts"]["unchanged"] == 16, report
    for stored in store.regrades(job_id, "again"):
        task = ROWS[int(stored.trajectory_id.split("-p")[1].split("-")[0])]["task"]
        assert stored.graders == ["always_one" if task == "math" else "always_zero"], stored

    # plugtune replay: a trajectory replayed with its own task's plugins only
    math_one = next(r for r in records if ROWS[r.sample_index]["task"] == "math")
    replayed = replay(store, job_id, math_one.trajectory_id)
    assert replayed["reproduced"], replayed["verdict"]
    assert {c["name"] for c in replayed["calls"]} == {"answer", "always_one"}

    # compare: per-task curves, one series per job and task
    # (the second job has no top-level graders: every row names a task)
    other = run_job(
        store, home, create_job(store, multi_task_job(tmp_path / "again", top_level_graders=False))[0]
    )
    assert other == "succeeded"
    assert newest(store, job_id + 1)["task/math/reward/mean"] == 1.0
    assert "exact" not in {p.name for p in store.list_plugins(job_id + 1)}
    compared = client.get(f"/api/compare?ids={job_id},{job_id + 1}").json()
    by_key = {c["key"]: c for c in compared["charts"]}
    names = {s["name"] for s in by_key["task_reward"]["series"]}
    assert {f"#{job_id} mix · math", f"#{job_id} mix · code", f"#{job_id + 1} again · math"} <= names


def test_a_job_without_tasks_draws_no_task_chart(tmp_path: Path, store: Store, home: Settings) -> None:
    job_id, invalid = create_job(store, make_job(tmp_path / "plain", hyper={"steps": 1}))
    assert invalid is None and run_job(store, home, job_id) == "succeeded"
    assert not [n for n in newest(store, job_id) if n.startswith("task/")]
    client = TestClient(create_app(store), base_url="http://127.0.0.1:8321")
    keys = {c["key"] for c in client.get(f"/api/jobs/{job_id}/curves").json()["charts"]}
    assert not [k for k in keys if k.startswith("task_")]


def test_plugtune_test_tries_each_tasks_plugin_set(tmp_path: Path) -> None:
    job = multi_task_job(tmp_path / "pretest", top_level_graders=False)
    doc: dict[str, Any] = pretest.local_test(
        pretest.TestOptions(job_file=str(job), samples=2)
    )  # plugtune test --samples 2
    graded = {(c["name"], ROWS[c["sample_index"]]["task"]) for c in doc["calls"] if c["kind"] == "grader"}
    assert graded == {("always_one", "math"), ("always_zero", "code")}  # 2 rows: one of each task


def test_grader_fixtures_reach_each_tasks_graders(tmp_path: Path) -> None:
    job = multi_task_job(tmp_path / "fixtures")
    fixtures = tmp_path / "fixtures.jsonl"
    lines = [
        {"row": 0, "completion": "2", "expect": 1.0, "grader": "always_one"},
        {"row": 1, "completion": "x", "expect": 0.0, "grader": "always_zero"},
    ]
    fixtures.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    ran = CliRunner().invoke(app, ["test", str(job), "--expect", str(fixtures)])  # plugtune test --expect
    assert ran.exit_code == 0, ran.output
    assert "2 of 2 fixtures passed" in ran.output
