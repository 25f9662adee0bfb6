"""Every ``ctx.metric`` of every plugin is kept (issue 24, item 2): a real job whose rollout, grader
and group grader call it stores each step's mean, min, max and count per plugin and name, and
shows them in the curves (a section per plugin), compare, TensorBoard, W&B, ``jobs show --json``
and each trajectory's own values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import run_job
from plugtune.settings import Settings
from plugtune.store import Store
from plugtune.trainer.tracking import TENSORBOARD_DIR
from plugtune.web import create_app
from tests.jobs.jobkit import make_job
from tests.trainer.test_tracking import tensorboard_scalars, wandb_history

pytestmark = pytest.mark.slow

ROLLOUT = """
from plugtune import rollout

@rollout
def answer(ctx, policy, sample):
    reply = policy.chat(sample.messages, temperature=1.0, max_tokens=sample.sampling.max_tokens)
    ctx.metric("turns", 1)
    ctx.metric("chars", len(reply["choices"][0]["message"]["content"]))
    return None
"""

GRADERS = """
from plugtune import grader, group_grader

@grader
def exact(ctx, sample, trajectory):
    ctx.metric("chars_seen", len(trajectory.completion) + 0.5 * ctx.rollout_index)
    return float(len(trajectory.completion) % 3)

@group_grader
def spread(ctx, sample, trajectories):
    ctx.metric("size", len(trajectories))
    return [0.0 for _ in trajectories]
"""

HYPER = {"steps": 2, "batch_size": 2, "group_size": 3, "max_new_tokens": 6}
STATS = ("mean", "min", "max", "count")


def _job(root: Path, extra: dict[str, object] | None = None) -> Path:
    path = make_job(root, rollout=ROLLOUT, grader=GRADERS, hyper=HYPER, extra=extra)
    spec = yaml.safe_load(path.read_text())
    spec["plugins"]["group_graders"] = [{"entry": "plugins/grader.py:spread", "weight": 0.5}]
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _by_step(store: Store, job_id: int, name: str) -> dict[int, float]:
    return {int(p.step or 0): p.value for p in store.metrics(job_id, names=[name]).get(name, [])}


def test_every_ctx_metric_is_aggregated_per_step_and_shown_everywhere(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    job_id, invalid = create_job(
        store, _job(tmp_path / "effects", {"tracking": {"wandb": {"project": "plugtune-test"}}})
    )
    assert invalid is None, invalid
    assert run_job(store, home, job_id) == "succeeded", store.get_job(job_id).error  # type: ignore[union-attr]
    trajectories = store.trajectories(job_id, phase="train", limit=100)
    assert len(trajectories) == 2 * 2 * 3

    # Stored per step, per plugin and name, as the trajectories' own values say.
    for step in (1, 2):
        own = [t for t in trajectories if t.step == step]
        seen = [store.get_trajectory(job_id, t.trajectory_id).metrics for t in own]  # type: ignore[union-attr]
        for plugin, name, values in (
            ("answer", "turns", [m["turns"] for m in seen]),
            ("answer", "chars", [m["chars"] for m in seen]),
            ("exact", "chars_seen", [m["exact/chars_seen"] for m in seen]),
        ):
            got = {s: _by_step(store, job_id, f"metric/{plugin}/{name}/{s}")[step] for s in STATS}
            assert got == pytest.approx(
                {"mean": sum(values) / 6, "min": min(values), "max": max(values), "count": 6}
            ), (plugin, name, step)
        assert {m["spread/size"] for m in seen} == {3.0}  # a group grader's value on each trajectory
        size = {s: _by_step(store, job_id, f"metric/spread/size/{s}")[step] for s in STATS}
        assert size == {"mean": 3.0, "min": 3.0, "max": 3.0, "count": 2.0}  # one call per group

    # jobs show --json: the newest step's aggregates per plugin and name.
    shown = CliRunner().invoke(app, ["jobs", "show", str(job_id), "--json"])
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.output)
    assert set(doc["plugin_metrics"]) == {"answer", "exact", "spread"}
    assert doc["plugin_metrics"]["answer"]["turns"] == {"mean": 1, "min": 1, "max": 1, "count": 6, "step": 2}
    assert doc["plugin_metrics"]["spread"]["size"]["count"] == 2
    assert doc["metrics"]["metric/exact/chars_seen/count"] == 6
    text = CliRunner().invoke(app, ["jobs", "show", str(job_id)]).output
    assert "metric answer turns (step 2): mean 1, min 1, max 1, 6 values" in text
    assert "metric spread size (step 2): mean 3, min 3, max 3, 2 values" in text

    # The curves: a section per plugin, one chart per name with its mean, min and max by step.
    client = TestClient(create_app(store), base_url="http://127.0.0.1:8321")
    charts = client.get(f"/api/jobs/{job_id}/curves").json()["charts"]
    sections = [c["section"] for c in charts if c["section"]]
    assert sorted(set(sections)) == ["Plugin answer", "Plugin exact", "Plugin spread"]
    assert sections == sorted(sections)  # each plugin's charts together, under one heading
    [turns] = [c for c in charts if c["key"] == "metric:answer:turns"]
    assert turns["x"] == "step" and turns["title"] == "turns (6 values in step 2)"
    assert {s["name"]: s["points"] for s in turns["series"]} == {
        "max": [[1.0, 1.0], [2.0, 1.0]],
        "mean": [[1.0, 1.0], [2.0, 1.0]],
        "min": [[1.0, 1.0], [2.0, 1.0]],
    }
    assert not [c for c in charts if c["key"].startswith("metric/")]  # none left as a loose chart

    # The trajectory detail: its own values.
    tid = trajectories[0].trajectory_id
    detail = client.get(f"/api/jobs/{job_id}/trajectories/{tid}").json()
    assert detail["metrics"]["turns"] == 1.0 and "exact/chars_seen" in detail["metrics"]
    assert detail["metrics"]["spread/size"] == 3.0

    # TensorBoard and W&B get the same names, per step.
    folder = home.home / "jobs" / str(job_id)
    scalars = tensorboard_scalars(folder / TENSORBOARD_DIR)
    assert [v for _, v in scalars["metric/answer/turns/count"]] == [6.0, 6.0]
    assert [s for s, _ in scalars["metric/spread/size/mean"]] == [1, 2]
    rows = wandb_history(folder)
    assert [row.get("metric/exact/chars_seen/count") for row in rows] == ["6", "6"]

    # Compare: the mean of each plugin metric, one series per job.
    other, invalid = create_job(store, _job(tmp_path / "again"))
    assert invalid is None and run_job(store, home, other) == "succeeded"
    compared = client.get("/api/compare", params={"ids": f"{job_id},{other}"}).json()["charts"]
    [chart] = [c for c in compared if c["key"] == "metric:exact:chars_seen"]
    assert chart["section"] == "Plugin exact" and len(chart["series"]) == 2
    assert all([p[0] for p in s["points"]] == [1.0, 2.0] for s in chart["series"])
