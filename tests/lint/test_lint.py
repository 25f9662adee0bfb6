from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.lint import RULES, lint_file, lint_paths, lint_source
from plugtune.sdk.decorators import Kind

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "lint"
EXPECT = re.compile(r"#.*expect: (?P<rules>(PT\d{3} ?)+)")


def expected(path: Path) -> set[tuple[int, str]]:
    """The (line, rule) pairs a fixture marks with `# expect: PTxxx`."""
    out = set()
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        match = EXPECT.search(line)
        if match:
            out.update((number, rule) for rule in match["rules"].split())
    return out


def found(path: Path, **kwargs: object) -> set[tuple[int, str]]:
    return {(f.line, f.rule) for f in lint_file(path, **kwargs)}  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "name", ["blocking.py", "graders_bad.py", "plugins/undecorated.py", "plugins/foreign.py"]
)
def test_each_pattern_is_found_at_its_line(name: str) -> None:
    path = FIXTURES / name
    want = expected(path)
    assert want, "the fixture marks what it expects"
    assert found(path) == want


@pytest.mark.parametrize("name", ["blocking_ok.py", "graders_ok.py"])
def test_clean_code_is_quiet(name: str) -> None:
    assert lint_file(FIXTURES / name) == []


def test_job_yaml_tells_which_functions_are_plugins() -> None:
    report = lint_paths([FIXTURES / "project"])
    main = FIXTURES / "project/plugins/main.py"
    assert {(f.line, f.rule) for f in report.findings} == expected(main)
    assert all(Path(f.file).resolve() == main for f in report.findings)
    wrong = next(f for f in report.findings if f.rule == "PT403")
    assert "as a grader" in wrong.message and "@rollout" in wrong.message


def test_every_finding_has_location_rule_and_one_line_fix() -> None:
    report = lint_paths([FIXTURES])
    assert {f.rule for f in report.findings} == set(RULES) - {"PT000"}
    for f in report.findings:
        assert f.line >= 1 and f.col >= 1
        assert f.fix and "\n" not in f.fix
        assert str(f).startswith(f"{f.file}:{f.line}:{f.col}: {f.rule} [{f.name}]")
    blocking = [f for f in report.findings if f.rule == "PT101"]
    assert all("drop `async` so the runtime runs the function in threads" in f.fix for f in blocking)
    assert any("asyncio.sleep" in f.fix for f in blocking)


def test_syntax_error_is_a_finding_not_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "broken.py"
    bad.write_text("def solve(ctx, policy, sample):\n    return (\n")
    (finding,) = lint_file(bad)
    assert finding.rule == "PT000" and finding.line >= 2
    assert "does not parse" in finding.message
    nul = lint_source(b"x = 1\x00\n", "nul.py")
    assert [f.rule for f in nul] == ["PT000"]


def test_noqa_silences_only_the_named_rule() -> None:
    source = (
        "import time\n"
        "async def a():\n"
        "    time.sleep(1)  # noqa: PT101\n"
        "    time.sleep(1)  # noqa: E501\n"
        "    time.sleep(1)  # noqa\n"
    )
    assert [(f.line, f.rule) for f in lint_source(source)] == [(4, "PT101")]


def test_expected_kinds_apply_the_grader_rules() -> None:
    source = "def judge(a, b, c):\n    if a:\n        return 1.0\n"
    findings = lint_source(source, expected={"judge": Kind.GRADER})
    assert {f.rule for f in findings} == {"PT401", "PT203"}


def test_missing_path_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        lint_paths([tmp_path / "nope"])


def test_cli_exit_status_and_json(tmp_path: Path) -> None:
    runner = CliRunner()
    clean = tmp_path / "clean"
    clean.mkdir()
    shutil.copy(FIXTURES / "graders_ok.py", clean)
    result = runner.invoke(app, ["lint", str(clean)])
    assert result.exit_code == 0, result.output
    assert result.stdout == ""  # nothing to fix; stderr says what was checked
    said = result.stderr.splitlines()
    assert said[0] == "no finding in 1 Python file(s)", said
    assert said[1].startswith("  plugins checked: ") and "graders_ok.py: exact (grader), " in said[1]
    assert "ranks (group_grader)" in said[1] and said[2].startswith("  rules: PT000 syntax-error, ")
    assert all(rule in said[2] for rule in RULES)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "helpers.py").write_text("def add(a, b):\n    return a + b\n")
    result = runner.invoke(app, ["lint", str(empty)])
    assert (
        result.exit_code == 0 and "no finding in 1 Python file(s), and no plugin among them" in result.stderr
    )
    result = runner.invoke(app, ["lint", str(FIXTURES / "blocking.py")])
    assert result.exit_code == 1
    assert "PT101 [blocking-call]" in result.output and "fix:" in result.output
    result = runner.invoke(app, ["lint", "--json", str(FIXTURES / "graders_bad.py")])
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    want = len(expected(FIXTURES / "graders_bad.py"))
    assert document["summary"]["findings"] == len(document["findings"]) == want
    assert {"file", "line", "col", "rule", "name", "message", "fix"} <= set(document["findings"][0])
    result = runner.invoke(app, ["lint", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "no such file" in result.output


def test_graders_without_fixtures_are_a_note_not_a_finding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from plugtune.init_project import create_project

    project = tmp_path / "two graders"
    create_project(project)
    grader = project / "plugins/grader.py"
    grader.write_text(
        grader.read_text() + "\n\n@grader(weight=0.5)\n"
        "def brief(ctx: Context, sample: Sample, trajectory: Trajectory) -> float:\n"
        "    return 1.0 if len(trajectory.completion) < 40 else 0.0\n"
    )
    job = project / "job.yaml"
    job.write_text(
        job.read_text().replace(
            "    - {entry: plugins/grader.py:exact, weight: 1.0}\n",
            "    - {entry: plugins/grader.py:exact, weight: 1.0}\n"
            "    - {entry: plugins/grader.py:brief, weight: 0.5, name: short}\n",
        )
    )
    monkeypatch.chdir(project)
    runner = CliRunner()
    # the template's fixtures name no grader: with two graders in the job they cover neither
    result = runner.invoke(app, ["lint"])
    assert result.exit_code == 0 and result.stdout == "", result.output
    assert "note: job.yaml: no fixture in fixtures.jsonl covers grader(s) exact, short;" in result.stderr
    (project / "fixtures.jsonl").write_text(
        '{"grader": "exact", "row": 0, "completion": "3 + 4 = 7", "expect": 1.0}\n'
        "not json: skipped here, plugtune test names it\n"
    )
    report = lint_paths(["."])
    assert report.findings == []
    assert report.graders_without_fixtures == [
        {"job": "job.yaml", "grader": "short", "fixtures": "fixtures.jsonl"}
    ]
    result = runner.invoke(app, ["lint"])
    assert result.exit_code == 0 and result.stdout == ""  # a note leaves the exit status alone
    assert result.stderr.startswith("no finding in 2 Python file(s) and 1 job.yaml file(s)")
    notes = [line for line in result.stderr.splitlines() if line.startswith("note:")]
    assert notes == [
        'note: job.yaml: no fixture in fixtures.jsonl covers grader(s) short; add a line with "grader": '
        '"short" and run plugtune test --expect fixtures.jsonl'
    ]
    document = json.loads(runner.invoke(app, ["lint", "--json"]).stdout)
    assert document["findings"] == [] and document["summary"]["findings"] == 0
    assert document["summary"]["graders_without_fixtures"] == report.graders_without_fixtures
    # with a finding, the exit status is lint's own (1) and the note is still there
    grader.write_text(grader.read_text().replace("return None", "return float('nan')"))
    result = runner.invoke(app, ["lint"])
    assert result.exit_code == 1 and "PT201" in result.stdout and "note:" not in result.stdout
    assert "1 finding(s) in 3 file(s)" in result.stderr and "covers grader(s) short;" in result.stderr
    assert [f.rule for f in lint_paths(["."]).findings] == ["PT201"]


def test_a_group_grader_is_noted_until_a_fixture_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from plugtune.init_project import create_project

    project = tmp_path / "group"
    create_project(project)
    (project / "plugins/groups.py").write_text(
        "from plugtune import group_grader\n\n\n@group_grader\n"
        "def longest(ctx, sample, trajectories):\n"
        "    return [float(len(t.completion)) for t in trajectories]\n"
    )
    job = project / "job.yaml"
    start = job.read_text().index("failure_policy:")
    text = job.read_text()
    job.write_text(
        text[:start] + "  group_graders:\n    - {entry: plugins/groups.py:longest}\n" + text[start:]
    )
    monkeypatch.chdir(project)
    monkeypatch.setenv("PLUGTUNE_HOME", str(tmp_path / "home"))
    # the template's fixtures cover its one grader (they name none), not the group grader
    assert lint_paths(["."]).graders_without_fixtures == [
        {"job": "job.yaml", "grader": "longest", "fixtures": "fixtures.jsonl"}
    ]
    result = CliRunner().invoke(app, ["lint"])
    assert result.exit_code == 0 and "covers grader(s) longest;" in result.stderr, result.output
    with (project / "fixtures.jsonl").open("a") as f:
        f.write('{"grader": "longest", "row": 0, "completions": ["a", "bb"], "expect": [1.0, 2.0]}\n')
    assert lint_paths(["."]).graders_without_fixtures == []
    result = CliRunner().invoke(app, ["lint"])
    assert result.exit_code == 0 and "note:" not in result.stderr, result.output
    # and the fixture the note asked for passes
    result = CliRunner().invoke(app, ["test", "--expect", "fixtures.jsonl"])
    assert result.exit_code == 0 and "5 of 5 fixtures passed" in result.stdout, result.output
