"""``plugtune test`` reports every plugin's ``ctx.metric``: per call, per trajectory and aggregated
per plugin and name as a job's step does (issue 24, item 2), in process and with ``--faas``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plugtune.cli import app
from tests.jobs.test_plugin_metrics import _job


def test_plugtune_test_prints_and_reports_plugin_metrics(tmp_path: Path) -> None:
    job = _job(tmp_path / "effects")  # rollout, grader and group grader each call ctx.metric
    runner = CliRunner()
    done = runner.invoke(app, ["test", str(job), "--samples", "2", "--json"])
    assert done.exit_code == 0, done.output
    doc = json.loads(done.stdout)
    found = doc["summary"]["plugin_metrics"]
    assert set(found) == {"answer", "exact", "spread"}
    assert found["answer"]["turns"] == {"mean": 1.0, "min": 1.0, "max": 1.0, "count": 6.0}  # 2 rows x 3
    assert found["spread"]["size"] == {"mean": 3.0, "min": 3.0, "max": 3.0, "count": 2.0}
    values = [t["metrics"]["exact/chars_seen"] for t in doc["trajectories"]]
    assert found["exact"]["chars_seen"] == pytest.approx(
        {"mean": sum(values) / 6, "min": min(values), "max": max(values), "count": 6}
    )
    graded = [c for c in doc["calls"] if c["name"] == "exact"]
    assert sorted(c["metrics"]["chars_seen"] for c in graded) == sorted(values)

    text = runner.invoke(app, ["test", str(job), "--samples", "2"])
    assert text.exit_code == 0, text.output
    assert "plugin metrics (ctx.metric" in text.output
    assert "answer turns: mean 1, min 1, max 1 (6 values)" in text.output
    assert "spread size: mean 3, min 3, max 3 (2 values)" in text.output
    assert "metrics: chars=" in text.output and "exact/chars_seen=" in text.output


@pytest.mark.slow
def test_plugtune_test_faas_reports_plugin_metrics(tmp_path: Path) -> None:
    job = _job(tmp_path / "effects")
    done = CliRunner().invoke(app, ["test", str(job), "--faas", "--samples", "2", "--json"])
    assert done.exit_code == 0, done.output
    found = json.loads(done.stdout)["summary"]["plugin_metrics"]
    assert found["answer"]["turns"]["count"] == 6.0 and found["spread"]["size"]["mean"] == 3.0
