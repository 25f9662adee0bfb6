"""`plugtune replay JOB ID --group`: every trajectory of one prompt group of a real job's step re-runs
together from the stored code, its group grader seeing the whole group as in the step, with one
verdict per trajectory (a one-trajectory replay gives the group grader a group of one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import run_job
from plugtune.pretest.group_replay import replay_group
from plugtune.pretest.replay import ReplayError
from plugtune.settings import Settings
from plugtune.store import Store
from tests.jobs.jobkit import make_job

runner = CliRunner()

#: The second rollout of every group fails its grader (and is dropped); the group grader gives each
#: trajectory it is given half the size of that group.
GRADERS = """
from plugtune import grader, group_grader

@grader
def exact(ctx, sample, trajectory):
    if ctx.rollout_index == 1:
        raise ValueError("the second rollout is refused")
    return 0.0

@group_grader
def size(ctx, sample, trajectories):
    return [0.5 * len(trajectories)] * len(trajectories)
"""


def _grouped_job(root: Path, store: Store, home: Settings) -> int:
    job_file = make_job(root, grader=GRADERS, hyper={"steps": 1, "batch_size": 2, "group_size": 2})
    spec = yaml.safe_load(job_file.read_text())
    spec["plugins"]["group_graders"] = [{"entry": "plugins/grader.py:size"}]
    spec["failure_policy"] = {"max_attempts": 1, "on_exhausted": "drop_sample"}
    job_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    job_id, invalid = create_job(store, job_file)
    assert invalid is None, invalid
    run_job(store, home, job_id)
    return job_id


@pytest.mark.slow
def test_a_steps_group_replays_whole_with_a_verdict_per_trajectory(
    tmp_path: Path, home: Settings, store: Store
) -> None:
    job_id = _grouped_job(tmp_path / "task", store, home)
    records = store.trajectories(job_id, step=1, limit=100)
    group_id = records[0].group_id
    members = sorted((r for r in records if r.group_id == group_id), key=lambda r: r.trajectory_id)
    assert len(members) == 2, members
    recorded = {r.trajectory_id: (r.status, r.reward) for r in members}

    doc = replay_group(store, job_id, group_id)
    rows = {row["trajectory_id"]: row for row in doc["trajectories"]}
    assert set(rows) == set(recorded) and doc["group_id"] == group_id and doc["step"] == 1
    for tid, (status, reward) in recorded.items():
        assert rows[tid]["recorded"]["status"] == status and rows[tid]["recorded"]["reward"] == reward
        assert rows[tid]["verdict"] == "reproduced", rows[tid]
        assert rows[tid]["policy_turns"]["played"] == rows[tid]["policy_turns"]["recorded"] == 1
    assert doc["reproduced"] and doc["summary"]["verdicts"] == {"reproduced": 2}
    statuses = sorted(row["replayed"]["status"] for row in rows.values())
    assert statuses[0] != statuses[1], rows  # one failed its grader, as in the job: each has its own report
    (failed,) = [r for r in rows.values() if r["replayed"]["error"]]
    assert failed["replayed"]["error"]["raised"] == "ValueError" and failed["rollout_index"] == 1
    assert doc["summary"]["failed"] == [failed["trajectory_id"]] or failed["replayed"]["status"] != "failed"
    assert {c["trajectory_id"] for c in doc["calls"] if c["trajectory_id"]} <= set(recorded)

    # The same group named by one of its trajectories, on the command line.
    shown = runner.invoke(app, ["replay", str(job_id), members[0].trajectory_id, "--group"])
    assert shown.exit_code == 0, shown.output
    assert f"group {group_id} (step 1), 2 trajectories" in shown.output
    for tid in recorded:
        assert f"{tid}: " in shown.output
    assert "2 reproduced of 2" in shown.output
    as_json = runner.invoke(app, ["replay", str(job_id), group_id, "--group", "--json"])
    assert as_json.exit_code == 0 and json.loads(as_json.output)["summary"]["trajectories"] == 2

    missing = runner.invoke(app, ["replay", str(job_id), "s9-p0", "--group"])
    assert missing.exit_code == 2 and "no group or trajectory 's9-p0'" in missing.output
    with pytest.raises(ReplayError):
        replay_group(store, job_id, "nothing")
