"""job.yaml's ``failure_policy.group`` (issue 26 item 5, the group rule): its defaults, the rule it
hands the trainer, and a bad value named with its file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugtune.errors import InvalidValueError
from plugtune.spec.models import spec_reference
from plugtune.spec.validation import validate_job
from plugtune.trainer.draft import GroupRule
from tests.jobs.test_validation import JOB, find, make_project, problems_of

POLICY = "failure_policy: {max_attempts: 3, on_exhausted: fail_job}"


def test_the_group_rule_defaults_to_dropping_a_failed_trajectory_alone(tmp_path: Path) -> None:
    assert validate_job(make_project(tmp_path)).spec.failure_policy.group.rule() == GroupRule()
    rows = {r.path: r for r in spec_reference()}
    assert rows["failure_policy.group.drop"].default == "'trajectory'"
    assert rows["failure_policy.group.min_scored"].default == "0"
    assert all(rows[f"failure_policy.group.{k}"].description for k in ("drop", "min_scored"))


def test_the_group_rule_reaches_the_trainer_as_written(tmp_path: Path) -> None:
    job = JOB.replace(
        POLICY, "failure_policy:\n  on_exhausted: drop_sample\n  group: {drop: group, min_scored: 2}"
    )
    spec = validate_job(make_project(tmp_path, job)).spec
    assert spec.failure_policy.group.rule() == GroupRule(drop="group", min_scored=2)


@pytest.mark.parametrize(
    ("group", "field", "words"),
    [
        ("{drop: everything}", "failure_policy.group.drop", "'trajectory' or 'group'"),
        ("{min_scored: -1}", "failure_policy.group.min_scored", "must be >= 0"),
        ("{keep: 2}", "failure_policy.group.keep", "unknown key"),
    ],
)
def test_a_bad_group_rule_names_its_line_and_field(
    tmp_path: Path, group: str, field: str, words: str
) -> None:
    assert POLICY in JOB
    job = JOB.replace(POLICY, f"failure_policy:\n  on_exhausted: drop_sample\n  group: {group}")
    with pytest.raises(InvalidValueError) as info:
        validate_job(make_project(tmp_path, job))
    problem = find(problems_of(info), field)
    assert words in problem.message and problem.file == str(tmp_path / "job.yaml")
    assert problem.line == job.splitlines().index(f"  group: {group}") + 1
