from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from typer.testing import CliRunner

from plugtune import Context, Retry, Sample, Trajectory
from plugtune.cli import app
from plugtune.init_project import ProjectExistsError, create_project, project_name
from plugtune.lint import lint_paths
from plugtune.sdk import Kind, Policy, PolicyError, spec_of
from plugtune.spec.models import resolve_model
from plugtune.spec.validation import read_dataset, validate_job

DEMO_MODEL = resolve_model("builtin:tiny-chat", Path("."))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    create_project(tmp_path / "my task")
    return tmp_path / "my task"


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"plugin_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_init_writes_a_ready_project(project: Path) -> None:
    files = sorted(str(p.relative_to(project)) for p in project.rglob("*") if p.is_file())
    assert files == [
        "README.md",
        "data/train.jsonl",
        "fixtures.jsonl",
        "job.yaml",
        "plugins/grader.py",
        "plugins/rollout.py",
    ]
    assert "name: my-task" in (project / "job.yaml").read_text()
    assert (project / "README.md").read_text().startswith("# my-task")
    rows = read_dataset(project / "data/train.jsonl")
    assert len(rows) == 16
    assert rows[0]["messages"][-1]["content"] == "What is 3+4?" and rows[0]["extra"]["answer"] == "7"


def test_init_project_passes_validation(project: Path) -> None:
    # The demo model is built by scripts/make_demo_model.py; without it only that check is skipped.
    job = validate_job(project / "job.yaml", check_model=(DEMO_MODEL / "config.json").is_file())
    assert job.model_dir == DEMO_MODEL
    assert job.rollout.function == "solve" and job.rollout.path == project.resolve() / "plugins/rollout.py"
    assert [g.function for g in job.graders] == ["exact"]
    assert job.train_rows == 16
    assert job.spec.plugins.rollout is not None and job.spec.plugins.rollout.runtime is not None


def test_lint_is_quiet_on_the_init_project(project: Path) -> None:
    report = lint_paths([project])
    assert sorted(Path(f).name for f in report.files) == ["grader.py", "job.yaml", "rollout.py"]
    assert report.findings == []
    assert report.graders_without_fixtures == []  # the template's fixtures.jsonl covers its grader


def test_init_refuses_to_overwrite(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(ProjectExistsError, match="not empty"):
        create_project(tmp_path)
    with pytest.raises(ProjectExistsError, match="not a folder"):
        create_project(tmp_path / "keep.txt")
    assert (tmp_path / "keep.txt").read_text() == "mine"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert len(create_project(empty)) == 6


def test_project_name_is_a_valid_job_name() -> None:
    assert project_name("my task!") == "my-task"
    assert project_name("...") == "plugtune-project"


@dataclass(frozen=True)
class ScriptedPolicy(Policy):
    """Answers with the scripted assistant messages in order; records each request."""

    script: list[Any] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)

    def chat(self, messages: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
        self.requests.append({"messages": list(messages), **params})
        step = self.script[len(self.requests) - 1]
        if isinstance(step, Exception):
            raise step
        return {"choices": [{"message": step}]}

    async def achat(self, messages: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
        return self.chat(messages, **params)


def tool_call(arguments: str) -> dict[str, Any]:
    call = {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": arguments}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


async def test_rollout_handles_tool_use_and_a_model_that_skips_the_tool(project: Path) -> None:
    module = load(project / "plugins/rollout.py")
    spec = spec_of(module.solve)
    assert spec is not None and spec.kind is Kind.ROLLOUT and spec.is_async
    question = [{"role": "user", "content": "What is 3+4?"}]
    plain = Sample(messages=question, extra={"answer": "7"})
    sample = Sample(messages=question, tools=[module.CALCULATOR], extra={"answer": "7"})

    direct = ScriptedPolicy("http://unused", "k", script=[{"role": "assistant", "content": "7"}])
    assert await module.solve(Context(), direct, plain) is None
    assert len(direct.requests) == 1 and "tools" not in direct.requests[0]

    skips_tool = ScriptedPolicy("http://unused", "k", script=[{"role": "assistant", "content": "7"}])
    assert await module.solve(Context(), skips_tool, sample) is None
    assert len(skips_tool.requests) == 1
    assert skips_tool.requests[0]["tools"][0]["function"]["name"] == "calculator"

    with_tool = ScriptedPolicy(
        "http://unused",
        "k",
        script=[tool_call(json.dumps({"expression": "3+4"})), {"role": "assistant", "content": "7"}],
    )
    ctx = Context()
    assert await module.solve(ctx, with_tool, sample) is None
    assert with_tool.requests[1]["messages"][-1] == {"role": "tool", "tool_call_id": "c1", "content": "7"}
    assert ctx.metrics["turns"] == 2

    bad_call = ScriptedPolicy(
        "http://unused",
        "k",
        script=[tool_call("not json"), tool_call('{"expression": "1/0"}'), tool_call("{}")],
    )
    assert await module.solve(Context(), bad_call, sample) is None
    tool_replies = [r["messages"][-1]["content"] for r in bad_call.requests[1:]]
    assert tool_replies[0].startswith("error:") and "division by zero" in tool_replies[1]

    refused = ScriptedPolicy("http://unused", "k", script=[PolicyError("policy gateway answered 400")])
    with pytest.raises(Retry, match="policy error"):
        await module.solve(Context(), refused, sample)


def test_grader_scores_finite_or_none(project: Path) -> None:
    module = load(project / "plugins/grader.py")
    assert spec_of(module.exact) is not None

    def score(completion: str, extra: dict[str, Any]) -> float | None:
        trajectory = Trajectory("t", [{"role": "assistant", "content": completion}])
        result: float | None = module.exact(Context(), Sample(messages=[], extra=extra), trajectory)
        return result

    assert score("The answer is 7", {"answer": "7"}) == 1.0
    assert score("7.0", {"answer": 7}) == 1.0
    assert score("8", {"answer": "7"}) == 0.0
    assert score("seven", {"answer": "7"}) == 0.0
    assert score("", {"answer": "7"}) == 0.0
    assert score("7", {}) is None


def test_cli_init(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["init", str(tmp_path / "p"), "--name", "arith"])
    assert result.exit_code == 0, result.output
    assert "plugins/rollout.py" in result.output
    assert "name: arith" in (tmp_path / "p/job.yaml").read_text()
    again = runner.invoke(app, ["init", str(tmp_path / "p")])
    assert again.exit_code == 1 and "not empty" in again.output


def test_cli_lint_in_the_project_folder_is_quiet(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project)
    result = CliRunner().invoke(app, ["lint"])
    assert result.exit_code == 0 and result.stdout == ""  # no finding; what it checked goes to stderr
    assert "no finding in 2 Python file(s)" in result.stderr and "solve (rollout)" in result.stderr
    assert "note:" not in result.stderr  # the template's fixtures cover its grader
    (project / "plugins/grader.py").write_text(
        (project / "plugins/grader.py").read_text().replace("return None", "return float('nan')")
    )
    result = CliRunner().invoke(app, ["lint"])
    assert result.exit_code == 1 and "plugins/grader.py:" in result.output and "PT201" in result.output
