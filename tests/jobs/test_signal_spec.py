"""job.yaml's ``signal:`` block: the thresholds of the reward-signal warnings (issue 27 item 1),
validated with the file, line and field of a bad value, and documented in the job.yaml reference."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugtune.errors import InvalidValueError
from plugtune.spec.models import JobSpec, spec_reference
from plugtune.spec.validation import validate_job
from plugtune.trainer.health import SignalThresholds
from tests.jobs.test_validation import JOB, find, make_project, problems_of


def test_the_signal_block_has_documented_defaults_and_reaches_the_trainer() -> None:
    spec = JobSpec.model_validate(
        {
            "name": "x",
            "model": "m",
            "data": {"train": "t.jsonl"},
            "plugins": {"graders": [{"entry": "g.py:f"}]},
            "signal": {"unscorable_share": 0.25},
        }
    )
    assert spec.signal.thresholds() == SignalThresholds(unscorable_share=0.25)
    rows = {r.path: r for r in spec_reference()}
    assert rows["signal"].default == "(section defaults)"
    for name in SignalThresholds.__dataclass_fields__:
        row = rows[f"signal.{name}"]
        default = getattr(SignalThresholds(), name)
        assert row.description and row.default == ("none" if default is None else repr(default)), name


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("1.5", "must be <= 1.0, got 1.5"),
        ("half", "must be a number, got 'half'"),
        ("{}", "must be a number"),
    ],
)
def test_a_bad_signal_threshold_names_its_line_and_field(tmp_path: Path, value: str, words: str) -> None:
    job = JOB + f"signal:\n  unscorable_share: {value}\n"
    with pytest.raises(InvalidValueError) as info:
        validate_job(make_project(tmp_path, job))
    problem = find(problems_of(info), "signal.unscorable_share")
    assert problem.line == JOB.count("\n") + 2 and words in problem.message
    assert problem.file == str(tmp_path / "job.yaml")


def test_an_unknown_signal_key_is_refused(tmp_path: Path) -> None:
    job = JOB + "signal: {unscorable: 0.5}\n"
    with pytest.raises(InvalidValueError) as info:
        validate_job(make_project(tmp_path, job))
    assert "unknown key" in find(problems_of(info), "signal.unscorable").message


def test_a_reward_floor_not_below_its_ceiling_is_refused_at_the_signal_block(tmp_path: Path) -> None:
    job = JOB + "signal: {reward_floor: 1, reward_ceiling: 1, saturation_steps: 3}\n"
    with pytest.raises(InvalidValueError) as info:
        validate_job(make_project(tmp_path, job))
    problem = find(problems_of(info), "signal")
    assert problem.line == JOB.count("\n") + 1
    assert "reward_floor 1 must be below reward_ceiling 1" in problem.message
    job = JOB + "signal: {saturation_steps: 0}\n"
    with pytest.raises(InvalidValueError) as info:
        validate_job(make_project(tmp_path / "steps", job))
    assert find(problems_of(info), "signal.saturation_steps").line == JOB.count("\n") + 1
