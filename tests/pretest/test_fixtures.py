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
