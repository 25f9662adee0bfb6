"""``trainer: trl``: every ``ctx.metric`` of the rollout and the graders is aggregated per step,
plugin and name, stored and written to TensorBoard, as in a native job (issue 24, item 2)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from plugtune.jobs.report import job_document
from plugtune.settings import Settings
from plugtune.store import Store
from plugtune.trainer.tracking import TENSORBOARD_DIR
from tests.integrations.conftest import TASK
from tests.trainer.test_tracking import tensorboard_scalars

pytest.importorskip("trl")

MEASURED = """
    ctx.metric("answer_chars", len(trajectory.completion.strip()))
    return 1.0 if trajectory.completion.strip() == str(expected) else 0.0
"""


@pytest.mark.slow
def test_a_trl_job_keeps_its_plugins_metrics_per_step(home: Settings, tmp_path: Path) -> None:
    task = tmp_path / "task"
    shutil.copytree(TASK, task)
    grader = task / "plugins" / "grader.py"
    old = "\n    return 1.0 if trajectory.completion.strip() == str(expected) else 0.0\n"
    assert old in grader.read_text()
    grader.write_text(grader.read_text().replace(old, MEASURED))
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    done = subprocess.run(
        [sys.executable, "-m", "plugtune.cli", "run", str(task / "job.yaml")],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    store = Store.open(home.database_url)
    try:
        (job,) = store.list_jobs()
        series = store.metrics(job.id)

        def by_step(name: str) -> dict[int, float]:
            return {int(p.step or 0): p.value for p in series.get(name, [])}

        # 2 prompts x 2 generations a step: the rollout's and the grader's 4 calls each
        assert by_step("metric/with_tool/tool_calls/count") == {1: 4.0, 2: 4.0}
        assert by_step("metric/with_tool/tool_calls/mean") == {1: 1.0, 2: 1.0}
        listed = store.trajectories(job.id, limit=50)
        records = [store.get_trajectory(job.id, t.trajectory_id) for t in listed]
        for step in (1, 2):
            values = [r.metrics["exact_match/answer_chars"] for r in records if r and r.step == step]
            assert len(values) == 4
            got = {s: by_step(f"metric/exact_match/answer_chars/{s}")[step] for s in ("mean", "min", "max")}
            assert got == pytest.approx({"mean": sum(values) / 4, "min": min(values), "max": max(values)})
        doc = job_document(store, job.id)
        assert doc["plugin_metrics"]["exact_match"]["answer_chars"]["count"] == 4
        assert doc["plugin_metrics"]["with_tool"]["tool_calls"]["step"] == 2
        # TensorBoard, as for a native job: TRL's metrics and the plugins' aggregates by step
        scalars = tensorboard_scalars(home.home / "jobs" / str(job.id) / TENSORBOARD_DIR)
        assert [v for _, v in scalars["metric/with_tool/tool_calls/count"]] == [4.0, 4.0]
        assert [s for s, _ in scalars["metric/exact_match/answer_chars/max"]] == [1, 2]
        assert [s for s, _ in scalars["reward/mean"]] == [1, 2]
    finally:
        store.close()
