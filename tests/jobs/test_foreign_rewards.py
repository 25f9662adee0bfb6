"""TRL- and verl-shaped reward functions, unchanged (issue 29 item 1): lint recognises them (PT405)
and its fix is a decorator, not a rewrite; decorated as it says, they lint clean, grade a real job
(the TRL one a group at a time, each row's extra fields as keyword lists; the verl one with the
row's data_source, ground_truth and extra_info) and can still be called as their frameworks call them."""

from __future__ import annotations

import importlib.util
import re
import textwrap
from pathlib import Path

import pytest
import yaml

from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import run_job
from plugtune.lint import lint_paths
from plugtune.settings import Settings
from plugtune.store import Store
from tests.jobs.jobkit import ROWS, make_job

pytestmark = pytest.mark.slow

FOREIGN = """
def accuracy_reward(prompts, completions, answer, **kwargs):
    return [float(c.strip() == a) + 0.1 * len(c) for c, a in zip(completions, answer, strict=True)]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    assert data_source == "arith" and extra_info["split"] == "train"
    score = float(solution_str.strip() == ground_truth) + 0.01 * len(solution_str)
    return {"score": score, "chars": len(solution_str)}
"""


def _reply(messages: list[dict[str, object]]) -> str:
    """The completion the graders read: the last assistant message's text."""
    return next(str(m.get("content") or "") for m in reversed(messages) if m.get("role") == "assistant")


def _decorated(fix: str) -> str:
    """The decorator the fix names (`decorate it @group_grader(shape="trl") ...`)."""
    found = re.search(r"decorate it (@\w+\(shape=\"[\w-]+\"\))", fix)
    assert found, fix
    return found[1]


def test_a_trl_and_a_verl_reward_function_grade_a_real_job_with_only_a_decorator(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    rows = [
        {
            **r,
            "extra": {
                **r["extra"],
                "data_source": "arith",
                "reward_model": {"ground_truth": r["extra"]["answer"]},
                "extra_info": {"split": "train"},
            },
        }
        for r in ROWS
    ]
    job_file = make_job(tmp_path / "p", grader=FOREIGN, rows=rows, hyper={"steps": 1, "max_new_tokens": 8})
    spec = yaml.safe_load(job_file.read_text())
    spec["plugins"]["graders"] = [
        {"entry": "plugins/grader.py:accuracy_reward"},
        {"entry": "plugins/grader.py:compute_score"},
    ]
    job_file.write_text(yaml.safe_dump(spec, sort_keys=False))

    findings = lint_paths([tmp_path / "p"]).findings
    assert [(f.rule, f.line) for f in findings] == [("PT405", 2), ("PT405", 6)], findings
    trl, verl = findings
    assert "is a TRL reward function" in trl.message and "job.yaml names it" in trl.message
    assert "is a verl reward function" in verl.message
    assert _decorated(trl.fix) == '@group_grader(shape="trl")' and 'shape="trl-text"' in trl.fix
    assert _decorated(verl.fix) == '@grader(shape="verl")' and "plugins.graders" in verl.fix
    # accuracy_reward reads completions as strings: the fix's text variant; nothing else changes
    source = textwrap.dedent(FOREIGN).replace(
        "\ndef accuracy_reward", '\n@group_grader(shape="trl-text")\ndef accuracy_reward'
    )
    source = source.replace("\ndef compute_score", "\n" + _decorated(verl.fix) + "\ndef compute_score")
    grader_py = tmp_path / "p" / "plugins" / "grader.py"
    grader_py.write_text("from plugtune import grader, group_grader\n" + source)
    spec["plugins"]["graders"] = [{"entry": "plugins/grader.py:compute_score"}]
    spec["plugins"]["group_graders"] = [{"entry": "plugins/grader.py:accuracy_reward"}]
    job_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    assert lint_paths([tmp_path / "p"]).findings == []

    job_id, invalid = create_job(store, job_file)
    assert invalid is None, invalid
    assert run_job(store, home, job_id, wait_for_retries=False) == "succeeded", store.get_job(job_id)
    scored = store.trajectories(job_id, limit=50)
    assert scored and all(t.status == "success" and t.reward is not None for t in scored)
    records = store.trajectory_records(job_id, [t.trajectory_id for t in scored])
    assert all(set(r.reward_components) == {"accuracy_reward", "compute_score"} for r in records)
    # each function's score is the one it gives the stored reply (whatever was sampled, an empty
    # reply included), and verl's extra numbers are kept as metrics
    for r in records:
        reply, answer = _reply(r.messages), rows[r.sample_index]["extra"]["answer"]
        right = float(reply.strip() == answer)
        assert r.reward_components == pytest.approx(
            {"accuracy_reward": right + 0.1 * len(reply), "compute_score": right + 0.01 * len(reply)}
        ), (reply, answer)
        assert r.metrics["compute_score/chars"] == len(reply)

    # the module still works where it came from: called as TRL and verl call them
    loaded = importlib.util.spec_from_file_location("graded", grader_py)
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    assert module.accuracy_reward(prompts=["1+1?"], completions=["2"], answer=["2"]) == [1.1]
    score = module.compute_score(
        data_source="arith", solution_str="2", ground_truth="2", extra_info={"split": "train"}
    )
    assert score == {"score": 1.01, "chars": 1}


def test_job_yaml_names_an_undecorated_trl_and_verl_function_with_its_shape(
    tmp_path: Path, store: Store, home: Settings
) -> None:
    """No plugtune import at all: job.yaml's `shape:` adapts the functions as the decorators would,
    and lint, seeing the shape, has nothing to say."""
    rows = [
        {
            **r,
            "extra": {
                **r["extra"],
                "data_source": "arith",
                "ground_truth": r["extra"]["answer"],
                "extra_info": {"split": "train"},
            },
        }
        for r in ROWS
    ]
    job_file = make_job(tmp_path / "p", grader=FOREIGN, rows=rows, hyper={"steps": 1, "max_new_tokens": 8})
    spec = yaml.safe_load(job_file.read_text())
    spec["plugins"]["graders"] = [{"entry": "plugins/grader.py:compute_score", "shape": "verl"}]
    spec["plugins"]["group_graders"] = [{"entry": "plugins/grader.py:accuracy_reward", "shape": "trl-text"}]
    job_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    assert "plugtune" not in (tmp_path / "p" / "plugins" / "grader.py").read_text()
    assert lint_paths([tmp_path / "p"]).findings == []

    job_id, invalid = create_job(store, job_file)
    assert invalid is None, invalid
    assert run_job(store, home, job_id, wait_for_retries=False) == "succeeded", store.get_job(job_id)
    scored = store.trajectories(job_id, limit=50)
    records = store.trajectory_records(job_id, [t.trajectory_id for t in scored])
    assert records and all(set(r.reward_components) == {"accuracy_reward", "compute_score"} for r in records)
