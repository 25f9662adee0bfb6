"""A job with data.validation evaluates it before training (step 0), every eval_every_n_steps and at
the end, through its own plugins and gateway: eval trajectories (phase eval), eval/* metrics, and
`plugtune eval` alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.settings import Settings
from plugtune.store import Store
from plugtune.trainer.evaluation import pass_at_k
from plugtune.trainer.tracking import TENSORBOARD_DIR
from plugtune.web import create_app
from tests.jobs.jobkit import ROWS, make_job
from tests.trainer.test_tracking import tensorboard_scalars

pytestmark = pytest.mark.slow
runner = CliRunner()

# Samples with what the sample says (greedy in eval's pass@1 rows) and says what it was given.
ROLLOUT = """
from plugtune import rollout

@rollout
def answer(ctx, policy, sample):
    s = sample.sampling
    policy.chat(sample.messages, temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens)
    ctx.metric("temperature", s.temperature)
    ctx.metric("eval", 1.0 if ctx.phase == "eval" else 0.0)
    return None
"""

# A reward that varies with the reply, so that some replies pass and some do not.
GRADER = """
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    return 1.0 if len(trajectory.completion) % 2 == 0 else 0.0
"""

VALIDATION = ROWS[:3]


def _eval_job(root: Path, *, rollout: str = ROLLOUT, failure: str = "fail_job") -> Path:
    job_file = make_job(
        root,
        rollout=rollout,
        grader=GRADER,
        hyper={"steps": 3, "eval_every_n_steps": 2, "temperature": 1.0},
        extra={
            "data": {"train": "data/train.jsonl", "validation": "data/val.jsonl"},
            "eval": {"k": 2, "samples": 3},
            "failure_policy": {"max_attempts": 1, "on_exhausted": failure},
        },
    )
    (root / "data" / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in VALIDATION))
    return job_file


def _by_step(store: Store, name: str) -> dict[int, float]:
    return {
        p.step: p.value for p in store.metrics(1, "", max_points=1000).get(name, []) if p.step is not None
    }


def test_a_job_evaluates_its_validation_rows_at_the_right_steps_and_plugtune_eval_alone(
    tmp_path: Path, home: Settings
) -> None:
    job_file = _eval_job(tmp_path / "evaljob")
    result = runner.invoke(app, ["run", str(job_file)])
    assert result.exit_code == 0, result.output

    store = Store.open(home.database_url)
    try:
        pass1, passk = _by_step(store, "eval/pass@1"), _by_step(store, "eval/pass@k")
        # the initial model (step 0), every 2 steps, and after the last one
        assert sorted(pass1) == sorted(passk) == [0, 2, 3]
        assert sorted(_by_step(store, "eval/reward/exact")) == [0, 2, 3]
        assert set(_by_step(store, "eval/response_length")) == {0, 2, 3}
        # 3 rows x (1 + 3), x2 plugins
        assert _by_step(store, "eval/plugin/calls") == {0: 24.0, 2: 24.0, 3: 24.0}

        evals = store.trajectories(1, phase="eval", limit=100)
        trains = store.trajectories(1, phase="train", limit=100)
        assert len(evals) == 3 * 3 * (1 + 3) and all(t.phase == "eval" for t in evals)
        assert len(trains) == 3 * 2 * 2 and all(t.phase == "train" for t in trains)
        assert store.count_trajectories(1, phase="eval", step=0) == 12
        assert store.count_trajectories(1, phase="eval", step=2) == 12
        baseline = store.trajectories(1, phase="eval", step=0, limit=100)
        versions = {
            r.policy_version for r in store.trajectory_records(1, [t.trajectory_id for t in baseline])
        }
        assert versions == {0}  # sampled from the weights before any step
        records = store.trajectory_records(1, [t.trajectory_id for t in evals])
        for r in records:
            assert r.status == "success", r.errors  # greedy requests were not refused by the gateway
            assert r.metrics["eval"] == 1.0 and r.advantage is None
            greedy = r.group_id.startswith("eval-greedy-")
            assert r.metrics["temperature"] == (0.0 if greedy else 1.0)
        assert all(
            r.metrics["eval"] == 0.0 for r in store.trajectory_records(1, [t.trajectory_id for t in trains])
        )

        for step in (0, 2, 3):  # the stored metrics are the estimator over the stored rewards
            mine = [r for r in records if r.step == step]
            greedy = [r for r in mine if r.group_id.startswith("eval-greedy-")]
            assert pass1[step] == pytest.approx(sum(r.reward == 1.0 for r in greedy) / len(greedy))
            rows: dict[str, list[Any]] = {}
            for r in mine:
                if r.group_id.startswith("eval-sampled-"):
                    rows.setdefault(r.group_id, []).append(r.reward)
            assert len(rows) == 3 and all(len(v) == 3 for v in rows.values())
            expected = [pass_at_k(3, sum(x == 1.0 for x in v), 2) for v in rows.values()]
            assert passk[step] == pytest.approx(sum(expected) / 3)
        _console_shows_eval(store)
    finally:
        store.close()

    # a job with no tracking section still writes TensorBoard event files: training and eval curves
    scalars = tensorboard_scalars(home.home / "jobs" / "1" / TENSORBOARD_DIR)
    assert [step for step, _ in scalars["reward/mean"]] == [1, 2, 3]
    assert [step for step, _ in scalars["eval/pass@1"]] == [0, 2, 3]
    assert [value for _, value in scalars["eval/pass@k"]] == pytest.approx([passk[s] for s in (0, 2, 3)])

    final = home.home / "jobs" / "1" / "final"
    alone = runner.invoke(app, ["eval", str(final), str(job_file)])
    assert alone.exit_code == 0, alone.output
    assert f"model: {final}" in alone.output
    assert "pass@2 of 3 sampled at temperature 1" in alone.output
    for name in ("eval/pass@1", "eval/pass@k", "eval/reward/exact", "eval/response_length"):
        assert name in alone.output
    as_json = json.loads(runner.invoke(app, ["eval", str(final), str(job_file), "--json"]).stdout)
    assert as_json["metrics"]["eval/rows"] == 3
    # the greedy replies of the same weights are the same: pass@1 repeats exactly
    assert as_json["metrics"]["eval/pass@1"] == pytest.approx(pass1[3])


def _console_shows_eval(store: Store) -> None:
    client = TestClient(create_app(store), base_url="http://127.0.0.1:8321")
    listed = client.get("/api/jobs/1/trajectories", params={"phase": "eval", "limit": 500})
    assert listed.status_code == 200, listed.text
    items = listed.json()["items"]
    assert len(items) == 36 and {t["phase"] for t in items} == {"eval"}
    assert {
        t["phase"] for t in client.get("/api/jobs/1/trajectories", params={"limit": 500}).json()["items"]
    } == {
        "train",
        "eval",
    }
    bad = client.get("/api/jobs/1/trajectories", params={"phase": "test"})
    assert bad.status_code == 400 and "phase" in bad.text and "eval" in bad.text
    detail = client.get(f"/api/jobs/1/trajectories/{items[0]['id']}").json()
    assert detail["phase"] == "eval"
    page = client.get("/jobs/1/trajectories", params={"phase": "eval"})
    assert page.status_code == 200 and 'value="eval" selected' in page.text
    assert page.text.count('<span class="badge">eval</span>') == min(36, page.text.count("data-open="))
    charts = {c["key"]: c for c in client.get("/api/jobs/1/curves").json()["charts"]}
    names = {s["name"]: [x for x, _ in s["points"]] for s in charts["eval_pass"]["series"]}
    assert names == {"pass@1 (greedy)": [0, 2, 3], "pass@k (sampled)": [0, 2, 3]}  # starts at step 0
    assert {s["name"] for s in charts["eval_reward"]["series"]} == {"mean", "exact"}
    assert "eval/pass@1" not in charts  # claimed by the eval charts, not one chart per name


HARDCODED_TEMPERATURE = """
from plugtune import rollout

@rollout
def answer(ctx, policy, sample):
    policy.chat(sample.messages, temperature=1.0, max_tokens=sample.sampling.max_tokens)
    return None
"""


def test_a_rollout_that_overrides_the_greedy_eval_temperature_is_told_so(
    tmp_path: Path, home: Settings
) -> None:
    job_file = _eval_job(tmp_path / "hardcoded", rollout=HARDCODED_TEMPERATURE, failure="drop_sample")
    spec = yaml.safe_load(job_file.read_text())
    spec["hyperparameters"].update(steps=1, eval_every_n_steps=1)
    job_file.write_text(yaml.safe_dump(spec))
    result = runner.invoke(app, ["run", str(job_file)])
    assert result.exit_code == 0, result.output
    store = Store.open(home.database_url)
    try:
        greedy = [
            t for t in store.trajectories(1, phase="eval", limit=100) if t.group_id.startswith("eval-greedy")
        ]
        assert len(greedy) == 2 * 3 and all(t.status == "failed" for t in greedy)  # steps 0 and 1
        [record] = store.trajectory_records(1, [greedy[0].trajectory_id])
        assert "conflicts with greedy evaluation (eval/pass@1), which samples with temperature=0" in (
            record.errors[0].message
        )
        assert store.count_trajectories(1, phase="eval", status="success") == 2 * 3 * 3  # sampled rows ran
        assert _by_step(store, "eval/unscored") == {0: 3.0, 1: 3.0}
        assert _by_step(store, "eval/pass@1") == {}  # nothing greedy was scored: no point, not a 0
        assert store.count_trajectories(1, phase="train", status="success") == 4  # training unaffected
    finally:
        store.close()


BROKEN_IN_TRAINING = """
import os
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    if ctx.phase == "train" and os.environ["PT_BROKEN"] == "1":
        raise ValueError("broken on purpose")
    return 1.0 if len(trajectory.completion) % 2 == 0 else 0.0
"""


def test_a_retry_without_a_checkpoint_evaluates_the_initial_model_once_more_not_twice(
    tmp_path: Path, store: Store, home: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from plugtune.jobs.control import create_job, retry_job
    from plugtune.jobs.scheduler import run_job

    root = tmp_path / "again"
    job_file = _eval_job(root)
    (root / "plugins" / "grader.py").write_text(BROKEN_IN_TRAINING)
    spec = yaml.safe_load(job_file.read_text())
    spec["secrets"] = ["PT_BROKEN"]  # read from the attempt's environment at every attempt
    job_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    monkeypatch.setenv("PT_BROKEN", "1")
    job_id, _ = create_job(store, job_file)
    assert run_job(store, home, job_id) == "failed"  # step 1's grader: after step 0's evaluation
    assert store.count_trajectories(job_id, phase="eval", step=0) == 12
    assert store.latest_checkpoint(job_id) is None
    monkeypatch.setenv("PT_BROKEN", "0")  # the fault is gone (the code that runs is the submitted one)
    retry_job(store, job_id)
    assert run_job(store, home, job_id) == "succeeded"
    # the earlier attempt's step-0 evaluation was forgotten and run again: one set, one point
    assert store.count_trajectories(job_id, phase="eval", step=0) == 12
    points = [p for p in store.metrics(job_id, "", max_points=1000)["eval/pass@1"] if p.step == 0]
    assert len(points) == 1
