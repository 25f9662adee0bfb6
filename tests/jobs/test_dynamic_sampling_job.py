"""hyperparameters.dynamic_sampling in a real job (plugtune's trainer through the scheduler): the
step's flat groups are stored as discard saying why, the batch is refilled, the counts are stored
per step, the console draws them and ``plugtune run``'s bar line shows them."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugtune.jobs.control import create_job
from plugtune.jobs.progress import _summary
from plugtune.jobs.scheduler import run_job
from plugtune.settings import Settings
from plugtune.store import Store
from plugtune.web.charts import training_charts
from tests.jobs.jobkit import ROWS, make_job

pytestmark = pytest.mark.slow

FLAT_UNLESS_VARIED = """
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    return float(ctx.rollout_index) if sample.extra.get("varied") else 0.5
"""


def test_a_job_leaves_flat_groups_out_and_refills_its_batch(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    rows = [{**row, "extra": {**row["extra"], "varied": i in (1, 4)}} for i, row in enumerate(ROWS)]
    hyper = {"steps": 1, "dynamic_sampling": True, "max_extra_batches": 4}
    job_id, invalid = create_job(store, make_job(tmp_path, grader=FLAT_UNLESS_VARIED, hyper=hyper, rows=rows))
    assert invalid is None, invalid
    run_job(store, home, job_id)

    latest = {m.name: m.value for m in store.latest_metrics([job_id], plugin="")}
    assert latest["dynamic_sampling/kept_groups"] == 2 and "loss" in latest
    filtered, extra = latest["dynamic_sampling/filtered_groups"], latest["dynamic_sampling/extra_groups"]
    trajectories = store.trajectories(job_id, limit=100)
    records = store.trajectory_records(job_id, [t.trajectory_id for t in trajectories])
    assert len(records) == 2 * (2 + extra) == latest["trajectories/total"]
    dropped = [r for r in records if r.status == "discard"]
    assert len({r.group_id for r in dropped}) == filtered and len(dropped) == 2 * filtered
    assert {r.discard_reason for r in dropped} == {
        "its group was dropped by dynamic sampling: every scored trajectory had reward 0.5 (zero variance)"
    }
    assert {rows[r.sample_index]["extra"]["varied"] for r in records if r.status == "success"} == {True}
    assert latest["dynamic_sampling/extra_rollouts"] == 2 * extra
    assert filtered >= 1  # seed 0 draws rows 2 and 3 first, both flat
    assert f"filtered {filtered:.0f} (+{2 * extra:.0f} rollouts)" in _summary(latest, 0)
    chart = next(c for c in training_charts(store, job_id, "succeeded") if c.key == "dynamic_sampling")
    assert {s.name for s in chart.series} == {
        "filtered_groups",
        "extra_groups",
        "extra_rollouts",
        "kept_groups",
    }
    warnings = [line.message for line in store.logs(job_id) if "dynamic sampling" in line.message]
    assert warnings == []  # the batch was filled


def test_a_job_without_it_has_no_dynamic_sampling_chart(tmp_path: Path, store: Store, home: Settings) -> None:
    job_id, invalid = create_job(store, make_job(tmp_path, hyper={"steps": 1}))
    assert invalid is None, invalid
    run_job(store, home, job_id)
    keys = [c.key for c in training_charts(store, job_id, "succeeded")]
    assert "reward" in keys and "dynamic_sampling" not in keys
