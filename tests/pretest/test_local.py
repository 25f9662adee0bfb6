"""``plugtune test`` (in-process): the init project passes; each faulty plugin fails with its cause."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.init_project import create_project
from plugtune.pretest.command import local_test
from plugtune.pretest.relay import PolicyRelay, completion
from tests.pretest.helpers import FAULTY, causes, injected, options


def test_init_project_passes(tmp_path: Path) -> None:
    create_project(tmp_path / "p")
    doc = local_test(options(tmp_path / "p" / "job.yaml", samples=2))
    assert doc["summary"]["ok"], doc["summary"]
    assert [c["name"] for c in doc["calls"]].count("solve") == 2
    for t in doc["trajectories"]:
        assert t["status"] == "success"
        assert [m["role"] for m in t["messages"]][-1] == "assistant"  # what the demo model answered
        assert set(t["reward_components"]) == {"exact"} and t["reward"] in (0.0, 1.0)
        assert any("answer after" in line["message"] for line in t["logs"])


CASES = [
    ("raising_grader", "raises", "500", "graders.py:19 in raises"),
    ("nan_grader", "nan", "Invalid reward", "NaN"),
    ("sleeping_rollout", "sleeps", "Timeout", "timeout_s=0.5"),
    ("exiting_rollout", "exits", "EOF", "os._exit(3)"),
]


@pytest.mark.parametrize(("job", "plugin", "cause", "evidence"), CASES, ids=[c[0] for c in CASES])
def test_faulty_plugin_fails_with_its_cause(job: str, plugin: str, cause: str, evidence: str) -> None:
    doc = local_test(options(job, samples=2))
    summary = doc["summary"]
    assert not summary["ok"] and summary["failed_calls"] == 2
    failed = [c for c in doc["calls"] if c["error"]]
    assert {c["name"] for c in failed} == {plugin}
    assert all(c["plugin"].endswith(f":{plugin}") for c in failed)
    assert all(c["error"]["type"] == "Call plugin error" for c in failed)
    assert set(summary["errors_by_cause"]) == {cause}
    first = summary["errors_by_cause"][cause]
    assert evidence in first["message"] + first["traceback"], first
    for t in doc["trajectories"]:
        assert t["status"] == "failed" and t["reward"] is None
        assert t["errors"][0]["cause"] == cause and t["errors"][0]["hint"]


def test_injected_fault_in_process() -> None:
    doc = local_test(options("ok", samples=2, injection=injected("500")))
    assert causes(doc) == ["500", "500"]
    assert "injected fault" in doc["calls"][0]["error"]["message"]


def test_policy_url_is_used_and_recorded() -> None:
    """--policy-url: any OpenAI-compatible endpoint; the conversation is recorded without tokens."""
    asked: list[list[dict[str, Any]]] = []

    def upstream(trajectory_id: str, body: dict[str, Any]) -> dict[str, Any]:
        asked.append(list(body["messages"]))
        return completion({"role": "assistant", "content": "from upstream"}, "ext-model")

    with PolicyRelay(upstream) as endpoint:
        key = endpoint.open("external").api_key
        doc = local_test(options("policy", samples=2, policy_url=endpoint.base_url, api_key=key))
    assert doc["summary"]["ok"], doc["summary"]
    assert len(asked) == 2 and asked[0][0]["role"] == "user"
    for t in doc["trajectories"]:
        assert t["messages"][-1] == {"role": "assistant", "content": "from upstream"}
        assert any("from upstream" in line["message"] for line in t["logs"])


def test_cli_text_and_json() -> None:
    runner = CliRunner()
    ok = runner.invoke(app, ["test", str(FAULTY / "ok.yaml"), "--samples", "1"])
    assert ok.exit_code == 0, ok.output
    assert "all calls succeeded" in ok.output and "assistant:" in ok.output
    bad = runner.invoke(app, ["test", str(FAULTY / "raising_grader.yaml"), "--samples", "1", "--json"])
    assert bad.exit_code == 1
    doc = json.loads(bad.stdout)
    assert causes(doc) == [None, "500"]
    assert set(doc["calls"][1]) >= {"plugin", "sample_index", "ok", "latency_ms", "error"}
    assert set(doc["calls"][1]["error"]) >= {"type", "cause", "message", "traceback"}


def test_cli_invalid_job_is_exit_2(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: x\nmodel: builtin:tiny-chat\n")
    result = CliRunner().invoke(app, ["test", str(job)])
    assert result.exit_code == 2
    assert "Invalid" in result.output


def test_plugin_that_cannot_load_is_create_faas_fault() -> None:
    doc = local_test(options("broken"))
    assert not doc["summary"]["ok"] and doc["calls"] == []
    assert (
        doc["error"]["cause"] == "Create faas fault" and "plugtune_no_such_module" in doc["error"]["message"]
    )
    assert doc["error"]["traceback"].startswith("broken.py:5 in <module>")
    result = CliRunner().invoke(app, ["test", str(FAULTY / "broken.yaml")])
    assert result.exit_code == 1 and "Create faas fault" in result.output and "what to do" in result.output


@pytest.mark.parametrize("job", ["hangs_grader", "spins_grader", "backtracks_grader"])
def test_hung_sync_grader_is_timeout_and_the_cli_exits(job: str) -> None:
    """A sync grader that never returns (sleep, busy loop, a C call that holds the GIL for hours) is
    reported as Timeout and the command ends."""
    unused = "http://127.0.0.1:9/v1"  # the rollout never calls the policy: no model to load
    cli = "from plugtune.cli import app; app()"
    command = [sys.executable, "-c", cli, "test", str(FAULTY / f"{job}.yaml"), "--samples", "2"]
    done = subprocess.run(
        [*command, "--policy-url", unused, "--json"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    failed = {c["name"]: c["error"]["cause"] for c in doc["calls"] if c["error"]}
    assert len(doc["calls"]) == 4 and failed == {job.split("_")[0]: "Timeout"}
    assert "timeout_s=0.5" in doc["summary"]["errors_by_cause"]["Timeout"]["message"]
    if job == "backtracks_grader":  # what it logged before it was killed is kept
        logs = [line["message"] for t in doc["trajectories"] for line in t["logs"]]
        assert logs.count("about to match") == 2, logs


def test_group_grader_gets_the_jobs_group_size() -> None:
    """With a group grader, each row is rolled out group_size (3) times and graded as one group."""
    doc = local_test(options("group_grader", samples=2, policy_url="http://127.0.0.1:9/v1"))
    assert doc["summary"]["ok"], doc["summary"]["errors_by_cause"]
    names = [c["name"] for c in doc["calls"]]
    assert names.count("answers") == 6 and names.count("exact") == 6 and names.count("ranks") == 2
    for row in (0, 1):
        group = [t for t in doc["trajectories"] if t["sample_index"] == row]
        assert sorted(t["reward_components"]["ranks"] for t in group) == [0.0, 0.5, 1.0]
        assert any("ranking a group of 3" in line["message"] for t in group for line in t["logs"])


def test_a_grader_with_signal_timeouts_runs_as_in_the_function_runtime(tmp_path: Path) -> None:
    """math-verify-style signal timeouts work in-process with max_concurrency: 1 (each call on its
    process's main thread, as an instance runs it); with max_concurrency: 2 they fail as in a job
    (pool threads), and the 500 says to set max_concurrency: 1."""
    shutil.copytree(FAULTY / "plugins", tmp_path / "plugins")
    shutil.copy(Path(__file__).parents[1] / "fixtures" / "plugins" / "signals.py", tmp_path / "plugins")
    shutil.copytree(FAULTY / "data", tmp_path / "data")
    text = (FAULTY / "ok.yaml").read_text()
    job = tmp_path / "job.yaml"
    job.write_text(text.replace("graders.py:exact}", "signals.py:verify}"))
    unused = "http://127.0.0.1:9/v1"
    passed = CliRunner().invoke(app, ["test", str(job), "--policy-url", unused, "--json"])
    assert passed.exit_code == 0, passed.output
    calls = json.loads(passed.stdout)["calls"]
    assert [c["metrics"] for c in calls if c["name"] == "verify"] == [{"main_thread": 1.0}] * 4, calls
    job.write_text(text.replace("graders.py:exact}", "signals.py:verify, runtime: {max_concurrency: 2}}"))
    result = CliRunner().invoke(app, ["test", str(job), "--policy-url", unused])
    assert result.exit_code == 1, result.output
    said = " ".join(result.output.split())
    assert "signal only works in main thread" in said
    assert "max_concurrency: 2, so its calls run on pool threads" in said
    assert "set max_concurrency: 1 in its Runtime" in said


def test_the_jobs_env_and_secrets_reach_the_plugins_and_this_process_keeps_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """job.yaml's env (read at import and in setup()) and secrets (from this environment) reach a
    sync and an async grader as in a job; after the test this process's environment is as it was."""
    monkeypatch.setenv("JUDGE_KEY", "k-123")
    monkeypatch.delenv("JUDGE_URL", raising=False)
    before = dict(os.environ)
    doc = local_test(options("judged", samples=2, policy_url="http://127.0.0.1:9/v1"))
    assert doc["summary"]["ok"], doc.get("error") or doc["summary"]["errors_by_cause"]
    logs = [line["message"] for t in doc["trajectories"] for line in t["logs"]]
    assert logs.count("judge http://judge.example/v1, key k-123") == 4, logs
    assert dict(os.environ) == before


def test_a_missing_secret_is_named_with_its_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JUDGE_KEY", raising=False)
    job = FAULTY / "judged.yaml"
    result = CliRunner().invoke(app, ["test", str(job), "--policy-url", "http://127.0.0.1:9/v1"])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "secret JUDGE_KEY is not set in the environment" in said and "`plugtune test`" in said
    assert f"{job}:6" in said and "secrets[0]" in said, said
