"""Multi-task job.yaml and dataset rows written carelessly or hostilely (tests/security's review):
every bad input is a Problem naming its file, line and field, short enough to read; the names a
task makes its metrics from fit the metrics store. Uses tests/spec/test_tasks.py's project."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from plugtune.errors import InvalidValueError, Problem
from plugtune.spec.validation import validate_job
from tests.spec.test_tasks import project, row


def refused(job: Path) -> list[Problem]:
    started = time.monotonic()
    with pytest.raises(InvalidValueError) as caught:
        validate_job(job, check_model=False)
    assert time.monotonic() - started < 20
    return caught.value.problems


def row_with(task: object) -> str:
    return json.dumps({"messages": [{"role": "user", "content": "x"}], "task": task})


@pytest.mark.parametrize(
    ("task", "said"),
    [
        (["math"], "got ['math']"),
        ({"a": 1}, "got {'a': 1}"),
        (None, "got None"),
        (3.5, "got 3.5"),
        (True, "got True"),
        ("", "got ''"),
        ("../math", "got '../math'"),
        ("mäth", "got 'mäth'"),
        ("math/x", "got 'math/x'"),
        ("math@task=x", "got 'math@task=x'"),
        ("a" * 65, "got 'aaaa"),
        ("a" * 1_000_000, "(1000002 characters)"),  # was the whole megabyte, quoted
        (list(range(200_000)), "characters)"),
    ],
)
def test_a_rows_task_of_any_wrong_type_or_shape_is_named_briefly(
    tmp_path: Path, task: object, said: str
) -> None:
    [found] = refused(project(tmp_path, rows=[row("math"), row_with(task)]))
    assert found.file.endswith("data/train.jsonl") and (found.line, found.field) == (2, "task")
    assert "must be a task name of job.yaml's tasks" in found.message and said in found.message
    assert len(str(found)) < 400, len(str(found))


@pytest.mark.parametrize(
    ("key", "field", "said"),
    [
        ("mäth", "tasks.mäth", "must start with a letter or _"),
        ("a" * 65, "tasks." + "a" * 65, "(at most 64)"),
        ("../x", "tasks.../x", "must start with a letter or _"),
        ("a/b", "tasks.a/b", "must start with a letter or _"),
        ("a@b", "tasks.a@b", "must start with a letter or _"),
        ("default", "tasks.default", "the task 'default' is the top-level plugins'"),
        ("''", "tasks.", "must start with a letter or _"),
        ("~", "tasks.None", "valid string"),
        ("3", "tasks[3]", "valid string"),
    ],
)
def test_a_hostile_task_name_is_refused_naming_its_line_and_field(
    tmp_path: Path, key: str, field: str, said: str
) -> None:
    job = project(tmp_path, tasks=f"tasks:\n  {key}:\n    graders: [exact]\n", rows=[row()])
    [found] = refused(job)
    assert found.file.endswith("job.yaml") and found.line in (7, 8) and found.field == field, found
    assert said in found.message


def test_a_task_and_plugin_name_too_long_for_the_metric_store_is_refused(tmp_path: Path) -> None:
    """task/<64 chars>/grader/<150 chars>/unscorable_share is 244 characters: PostgreSQL refuses a
    metric name over 200 (value too long) and with it the whole batch of points (the job validated)."""
    function, task = "g" * 150, "t" * 64
    tasks = f"tasks:\n  {task}:\n    graders: [{{entry: 'plugins/long.py:{function}'}}]\n"
    job = project(tmp_path, tasks=tasks, rows=[row(task)])
    (tmp_path / "plugins/long.py").write_text(
        f"from plugtune import grader\n\n@grader\ndef {function}(ctx, sample, trajectory):\n    return 1.0\n"
    )
    [found] = refused(job)
    assert found.file.endswith("job.yaml") and found.line == 9 and found.field == f"tasks.{task}.graders[0]"
    assert "would have names of 244 characters" in found.message and "at most 200" in found.message
    ok = project(
        tmp_path / "ok", tasks="tasks:\n  " + "t" * 64 + ":\n    graders: [exact]\n", rows=[row(task)]
    )
    assert validate_job(ok, check_model=False).tasks


def test_thousands_of_tasks_are_named_briefly_and_too_many_is_not_blamed_on_aliases(tmp_path: Path) -> None:
    many = "tasks:\n" + "".join(f"  t{i}: {{graders: [exact]}}\n" for i in range(1000))
    problems = refused(project(tmp_path / "a", tasks=many, rows=[row("t1"), *[row("nope")] * 30]))
    assert len(problems) >= 20 and all(p.field == "task" for p in problems[:20])
    assert "and 980 more" in problems[0].message and len(str(problems[0])) < 600  # it listed 1,000
    too_many = "tasks:\n" + "".join(f"  t{i}: {{graders: [exact]}}\n" for i in range(5000))
    [found] = refused(project(tmp_path / "b", tasks=too_many, rows=[row("t1")]))
    assert found.file.endswith("job.yaml") and found.line == 8
    assert "aliases" not in found.message and "more than 20000 values" in found.message


def test_held_anchors_merge_keys_and_wrong_shapes(tmp_path: Path) -> None:
    """What held: anchors and merge keys are read as written, a billion laughs is bounded, and a
    task's wrong shapes or a plugin of another kind are named by field."""
    merged = "tasks:\n  math: &m\n    graders: [exact]\n  code:\n    <<: *m\n"
    job = validate_job(
        project(tmp_path / "a", tasks=merged, rows=[row("math"), row("code")]), check_model=False
    )
    assert set(job.tasks) == {"math", "code"}
    laughs = "".join(
        f"{n}: &{n} [{', '.join(['*' + p] * 10 if p else ['x'] * 10)}]\n"
        for p, n in zip(["", "a", "b", "c", "d", "e"], ["a", "b", "c", "d", "e", "f"], strict=True)
    )
    [found] = refused(project(tmp_path / "b", head=laughs, tasks="", rows=[row()]))
    assert "when its aliases (*name) are expanded" in found.message
    for n, (tasks, field, said) in enumerate(
        [
            ("tasks: [math]\n", "tasks", "must be a mapping"),
            ("tasks:\n  math:\n", "tasks.math", "must be a mapping"),
            ("tasks:\n  math:\n    graders: exact\n", "tasks.math.graders", "valid list"),
            ("tasks:\n  math:\n    graders: [3]\n", "tasks.math.graders[0]", "must be a mapping"),
            ("tasks:\n  math:\n    graders: [rank]\n", "tasks.math.graders[0]", "no plugin of this job"),
            (
                "tasks:\n  math:\n    rollout: exact\n    graders: [exact]\n",
                "tasks.math.rollout",
                "is a grader",
            ),
        ]
    ):
        problems = refused(project(tmp_path / f"c{n}", tasks=tasks, rows=[row()]))
        assert any(p.field == field and said in p.message and p.line for p in problems), problems


def test_a_row_naming_default_without_top_level_graders_is_not_told_to_add_tasks_default(
    tmp_path: Path,
) -> None:
    """The advice was 'add tasks.default to job.yaml', which validation refuses ('default' is the
    top-level plugins'): it says to name one of the tasks, or give plugins graders."""
    job = project(tmp_path, tasks="tasks:\n  math:\n    graders: [{entry: 'plugins/code.py:passes'}]\n")
    job.write_text(job.read_text().replace("  graders: [{entry: plugins/main.py:exact}]\n", ""))
    (tmp_path / "data/train.jsonl").write_text(row("math") + "\n" + row("default") + "\n")
    [found] = refused(job)
    assert (found.line, found.field) == (2, "task") and "add tasks.default" not in found.message
    assert "names the task 'default' (the top-level plugins)" in found.message
    assert "give it a task: (one of math), or add graders to plugins" in found.message
