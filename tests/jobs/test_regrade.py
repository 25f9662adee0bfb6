"""``plugtune regrade`` and ``plugtune fixture add`` on a real job's stored trajectories: the flips
a changed grader makes, exactly; ``--failed-only`` re-grades only the failed grader calls and
stores them labelled, the job's own rewards unchanged; a fixture from a trajectory passes
``plugtune test --expect``."""

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
from plugtune.types import TrajectoryRecord
from plugtune.web import create_app
from tests.jobs.jobkit import ROWS, make_job

runner = CliRunner()

# Scores a trajectory 1 when its row's answer is even, 0 when odd; raises (a judge outage) for
# every group's second rollout: those trajectories fail, and drop_sample keeps the job going.
FLAKY = """
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    if trajectory.trajectory_id.endswith("-r1"):
        raise ValueError("judge unavailable")
    return float(int(sample.extra["answer"]) % 2 == 0)
"""

# The same grader without the outage.
FIXED = """
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    return float(int(sample.extra["answer"]) % 2 == 0)
"""

# A changed grader: row 0 (answer 3) unscorable, odd answers 1, even answers 0.
CHANGED = """
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    if sample.extra["answer"] == "3":
        return None
    return float(int(sample.extra["answer"]) % 2 == 1)
"""


# Never answers for an even answer (past the job's timeout_s for its grader), else as FIXED.
SLOW = """
import time
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    if int(sample.extra["answer"]) % 2 == 0:
        time.sleep(60)
    return float(int(sample.extra["answer"]) % 2 == 0)
"""


def _answer(record: TrajectoryRecord) -> int:
    return int(ROWS[record.sample_index]["extra"]["answer"])


def _run(args: list[str]) -> dict[str, Any]:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def _records(store: Store, job_id: int) -> dict[str, TrajectoryRecord]:
    ids = [t.trajectory_id for t in store.trajectories(job_id, limit=1000)]
    return {r.trajectory_id: r for r in store.trajectory_records(job_id, ids)}


@pytest.mark.slow
def test_regrade_failed_only_and_fixtures(tmp_path: Path, home: Settings) -> None:
    job_file = make_job(
        tmp_path / "job",
        grader=FLAKY,
        extra={"failure_policy": {"max_attempts": 1, "on_exhausted": "drop_sample"}},
    )
    spec = yaml.safe_load(job_file.read_text())
    spec["plugins"]["graders"][0]["runtime"] = {"timeout_s": 3}  # job.yaml's limit for the grader
    job_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    ran = runner.invoke(app, ["run", str(job_file)])
    assert ran.exit_code == 0, ran.output
    (tmp_path / "fixed.py").write_text(FIXED)
    (tmp_path / "changed.py").write_text(CHANGED)
    (tmp_path / "slow.py").write_text(SLOW)
    store = Store.open(home.database_url)
    before = _records(store, 1)
    failed = {t for t, r in before.items() if r.status == "failed"}
    scored = {t for t, r in before.items() if r.status == "success"}
    assert failed and scored and failed | scored == set(before)  # every -r1 failed, every -r0 scored
    assert all(t.endswith("-r1") for t in failed) and all(
        r.reward is None for t, r in before.items() if t in failed
    )

    # The job's own graders, from the stored code: the same grades again.
    same = _run(["regrade", "1"])
    assert same["regraded"] == len(before) and same["skipped"] == 0
    assert same["counts"]["unchanged"] == len(before) and same["flips"] == []
    assert "uid per function" in same["sandbox"]  # in the runtime's sandbox, as test --faas

    # A changed grader: every flip, exactly.
    changed = _run(["regrade", "1", "--grader", f"{tmp_path / 'changed.py'}:exact"])
    expected: dict[str, str] = {}
    for t, r in before.items():
        answer = _answer(r)
        if answer == 3:
            expected[t] = "failed→unscorable" if t in failed else "scored→unscorable"
        elif t in failed:
            expected[t] = "failed→scored"
        else:
            expected[t] = "1→0" if answer % 2 == 0 else "0→1"
    assert {f["trajectory_id"]: f["kind"] for f in changed["flips"]} == expected
    for flip in changed["flips"]:
        assert flip["link"] == f"/jobs/1/trajectories?t={flip['trajectory_id']}"
        new = (
            None
            if _answer(before[flip["trajectory_id"]]) == 3
            else float(_answer(before[flip["trajectory_id"]]) % 2)
        )
        assert flip["after"]["reward"] == new and flip["after"]["status"] == "success"
    counts = {k: v for k, v in changed["counts"].items() if v}
    assert sum(counts.values()) == len(before) and "unchanged" not in counts
    assert store.regrades(1) == []  # a plain re-grade stores nothing
    saved = _run(
        ["regrade", "1", "--grader", f"{tmp_path / 'changed.py'}:exact", "--save", "--label", "changed"]
    )
    assert saved["stored_label"] == "changed" and saved["counts"] == changed["counts"]
    assert {r.trajectory_id: r.kind for r in store.regrades(1, "changed")} == expected

    text = runner.invoke(app, ["regrade", "1", "--grader", f"{tmp_path / 'changed.py'}:exact"])
    assert text.exit_code == 0
    some = changed["flips"][0]
    assert f"{some['kind']}" in text.output and some["link"] in text.output

    # --steps keeps the range's trajectories only.
    last = max(r.step for r in before.values())
    ranged = _run(["regrade", "1", "--steps", f"{last}..{last}"])
    assert ranged["trajectories"] == sum(r.step == last for r in before.values()) < len(before)

    # --failed-only: only the failed calls, stored labelled; the job's rewards stay as trained.
    fixed = f"{tmp_path / 'fixed.py'}:exact"
    redo = _run(["regrade", "1", "--failed-only", "--grader", fixed, "--label", "judge back"])
    assert redo["regraded"] == len(failed) and redo["skipped"] == len(scored)
    assert {f["trajectory_id"]: f["kind"] for f in redo["flips"]} == {t: "failed→scored" for t in failed}
    assert redo["stored_label"] == "judge back"
    rows = {r.trajectory_id: r for r in store.regrades(1, "judge back")}
    assert set(rows) == failed
    for t, row in rows.items():
        want = float(_answer(before[t]) % 2 == 0)
        assert (row.status, row.reward, row.reward_components, row.graders) == (
            "success",
            want,
            {"exact": want},
            ["exact"],
        )
        assert row.kind == "failed→scored" and row.errors == []
    after = _records(store, 1)
    assert {t: (r.status, r.reward, r.reward_components, len(r.errors)) for t, r in after.items()} == {
        t: (r.status, r.reward, r.reward_components, len(r.errors)) for t, r in before.items()
    }

    # The console shows the stored re-grade, each flip linked, with its fixture line.
    console = TestClient(create_app(store), base_url="http://127.0.0.1:8321")
    api = console.get("/api/jobs/1/regrades", params={"label": "judge back"})
    assert api.status_code == 200, api.text
    assert {r["trajectory_id"]: (r["kind"], r["link"]) for r in api.json()["regrades"]} == {
        t: ("failed→scored", f"/jobs/1/trajectories?t={t}") for t in failed
    }
    page = console.get("/jobs/1/regrades")
    assert page.status_code == 200 and "judge back" in page.text and 'data-label="changed"' in page.text
    shown = page.text.split('data-label="changed"')[1].split("</section>")[0]
    for t, kind in expected.items():  # the saved report, flip by flip, as the command printed it
        assert (
            f'<td class="mono">{kind}</td>\n        <td><a class="mono" href="/jobs/1/trajectories?t={t}">'
            in shown
        )
    for t in failed:
        assert f'href="/jobs/1/trajectories?t={t}"' in page.text
    assert f"failed→scored</span> {len(failed)}" in page.text
    line = console.get(
        f"/api/jobs/1/trajectories/{sorted(failed)[0]}/fixture", params={"regrade": "judge back"}
    )
    assert line.status_code == 200, line.text
    assert json.loads(line.text)["expect"] == float(_answer(before[sorted(failed)[0]]) % 2 == 0)
    assert console.get("/api/jobs/1/trajectories/s9-p9-r9/fixture").status_code == 404
    assert console.get("/jobs/9/regrades").status_code == 404

    # fixture add: a scored trajectory as recorded, a failed one as re-graded; test --expect passes.
    fixtures = tmp_path / "fixtures.jsonl"
    one_scored, one_failed = sorted(scored)[0], sorted(failed)[0]
    added = runner.invoke(app, ["fixture", "add", "1", one_scored, "--file", str(fixtures)])
    assert added.exit_code == 0, added.output
    added = runner.invoke(
        app, ["fixture", "add", "1", one_failed, "--file", str(fixtures), "--regrade", "judge back"]
    )
    assert added.exit_code == 0, added.output
    lines = [json.loads(line) for line in fixtures.read_text().splitlines()]
    assert [(f["row"], f["expect"]) for f in lines] == [
        (before[one_scored].sample_index, before[one_scored].reward),
        (before[one_failed].sample_index, float(_answer(before[one_failed]) % 2 == 0)),
    ]
    assert lines[0]["messages"] == before[one_scored].messages
    passed = runner.invoke(app, ["test", str(job_file), "--expect", str(fixtures)])
    assert passed.exit_code == 0, passed.output
    # A fixture saying the grader is wrong fails the check: the rows are really checked.
    wrong = tmp_path / "wrong.jsonl"
    added = runner.invoke(app, ["fixture", "add", "1", one_scored, "--file", str(wrong), "--expect", "0.25"])
    assert added.exit_code == 0, added.output
    assert json.loads(wrong.read_text())["expect"] == 0.25
    assert runner.invoke(app, ["test", str(job_file), "--expect", str(wrong)]).exit_code == 1

    # --grader runs with job.yaml's limits for the grader it replaces: past timeout_s 3, it fails.
    slow = _run(["regrade", "1", "--grader", f"{tmp_path / 'slow.py'}:exact"])
    kinds = {f["trajectory_id"]: f["kind"] for f in slow["flips"]}
    assert kinds == {
        t: "scored→failed" if t in scored else "failed→scored"
        for t, r in before.items()
        if (_answer(r) % 2 == 0) == (t in scored)
    }
    timed_out = [f for f in slow["flips"] if f["kind"] == "scored→failed"]
    assert timed_out and all("timeout" in f["after"]["error"].lower() for f in timed_out), timed_out

    # Clear errors, exit 2.
    for args, says in [
        (["regrade", "9"], "there is no job 9"),
        (["regrade", "1", "--steps", "3..1"], "ends (1) before it starts (3)"),
        (["regrade", "1", "--steps", "two"], "write a step range as A..B"),
        (["regrade", "1", "--steps", "50..60"], "no trajectories in steps 50..60"),
        (["regrade", "1", "--grader", f"{tmp_path / 'nope.py'}:exact"], "there is no file"),
        (["regrade", "1", "--grader", f"{tmp_path / 'fixed.py'}:other"], "has no function named 'other'"),
        (["regrade", "1", "--grader", "fixed.py"], "write it as FILE:FUNCTION"),
        (["fixture", "add", "1", "s9-p9-r9", "--file", str(wrong)], "has no trajectory 's9-p9-r9'"),
        (["fixture", "add", "1", one_scored, "--file", str(wrong), "--expect", "maybe"], "--expect 'maybe'"),
        (
            ["fixture", "add", "1", one_scored, "--file", str(wrong), "--regrade", "nope"],
            "no re-grade 'nope'",
        ),
    ]:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert says in result.output, (args, result.output)
    store.close()


GRADERS = """
from plugtune import grader, group_grader

@grader
def exact(ctx, sample, trajectory):
    return float(int(sample.extra["answer"]) % 2 == 0)

@group_grader
def rank(ctx, sample, trajectories):
    return [float(i) for i in range(len(trajectories))]
"""

REVERSED = """
from plugtune import group_grader

@group_grader
def rank(ctx, sample, trajectories):
    return [float(len(trajectories) - 1 - i) for i in range(len(trajectories))]
"""


@pytest.mark.slow
def test_regrade_a_group_grader(tmp_path: Path, home: Settings) -> None:
    job_file = make_job(tmp_path / "job", grader=GRADERS)
    spec = yaml.safe_load(job_file.read_text())
    spec["plugins"]["group_graders"] = [{"entry": "plugins/grader.py:rank", "weight": 0.5}]
    job_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    ran = runner.invoke(app, ["run", str(job_file)])
    assert ran.exit_code == 0, ran.output
    store = Store.open(home.database_url)
    before = _records(store, 1)
    assert before and all(r.status == "success" for r in before.values())
    for r in before.values():  # the job's reward: exact + 0.5 * the rollout's place in its group
        assert r.reward == float(_answer(r) % 2 == 0) + 0.5 * r.rollout_index

    same = _run(["regrade", "1"])
    assert same["regraded"] == len(before) and same["counts"]["unchanged"] == len(before)

    (tmp_path / "reversed.py").write_text(REVERSED)
    flipped = _run(["regrade", "1", "--grader", f"{tmp_path / 'reversed.py'}:rank"])
    expected = {}
    for t, r in before.items():
        even = _answer(r) % 2 == 0
        if even:
            expected[t] = "changed"  # 1 + 0.5 * i -> 1 + 0.5 * (1 - i)
        else:
            expected[t] = "0→1" if r.rollout_index == 0 else "1→0"
    assert {f["trajectory_id"]: f["kind"] for f in flipped["flips"]} == expected
    for f in flipped["flips"]:
        r = before[f["trajectory_id"]]
        # the replaced group grader keeps job.yaml's weight 0.5
        assert f["after"]["reward"] == float(_answer(r) % 2 == 0) + 0.5 * (1 - r.rollout_index)
    store.close()
