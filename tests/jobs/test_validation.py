from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from plugtune.errors import InvalidDataError, InvalidValueError, Problem
from plugtune.sdk import Kind
from plugtune.spec.models import BUILTIN_ROLLOUT
from plugtune.spec.validation import load_spec, read_dataset, validate_job, validate_row

JOB = """\
name: arithmetic-grpo
model: models/tiny-chat
algorithm: grpo
hyperparameters: {steps: 30, batch_size: 8, group_size: 4, learning_rate: 1e-4,
                  max_new_tokens: 32, temperature: 1.0, kl_coef: 0.0, clip_ratio: 0.2,
                  save_every_n_steps: 5}
data: {train: data/train.jsonl, validation: data/val.jsonl}
plugins:
  rollout: {entry: plugins/rollout.py:solve, runtime: {timeout_s: 60, max_concurrency: 8}}
  graders:
    - {entry: plugins/grader.py:exact, weight: 1.0}
failure_policy: {max_attempts: 3, on_exhausted: fail_job}
retry: {platform_delay_s: 900, max_auto_retries: 3}
"""

ROW = {"messages": [{"role": "user", "content": "What is 3+4?"}], "extra": {"answer": 7}}


def make_project(root: Path, job: str = JOB, rows: list[str] | None = None) -> Path:
    (root / "models/tiny-chat").mkdir(parents=True)
    (root / "models/tiny-chat/config.json").write_text("{}")
    (root / "data").mkdir()
    lines = rows if rows is not None else [json.dumps(ROW)] * 3
    (root / "data/train.jsonl").write_text("\n".join(lines) + "\n")
    (root / "data/val.jsonl").write_text(json.dumps(ROW) + "\n")
    (root / "plugins").mkdir()
    (root / "plugins/rollout.py").write_text("async def solve(ctx, policy, sample):\n    return None\n")
    (root / "plugins/grader.py").write_text("def exact(ctx, sample, trajectory):\n    return 1.0\n")
    (root / "job.yaml").write_text(job)
    return root / "job.yaml"


def problems_of(exc: pytest.ExceptionInfo) -> list[Problem]:
    return list(exc.value.problems)


def find(problems: list[Problem], field: str) -> Problem:
    matches = [p for p in problems if p.field == field]
    assert matches, f"no problem for {field}: {problems}"
    return matches[0]


def test_the_issue_example_validates(tmp_path: Path) -> None:
    job = validate_job(make_project(tmp_path))
    assert job.spec.hyperparameters.learning_rate == pytest.approx(1e-4)
    assert job.train_rows == 3 and job.validation_rows == 1
    assert job.rollout.path == (tmp_path / "plugins/rollout.py").resolve()
    assert job.rollout.function == "solve"
    assert [g.function for g in job.graders] == ["exact"]
    assert job.rollout.kind is Kind.ROLLOUT and job.graders[0].kind is Kind.GRADER
    assert job.rollout.runtime is not None and job.rollout.runtime.given() == {
        "timeout_s": 60,
        "max_concurrency": 8,
    }
    assert job.graders[0].weight == 1.0 and job.graders[0].runtime is None
    assert job.model_dir == (tmp_path / "models/tiny-chat").resolve()
    assert load_spec(tmp_path / "job.yaml").name == "arithmetic-grpo"


def test_without_rollout_the_builtin_is_used(tmp_path: Path) -> None:
    job_text = JOB.replace(
        "  rollout: {entry: plugins/rollout.py:solve, runtime: {timeout_s: 60, max_concurrency: 8}}\n", ""
    )
    job = validate_job(make_project(tmp_path, job_text))
    assert job.rollout.entry == BUILTIN_ROLLOUT
    assert job.rollout.module == "plugtune.jobs.builtin_rollout"


def test_every_value_problem_is_reported_with_its_line(tmp_path: Path) -> None:
    job_text = (
        JOB.replace("batch_size: 8", "batch_size: 0")
        .replace("group_size: 4", "group_size: 1")
        .replace("weight: 1.0", "weight: 0")
        .replace("algorithm: grpo", "algorithm: grpo\nlearning_rate: 3")
        .replace("plugins/grader.py:exact", "plugins/grader.py")
    )
    with pytest.raises(InvalidValueError) as info:
        validate_job(make_project(tmp_path, job_text))
    problems = problems_of(info)
    assert find(problems, "hyperparameters.batch_size").line == 5
    assert find(problems, "hyperparameters.group_size").line == 5
    assert "[2, 1024] (Rollouts per prompt" in find(problems, "hyperparameters.group_size").message
    assert find(problems, "learning_rate").line == 4
    assert "unknown key" in find(problems, "learning_rate").message
    assert find(problems, "plugins.graders[0].weight").line == 12
    assert "file.py:function" in find(problems, "plugins.graders[0].entry").message
    assert all(p.file == str(tmp_path / "job.yaml") for p in problems)
    assert info.value.type == "Invalid value" and info.value.owner == "data"


def test_missing_keys_and_wrong_types(tmp_path: Path) -> None:
    job_text = "name: x\nhyperparameters: {steps: ten}\ndata: {train: data/train.jsonl}\n"
    with pytest.raises(InvalidValueError) as info:
        validate_job(make_project(tmp_path, job_text))
    problems = problems_of(info)
    assert "required key is missing" in find(problems, "model").message
    assert "required key is missing" in find(problems, "plugins").message
    steps = find(problems, "hyperparameters.steps")
    assert steps.line == 2 and "whole number" in steps.message


def test_yaml_syntax_error_has_a_line(tmp_path: Path) -> None:
    with pytest.raises(InvalidValueError) as info:
        validate_job(make_project(tmp_path, "name: x\nmodel: [unclosed\ndata: {}\n"))
    (problem,) = problems_of(info)
    assert "YAML syntax error" in problem.message and problem.line is not None


def test_duplicate_key_is_reported(tmp_path: Path) -> None:
    with pytest.raises(InvalidValueError) as info:
        validate_job(make_project(tmp_path, JOB + "name: other\n"))
    assert find(problems_of(info), "name").line == 14


@pytest.mark.parametrize("content", ["", "  \n\n"])
def test_empty_or_missing_job_file_is_invalid_data(tmp_path: Path, content: str) -> None:
    with pytest.raises(InvalidDataError, match="does not exist"):
        validate_job(tmp_path / "nope.yaml")
    (tmp_path / "job.yaml").write_text(content)
    with pytest.raises(InvalidDataError, match="empty"):
        load_spec(tmp_path / "job.yaml")


def test_dataset_path_that_is_a_folder_is_invalid_data(tmp_path: Path) -> None:
    path = make_project(tmp_path, JOB.replace("data/val.jsonl", "data"))
    with pytest.raises(InvalidDataError, match="dataset path is not a file"):
        validate_job(path)


def test_data_problems_win_but_all_problems_are_carried(tmp_path: Path) -> None:
    path = make_project(tmp_path, JOB.replace("batch_size: 8", "batch_size: -2"))
    (tmp_path / "data/val.jsonl").unlink()
    (tmp_path / "data/train.jsonl").write_text("")
    shutil.rmtree(tmp_path / "models/tiny-chat")
    with pytest.raises(InvalidDataError) as info:
        validate_job(path)
    text = "\n".join(str(p) for p in problems_of(info))
    assert "val.jsonl: dataset file does not exist (data.validation in" in text
    assert "train.jsonl: dataset file is empty" in text
    assert "model folder" in text and "does not exist" in text
    assert "batch_size" in text
    assert info.value.type == "Invalid data"


def test_missing_plugin_file_and_function(tmp_path: Path) -> None:
    job_text = JOB.replace("plugins/rollout.py:solve", "plugins/missing.py:solve").replace(
        "plugins/grader.py:exact", "plugins/grader.py:exactly"
    )
    with pytest.raises(InvalidValueError) as info:
        validate_job(make_project(tmp_path, job_text))
    problems = problems_of(info)
    assert "plugins/missing.py does not exist" in find(problems, "plugins.rollout.entry").message
    assert "no function `exactly`" in find(problems, "plugins.graders[0].entry").message
    assert "exact" in find(problems, "plugins.graders[0].entry").message


def test_check_model_can_be_skipped(tmp_path: Path) -> None:
    path = make_project(tmp_path)
    shutil.rmtree(tmp_path / "models/tiny-chat")
    with pytest.raises(InvalidDataError):
        validate_job(path)
    assert validate_job(path, check_model=False).model_dir == (tmp_path / "models/tiny-chat").resolve()


def test_dataset_rows_every_problem_with_line_and_field(tmp_path: Path) -> None:
    rows = [
        json.dumps(ROW),
        "{not json",
        json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}),
        json.dumps({"messages": "hello"}),
        json.dumps({"prompt": "q"}),
        "",
        json.dumps({"messages": [{"role": "robot", "content": "q"}, {"role": "user"}], "extra": []}),
        json.dumps([1, 2]),
        json.dumps({**ROW, "tools": [{"type": "function", "function": {}}]}),
    ]
    with pytest.raises(InvalidValueError) as info:
        validate_job(make_project(tmp_path, rows=rows))
    problems = [p for p in problems_of(info) if p.file.endswith("train.jsonl")]
    by_line = {(p.line, p.field) for p in problems}
    assert (2, None) in by_line
    assert (3, "messages[1].role") in by_line
    assert (4, "messages") in by_line
    assert {(5, "prompt"), (5, "messages")} <= by_line
    assert {(7, "messages[0].role"), (7, "messages[1].content"), (7, "extra")} <= by_line
    assert (8, None) in by_line
    assert (9, "tools[0].function.name") in by_line
    assert not any(p.line in (1, 6) for p in problems)


def test_read_dataset_and_validate_row(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(ROW) + "\n\n" + json.dumps(ROW) + "\n")
    assert len(read_dataset(path)) == 2
    assert validate_row(ROW, "d.jsonl", 1) == []
    problems = validate_row({"messages": [{"role": "assistant", "content": "x"}]}, "d.jsonl", 7)
    assert [(p.line, p.field) for p in problems] == [(7, "messages[0].role")]
    assistant_tool_call = {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}
    tool_reply = {"role": "tool", "tool_call_id": "1", "content": "7"}
    row = {"messages": [{"role": "user", "content": "q"}, assistant_tool_call, tool_reply]}
    assert validate_row(row, "d.jsonl", 1) == []
    path.write_text("x\n" * 500)
    with pytest.raises(InvalidValueError) as info:
        read_dataset(path)
    assert len(info.value.problems) <= 51
    assert "450 more invalid row(s)" in info.value.problems[-1].message


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("- name: x\n", None, "must be a mapping"),
        (
            JOB.replace(
                "  graders:\n    - {entry: plugins/grader.py:exact, weight: 1.0}\n", "  graders: exact\n"
            ),
            "plugins.graders",
            "valid list",
        ),
        (
            JOB.replace(
                "{entry: plugins/rollout.py:solve, runtime: {timeout_s: 60, max_concurrency: 8}}", "solve"
            ),
            "plugins.rollout",
            "must be a mapping",
        ),
        (
            JOB.replace("data: {train: data/train.jsonl, validation: data/val.jsonl}", "data: {train: 5}"),
            "data.train",
            "valid string",
        ),
        ("name: x\n\tmodel: m\n", None, "YAML syntax error"),
    ],
)
def test_shape_errors_name_the_field(tmp_path: Path, text: str, field: str | None, words: str) -> None:
    with pytest.raises(InvalidValueError) as info:
        validate_job(make_project(tmp_path, text))
    problems = problems_of(info)
    match = [p for p in problems if p.field == field and words in p.message]
    assert match, problems
    assert match[0].line is not None
