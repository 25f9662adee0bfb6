"""plugtune test --expect: a job's graders against replies whose result is known, for CI."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.init_project import create_project

GRADERS = """
from plugtune import Retry, grader


@grader
def exact(ctx, sample, trajectory):
    answer = sample.extra.get("answer")
    if answer is None:
        return None
    if trajectory.completion == "boom":
        raise ValueError("boom")
    if trajectory.completion == "again":
        raise Retry("the judge said try again")
    return 1.0 if answer in trajectory.completion else 0.0


@grader
def short(ctx, sample, trajectory):
    return 1.0 / (1 + len(trajectory.completion))
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "task"
    create_project(folder)
    (folder / "plugins/graders.py").write_text(GRADERS)
    job = (folder / "job.yaml").read_text()
    start = job.index("  graders:")
    end = job.index("\n", job.index("plugins/grader.py", start)) + 1
    (folder / "job.yaml").write_text(
        job[:start]
        + "  graders:\n    - {entry: plugins/graders.py:exact}\n    - {entry: plugins/graders.py:short}\n"
        + job[end:]
    )
    monkeypatch.chdir(folder)
    monkeypatch.setenv("PLUGTUNE_HOME", str(tmp_path / "home"))
    return folder


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["test", *args])
    return result.exit_code, result.stdout, result.stderr


def _write(project: Path, *rows: dict[str, object]) -> str:
    (project / "fx.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return "fx.jsonl"


def test_each_kind_of_expectation_passes_or_fails_with_an_exit_code_for_ci(project: Path) -> None:
    name = _write(
        project,
        {"row": 0, "completion": "7", "expect": 1, "grader": "exact", "name": "right"},
        {"row": 0, "completion": "8", "expect": 0.0, "grader": "exact"},
        {"sample": {"prompt": "hi"}, "completion": "x", "expect": None, "grader": "exact"},
        {"row": 0, "completion": "boom", "expect": "error", "grader": "exact"},
        {"row": 0, "completion": "again", "expect": "retry", "grader": "exact"},
        {"row": 0, "completion": "abc", "expect": 0.25, "tolerance": 0.001, "grader": "short"},
        {"row": 0, "messages": [{"role": "assistant", "content": "7"}], "expect": 1.0, "grader": "exact"},
    )
    code, out, _ = _run("--expect", name, "--json")
    doc = json.loads(out)
    assert code == 0, doc
    assert doc["summary"] == {"ok": True, "fixtures": 7, "passed": 7}
    assert doc["fixtures"][3]["got"].startswith("error: 500: ValueError: boom")
    assert doc["fixtures"][4]["got"] == "retry: the judge said try again"
    # one wrong expectation: exit 1, and the table says which line and what the grader gave
    name = _write(project, {"row": 0, "completion": "8", "expect": 1.0, "grader": "exact", "name": "wrong"})
    code, out, _ = _run("--expect", name)
    assert code == 1
    assert "FAIL" in out and "wrong" in out and "0 of 1 fixtures passed" in out


def test_a_bad_fixtures_file_names_each_line_and_field_and_runs_nothing(project: Path) -> None:
    (project / "fx.jsonl").write_text(
        '{"row": 0, "completion": "7", "expect": 1}\n'  # two graders: which one?
        "not json\n"
        '{"row": 99, "completion": "7", "expect": 1, "grader": "exact"}\n'
        '{"row": 0, "completion": "7", "expect": "great", "grader": "exact"}\n'
        '{"row": 0, "expect": 1, "grader": "nope"}\n'
        '{"row": 0, "completion": "7", "expect": 1, "grader": "exact", "weight": 2}\n'
    )
    code, _, err = _run("--expect", "fx.jsonl")
    assert code == 2
    for where in (
        "fx.jsonl:1 [grader]: the job has 2 graders (exact, short): name one",
        "fx.jsonl:2: is not JSON",
        "fx.jsonl:3 [row]: must be a row index from 0 to 15",
        "fx.jsonl:4 [expect]: must be a finite number, null or one of failure, retry, discard, error",
        "fx.jsonl:5 [grader]: no grader 'nope' in the job",
        "fx.jsonl:6 [weight]: unknown key(s) weight",
    ):
        assert where in err, err
    code, _, err = _run("--expect", "missing.jsonl")
    assert code == 2 and "missing.jsonl: cannot be read" in err
    with (project / "huge.jsonl").open("wb") as f:  # sparse: the size is refused before any read
        f.truncate((64 << 20) + 1)
    code, _, err = _run("--expect", "huge.jsonl")
    assert code == 2 and "huge.jsonl: is 67108865 bytes; a fixtures file holds at most 67108864" in err


GROUP_GRADERS = """
from plugtune import Discard, group_grader


@group_grader
def shortest(ctx, sample, trajectories):
    lengths = [len(t.completion) for t in trajectories]
    if len(set(lengths)) == 1:
        raise Discard("every reply has the same length")
    least = min(n for n in lengths if n)  # an empty reply is unscorable
    return [None if n == 0 else (1.0 if n == least else 0.0) for n in lengths]
"""


@pytest.fixture
def group_project(project: Path) -> Path:
    (project / "plugins/groups.py").write_text(GROUP_GRADERS)
    job = (project / "job.yaml").read_text()
    start = job.index("failure_policy:")
    group = "  group_graders:\n    - {entry: plugins/groups.py:shortest, name: brevity}\n"
    (project / "job.yaml").write_text(job[:start] + group + job[start:])
    return project


GROUP_FIXTURES: list[dict[str, object]] = [
    {"row": 0, "completions": ["7", "7 !", ""], "expect": [1.0, 0.0, None], "grader": "brevity"},
    {"sample": {"prompt": "hi"}, "completions": ["a", "b"], "expect": "discard", "grader": "brevity"},
    {"row": 0, "completion": "7", "expect": 1.0, "grader": "exact", "name": "beside a grader's"},
]


def test_group_grader_fixtures_give_the_group_its_replies_and_compare_each_reward(
    group_project: Path,
) -> None:
    name = _write(group_project, *GROUP_FIXTURES)
    code, out, _ = _run("--expect", name, "--json")
    doc = json.loads(out)
    assert code == 0, doc
    assert doc["summary"] == {"ok": True, "fixtures": 3, "passed": 3}
    first = doc["fixtures"][0]
    assert (first["grader"], first["group"], first["expect"]) == ("brevity", True, [1.0, 0.0, None])
    assert first["got"] == "[1.0, 0.0, None]"
    assert doc["fixtures"][1]["got"] == "discard: every reply has the same length"
    assert doc["fixtures"][2]["group"] is False
    # one reward off (the shortest reply scored as the longest): exit 1, the table names the line
    name = _write(
        group_project,
        {"row": 0, "completions": ["7", "7 !"], "expect": [0.0, 1.0], "grader": "brevity", "name": "swapped"},
        {"row": 0, "completions": ["7", "7 !"], "expect": [1.0, 0.05], "tolerance": 0.1, "grader": "brevity"},
    )
    code, out, _ = _run("--expect", name)
    assert code == 1, out
    assert "swapped" in out and "[0.0, 1.0] ± 1e-06" in out and "[1.0, 0.0]" in out
    assert out.count("FAIL") == 1 and "1 of 2 fixtures passed" in out
    code, out, _ = _run("--expect", name, "--json")
    assert code == 1 and [f["passed"] for f in json.loads(out)["fixtures"]] == [False, True]


def test_a_bad_group_fixture_names_its_line_and_field_and_runs_nothing(group_project: Path) -> None:
    (group_project / "fx.jsonl").write_text(
        '{"row": 0, "completions": ["7", "8"], "expect": [1.0, 0.0], "grader": "brevity"}\n'
        '{"row": 0, "completions": ["7", "8", "9"], "expect": [1.0, 0.0], "grader": "brevity"}\n'
        '{"row": 0, "completions": ["7", "8"], "expect": 1.0, "grader": "brevity"}\n'
        '{"row": 0, "completion": "7", "expect": [1.0], "grader": "brevity"}\n'
        '{"row": 0, "completions": [], "expect": [], "grader": "brevity"}\n'
        '{"row": 0, "completions": ["7"], "expect": [1.0], "grader": "exact"}\n'
        '{"row": 0, "completions": ["7", 8], "expect": [1.0, 0.0], "grader": "brevity"}\n'
        '{"row": 0, "completions": ["7"], "expect": [true], "grader": "brevity"}\n'
    )
    code, out, err = _run("--expect", "fx.jsonl")
    assert code == 2 and out == ""
    for where in (
        "fx.jsonl:2 [expect]: has 2 value(s) for 3 completion(s): one reward or null per completion",
        "fx.jsonl:3 [expect]: must be a list of finite numbers or null (one per completion)",
        "fx.jsonl:4 [completion]: 'brevity' is a group grader: give the group's replies as completions",
        "fx.jsonl:5 [completions]: must be a list of 1 to 1024 strings",
        "fx.jsonl:6 [completions]: is for a group grader; 'exact' scores one reply",
        "fx.jsonl:7 [completions]: must be a list of 1 to 1024 strings",
        "fx.jsonl:8 [expect]: must be a list of finite numbers or null",
    ):
        assert where in err, err
    assert "fx.jsonl:1" not in err


@pytest.mark.skipif(os.geteuid() != 0, reason="the function runtime's sandbox needs root here")
def test_group_fixtures_run_in_the_function_runtime_with_faas(group_project: Path) -> None:
    name = _write(group_project, *GROUP_FIXTURES)
    code, out, _ = _run("--expect", name, "--faas", "--json")
    assert code == 0 and json.loads(out)["summary"] == {"ok": True, "fixtures": 3, "passed": 3}, out
    name = _write(
        group_project, {"row": 0, "completions": ["7", "7 !"], "expect": [0.0, 1.0], "grader": "brevity"}
    )
    code, out, _ = _run("--expect", name, "--faas", "--json")
    assert code == 1 and json.loads(out)["fixtures"][0]["got"] == "[1.0, 0.0]", out


@pytest.mark.skipif(os.geteuid() != 0, reason="the function runtime's sandbox needs root here")
def test_fixtures_run_in_the_function_runtime_with_faas(project: Path) -> None:
    name = _write(project, {"row": 1, "completion": "21 + 10 = 31", "expect": 1.0, "grader": "exact"})
    code, out, _ = _run("--expect", name, "--faas", "--json")
    assert code == 0 and json.loads(out)["summary"]["passed"] == 1, out


def test_the_init_projects_fixtures_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "fresh"
    create_project(folder)
    monkeypatch.chdir(folder)
    monkeypatch.setenv("PLUGTUNE_HOME", str(tmp_path / "home"))
    code, out, _ = _run("--expect", "fixtures.jsonl")
    assert code == 0 and "4 of 4 fixtures passed" in out, out
