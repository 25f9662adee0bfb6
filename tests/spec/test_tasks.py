"""Multi-task jobs in job.yaml (issue 27 item 5): ``tasks:`` maps a task to its plugin set, a row's
``task`` must name one (the data file, line and task are named when it does not), and a task's
plugins must exist: an entry's file and function, or the name of a plugin the job lists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plugtune.errors import InvalidValueError, Problem
from plugtune.sdk import Kind
from plugtune.spec.validation import ValidatedJob, validate_job

PLUGINS = """\
from plugtune import grader, group_grader, rollout

@rollout
def solve(ctx, policy, sample):
    return None

@grader
def exact(ctx, sample, trajectory):
    return 1.0

@grader
def passes(ctx, sample, trajectory):
    return 0.0

@group_grader
def rank(ctx, sample, trajectories):
    return [0.0 for _ in trajectories]
"""

TASKS = """\
tasks:
  math:
    graders: [exact]
  code:
    rollout: {entry: plugins/code.py:solve, name: code_solve}
    graders:
      - {entry: plugins/code.py:passes, weight: 2.0}
    group_graders: [{entry: plugins/code.py:rank}]
"""


def row(task: str | None = None) -> str:
    out: dict[str, object] = {"messages": [{"role": "user", "content": "2+2?"}], "extra": {"answer": "4"}}
    return json.dumps(out if task is None else {**out, "task": task})


def project(root: Path, tasks: str = TASKS, rows: list[str] | None = None, head: str = "") -> Path:
    (root / "plugins").mkdir(parents=True)
    (root / "plugins/main.py").write_text(PLUGINS)
    (root / "plugins/code.py").write_text(PLUGINS)
    (root / "data").mkdir()
    lines = rows if rows is not None else [row("math"), row("code"), row()]
    (root / "data/train.jsonl").write_text("\n".join(lines) + "\n")
    job = root / "job.yaml"
    job.write_text(
        f"name: mix\nmodel: builtin:tiny-chat\n{head}data: {{train: data/train.jsonl}}\n"
        "plugins:\n  rollout: {entry: plugins/main.py:solve}\n  graders: [{entry: plugins/main.py:exact}]\n"
        + tasks
    )
    return job


def problems(job: Path) -> list[Problem]:
    with pytest.raises(InvalidValueError) as caught:
        validate_job(job, check_model=False)
    return caught.value.problems


def test_each_task_resolves_to_its_plugin_set(tmp_path: Path) -> None:
    job = validate_job(project(tmp_path), check_model=False)
    assert isinstance(job, ValidatedJob)
    assert set(job.tasks) == {"math", "code"}
    math, code = job.tasks["math"], job.tasks["code"]
    assert math.rollout.name == "solve" and math.rollout.path == tmp_path / "plugins/main.py"  # plugins'
    assert math.graders == job.graders  # the same plugin, with job.yaml's settings
    assert code.rollout.name == "code_solve" and code.rollout.path == tmp_path / "plugins/code.py"
    assert [(g.name, g.weight, g.kind) for g in code.graders] == [("passes", 2.0, Kind.GRADER)]
    assert [g.name for g in code.group_graders] == ["rank"]
    # every plugin deployed once: the top-level set's first, then the tasks' own
    assert [r.name for r in job.plugin_refs()] == ["solve", "exact", "code_solve", "passes", "rank"]


def test_a_row_whose_task_has_no_plugin_set_names_the_file_line_and_task(tmp_path: Path) -> None:
    job = project(tmp_path, rows=[row("math"), row(), row("chem"), row("code")])
    [found] = problems(job)
    assert found.file.endswith("data/train.jsonl") and found.line == 3 and found.field == "task"
    assert "task 'chem' has no plugin set" in found.message
    assert "job.yaml's tasks are code, math" in found.message and "add tasks.chem" in found.message


def test_a_row_naming_a_task_of_a_job_without_tasks_is_refused(tmp_path: Path) -> None:
    [found] = problems(project(tmp_path, tasks="", rows=[row(), row("math")]))
    assert (found.line, found.field) == (2, "task") and "job.yaml's tasks are none" in found.message


def test_a_row_whose_task_is_not_a_name_is_refused(tmp_path: Path) -> None:
    bad = json.dumps({"messages": [{"role": "user", "content": "x"}], "task": 3})
    [found] = problems(project(tmp_path, rows=[row("math"), bad]))
    assert (found.line, found.field) == (2, "task") and "got 3" in found.message


def test_a_task_naming_no_plugin_of_the_job_is_refused(tmp_path: Path) -> None:
    tasks = "tasks:\n  math:\n    graders: [exact, exakt]\n"
    [found] = problems(project(tmp_path, tasks=tasks, rows=[row("math")]))
    assert found.file.endswith("job.yaml") and found.line == 9 and found.field == "tasks.math.graders[1]"
    assert "no plugin of this job is named `exakt`" in found.message and "(exact;" in found.message


def test_a_task_naming_a_plugin_of_another_kind_is_refused(tmp_path: Path) -> None:
    tasks = "tasks:\n  math:\n    graders: [solve]\n"
    [found] = problems(project(tmp_path, tasks=tasks, rows=[row("math")]))
    assert found.field == "tasks.math.graders[0]" and "`solve` is a rollout" in found.message


def test_a_task_entry_whose_file_or_function_is_missing_is_refused(tmp_path: Path) -> None:
    tasks = (
        "tasks:\n  math:\n    graders:\n      - {entry: plugins/nothere.py:exact}\n"
        "      - {entry: plugins/code.py:nothing}\n"
    )
    found = problems(project(tmp_path, tasks=tasks, rows=[row("math")]))
    assert [(p.line, p.field) for p in found] == [
        (10, "tasks.math.graders[0].entry"),
        (11, "tasks.math.graders[1].entry"),
    ]
    assert "plugin file plugins/nothere.py does not exist" in found[0].message
    assert "defines no function `nothing`" in found[1].message


def test_a_task_entry_taking_a_used_name_is_refused_with_the_fix(tmp_path: Path) -> None:
    tasks = "tasks:\n  math:\n    graders: [{entry: plugins/code.py:exact}]\n"
    [found] = problems(project(tmp_path, tasks=tasks, rows=[row("math")]))
    assert found.field == "tasks.math.graders[0].entry"
    assert "plugin name `exact` is already used by plugins.graders[0] (line 6)" in found.message
    assert "(`- exact`)" in found.message and "its own `name:`" in found.message


@pytest.mark.parametrize(
    ("tasks", "field", "said"),
    [
        ("tasks:\n  default: {graders: [exact]}\n", "tasks.default", "the top-level plugins'"),
        ("tasks:\n  math: {rollout: solve}\n", "tasks.math", "at least one grader"),
        ("tasks:\n  math: {graders: [{use: exact, weight: 2}]}\n", "tasks.math.graders[0]", "weight"),
        ("tasks:\n  math: {graders: [{weight: 2}]}\n", "tasks.math.graders[0]", "give a plugin's name"),
    ],
)
def test_malformed_tasks_are_refused_naming_the_field(
    tmp_path: Path, tasks: str, field: str, said: str
) -> None:
    found = problems(project(tmp_path, tasks=tasks))
    assert any(p.field == field and said in p.message for p in found), found


def test_tasks_on_the_trl_trainer_are_refused(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    found = problems(project(tmp_path, head="trainer: trl\n"))
    assert [p.field for p in found] == ["tasks"]
    assert "runs on plugtune's trainer only" in found[0].message and found[0].line == 8


@pytest.mark.parametrize("engine", ["trl", "verl"])
def test_an_engine_run_of_a_multi_task_job_is_refused(tmp_path: Path, engine: str) -> None:
    from plugtune.integrations.recording import EngineRun

    job = validate_job(project(tmp_path), check_model=False)
    with pytest.raises(InvalidValueError) as caught:
        EngineRun.open(job, engine=engine)  # as verl's launcher and a TRL script open their run
    [found] = caught.value.problems
    assert (found.field, found.line) == ("tasks", 7)
    assert f"{engine} scores every row with one plugin set" in found.message


def test_a_multi_task_job_may_leave_the_top_level_graders_out(tmp_path: Path) -> None:
    job = project(tmp_path, rows=[row("math"), row("code")])
    text = job.read_text().replace("  graders: [{entry: plugins/main.py:exact}]\n", "")
    job.write_text(text.replace("graders: [exact]", "graders: [{entry: plugins/main.py:exact}]"))
    validated = validate_job(job, check_model=False)
    assert validated.graders == () and [g.name for g in validated.tasks["math"].graders] == ["exact"]
    # ... but then every row must name a task
    (tmp_path / "data/train.jsonl").write_text("\n".join([row("math"), row(), row("code")]) + "\n")
    [found] = problems(job)
    assert (found.line, found.field) == (2, "task")
    assert "the row names no task, and job.yaml's plugins have no grader" in found.message
    assert "one of code, math" in found.message


def test_a_job_without_graders_or_tasks_is_refused(tmp_path: Path) -> None:
    job = project(tmp_path, tasks="", rows=[row()])
    job.write_text(job.read_text().replace("  graders: [{entry: plugins/main.py:exact}]\n", ""))
    found = problems(job)
    assert any("at least one grader or group grader is needed" in p.message for p in found), found
