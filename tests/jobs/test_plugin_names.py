"""Plugins of one job that share a name are refused before any compute, by run, test and lint."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.errors import InvalidValueError
from plugtune.settings import Settings
from plugtune.spec.validation import validate_job
from plugtune.store import Store
from tests.jobs.jobkit import make_job

runner = CliRunner()

SCORE = """
from plugtune import grader

@grader
def score(ctx, sample, trajectory):
    return {value}
"""


def three_scores(root: Path, names: list[str | None] | None = None) -> Path:
    """A job whose three graders live in three files that each define `score`."""
    job_file = make_job(root)
    for i, letter in enumerate("abc"):
        (root / "plugins" / f"g_{letter}.py").write_text(textwrap.dedent(SCORE.format(value=float(i))))
    spec = yaml.safe_load(job_file.read_text())
    graders = []
    for letter, name in zip("abc", names or [None] * 3, strict=True):
        graders.append({"entry": f"plugins/g_{letter}.py:score", **({"name": name} if name else {})})
    spec["plugins"]["graders"] = graders
    job_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    return job_file


def line_of(job_file: Path, text: str) -> int:
    return next(i for i, line in enumerate(job_file.read_text().splitlines(), 1) if text in line)


def test_graders_sharing_a_function_name_are_invalid_naming_both_entries(tmp_path: Path) -> None:
    job_file = three_scores(tmp_path / "job")
    with pytest.raises(InvalidValueError) as info:
        validate_job(job_file)
    problems = info.value.problems
    assert [p.field for p in problems] == ["plugins.graders[1].entry", "plugins.graders[2].entry"]
    assert [p.line for p in problems] == [line_of(job_file, "g_b.py"), line_of(job_file, "g_c.py")]
    first = line_of(job_file, "g_a.py")
    assert all(f"already used by plugins.graders[0] (line {first})" in p.message for p in problems)
    assert "`name: g_b_score`" in problems[0].message


def test_a_name_per_grader_keys_its_reward(tmp_path: Path) -> None:
    job = validate_job(three_scores(tmp_path / "job", [None, "score_b", "score_c"]))
    assert [g.name for g in job.graders] == ["score", "score_b", "score_c"]
    assert job.rollout.name == "answer"


def test_a_grader_named_like_the_rollout_or_a_chosen_name_twice(tmp_path: Path) -> None:
    job_file = three_scores(tmp_path / "job", ["answer", "same", "same"])
    with pytest.raises(InvalidValueError) as info:
        validate_job(job_file)
    first, second = info.value.problems
    assert first.field == "plugins.graders[0].name" and "plugins.rollout" in first.message
    assert second.field == "plugins.graders[2].name" and "plugins.graders[1]" in second.message
    assert "choose another `name:`" in second.message


def test_run_refuses_duplicate_names_before_any_compute(tmp_path: Path, home: Settings) -> None:
    result = runner.invoke(app, ["run", str(three_scores(tmp_path / "job"))])
    assert result.exit_code == 1
    assert "Invalid value (data)" in result.output and "internal error" not in result.output
    assert "plugins.graders[1].entry" in result.output and "name:" in result.output
    with Store.open(home.database_url) as store:
        job = store.get_job(1)
        assert job is not None and job.status == "failed" and job.next_retry_at is None
        assert store.list_attempts(1) == []


def test_plugtune_test_and_lint_report_it_too(tmp_path: Path) -> None:
    job_file = three_scores(tmp_path / "job")
    tested = runner.invoke(app, ["test", str(job_file)])
    assert tested.exit_code == 2
    assert "Invalid value" in tested.output and "plugins.graders[2].entry" in tested.output

    linted = runner.invoke(app, ["lint", "--json", str(tmp_path / "job")])
    assert linted.exit_code == 1
    found = [f for f in json.loads(linted.stdout)["findings"] if f["rule"] == "PT404"]
    assert [(Path(f["file"]).name, f["line"]) for f in found] == [
        ("job.yaml", line_of(job_file, "g_b.py")),
        ("job.yaml", line_of(job_file, "g_c.py")),
    ]
    assert "name:" in found[0]["fix"]

    named = three_scores(tmp_path / "named", [None, "score_b", "score_c"])
    linted = runner.invoke(app, ["lint", "--json", str(named.parent)])
    assert not [f for f in json.loads(linted.stdout)["findings"] if f["rule"] == "PT404"]


@pytest.mark.slow
def test_named_graders_train_with_their_own_reward_components(tmp_path: Path, home: Settings) -> None:
    job_file = three_scores(tmp_path / "job", [None, "score_b", "score_c"])
    spec = yaml.safe_load(job_file.read_text())
    spec["hyperparameters"]["steps"] = 1
    job_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    result = runner.invoke(app, ["run", str(job_file)])
    assert result.exit_code == 0, result.output
    with Store.open(home.database_url) as store:
        ids = [t.trajectory_id for t in store.trajectories(1, limit=10)]
        records = [store.get_trajectory(1, i) for i in ids]
        assert records and all(
            r is not None and r.reward_components == {"score": 0.0, "score_b": 1.0, "score_c": 2.0}
            for r in records
        )
        assert sorted(p.name for p in store.list_plugins(1)) == ["answer", "score", "score_b", "score_c"]


@pytest.mark.slow
def test_a_group_grader_listed_as_a_grader_is_invalid_value_not_internal(
    tmp_path: Path, home: Settings
) -> None:
    group = """
from plugtune import group_grader

@group_grader
def exact(ctx, sample, trajectories):
    return [1.0 for _ in trajectories]
"""
    result = runner.invoke(app, ["run", str(make_job(tmp_path / "job", grader=group))])
    assert result.exit_code == 1
    assert "Invalid value (data)" in result.output and "internal error" not in result.output
    assert "decorated @group_grader but listed as a grader" in result.output
    with Store.open(home.database_url) as store:
        job = store.get_job(1)
        assert job is not None and job.next_retry_at is None and job.auto_retries == 0
