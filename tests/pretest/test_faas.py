"""``plugtune test --faas``: the function runtime with real limits, by cause, with injected faults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.init_project import create_project
from plugtune.pretest.command import faas_test
from tests.pretest.helpers import FAULTY, causes, injected, options


@pytest.mark.slow
def test_init_project_passes_in_the_runtime(tmp_path: Path) -> None:
    create_project(tmp_path / "p")
    doc = faas_test(options(tmp_path / "p" / "job.yaml", samples=4, concurrency=4))
    summary = doc["summary"]
    assert summary["ok"], summary["errors_by_cause"]
    assert summary["calls"] == 8 and summary["limits"]
    rollout, grader = summary["plugins"]
    assert rollout["plugin"].endswith("rollout.py:solve") and rollout["calls"] == 4
    assert rollout["runtime"]["timeout_s"] == 60 and rollout["runtime"]["max_concurrency"] == 8
    assert rollout["latency"]["p50_ms"] > 0 and rollout["latency"]["p99_ms"] >= rollout["latency"]["p95_ms"]
    assert rollout["instances_used"] >= 1 and rollout["memory"]["limit_mb"] == 1024
    assert grader["statuses"] == {"success": 4}
    demand = summary["demand"]
    assert demand["rollouts_per_step"] == 16 and demand["capacity"] == 8 * 4
    assert demand["driven_concurrency"] == 4 and "note" in demand


def test_the_jobs_env_and_secrets_reach_the_plugins_in_the_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a job: job.yaml's env and secrets reach the instances (set after the sandbox's uid drop)."""
    monkeypatch.setenv("JUDGE_KEY", "k-123")
    monkeypatch.delenv("JUDGE_URL", raising=False)
    doc = faas_test(options("judged", samples=2, concurrency=2, policy_url="http://127.0.0.1:9/v1"))
    assert doc["summary"]["ok"], doc.get("error") or doc["summary"]["errors_by_cause"]
    graded = [c["metrics"] for c in doc["calls"] if c["kind"] == "grader"]
    assert graded == [{"key_length": 5.0}] * 4, doc["calls"]  # len("k-123"); JUDGE_URL at import


CASES = [
    ("raising_grader", "raises", "500", "ValueError: grader bug"),
    ("nan_grader", "nan", "Invalid reward", "NaN"),
    ("sleeping_rollout", "sleeps", "Timeout", "timeout"),
    ("exiting_rollout", "exits", "EOF", "status 3"),
]


@pytest.mark.parametrize(("job", "plugin", "cause", "evidence"), CASES, ids=[c[0] for c in CASES])
def test_faulty_plugin_fails_with_its_cause(job: str, plugin: str, cause: str, evidence: str) -> None:
    doc = faas_test(options(job, samples=2, concurrency=2))
    summary = doc["summary"]
    assert not summary["ok"]
    assert {c["name"] for c in doc["calls"] if c["error"]} == {plugin}
    assert set(summary["errors_by_cause"]) == {cause}
    first = summary["errors_by_cause"][cause]
    assert first["count"] == 2 and evidence in first["message"], first
    assert first["hint"] and first["type"] == "Call plugin error"


@pytest.mark.slow
def test_memory_bomb_is_oom_with_peak_memory() -> None:
    doc = faas_test(options("memory_bomb", samples=1, concurrency=1))
    summary = doc["summary"]
    assert causes(doc) == ["FaaS OOM"]
    rollout = summary["plugins"][0]
    assert rollout["runtime"]["memory_mb"] == 128  # job.yaml's override
    assert rollout["memory"]["limit_mb"] == 128 and rollout["memory"]["peak_mb"] >= 100


def test_blocking_async_rollout_is_warned() -> None:
    doc = faas_test(options("blocking_rollout", samples=2, concurrency=2))
    rollout = doc["summary"]["plugins"][0]
    assert doc["summary"]["ok"]
    assert rollout["event_loop_blocking"]["count"] >= 1
    assert "rollouts.py" in rollout["event_loop_blocking"]["first"]


def test_injected_500_on_every_call() -> None:
    doc = faas_test(options("ok", samples=3, concurrency=3, injection=injected("500")))
    assert causes(doc) == ["500", "500", "500"]
    assert all("injected fault" in c["error"]["message"] for c in doc["calls"])
    assert doc["summary"]["injection"] == {"faults": ["500"], "rate": 1.0, "seed": 0}


@pytest.mark.slow
def test_injected_faults_each_get_their_cause() -> None:
    """Seed 1 draws every fault among 10 rollouts (nan passes a rollout) and nan for the one grader call;
    one call at a time, since a crash or a recycled instance also fails the calls it was running."""
    inject = injected("timeout,eof,oom,500,nan", seed=1)
    doc = faas_test(options("injectable", samples=10, concurrency=1, injection=inject))
    found = set(doc["summary"]["errors_by_cause"])
    assert found == {"Timeout", "EOF", "FaaS OOM", "500", "Invalid reward"}, found
    graded = [c for c in doc["calls"] if c["name"] == "exact"]
    assert [c["error"]["cause"] for c in graded] == ["Invalid reward"]


def test_cli_json_is_one_document_and_demand_suggests_scaling(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    text = (
        (FAULTY / "ok.yaml")
        .read_text()
        .replace("batch_size: 2, group_size: 2", "batch_size: 8, group_size: 8")
    )
    job.write_text(
        text.replace("data/train.jsonl", str(FAULTY / "data" / "train.jsonl")).replace(
            "plugins/", str(FAULTY / "plugins") + "/"
        )
    )
    result = CliRunner().invoke(app, ["test", "--faas", str(job), "--samples", "2", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert set(doc) >= {"calls", "summary"} and len(doc["calls"]) == 4
    demand = doc["summary"]["demand"]
    assert demand["rollouts_per_step"] == 64 and demand["capacity"] == 32 and not demand["keeps_up"]
    assert "max_instances: 8" in demand["suggestion"]


def test_bad_inject_list_is_exit_2() -> None:
    result = CliRunner().invoke(app, ["test", "--faas", str(FAULTY / "ok.yaml"), "--inject", "segv"])
    assert result.exit_code == 2 and "timeout, eof, oom, 500, nan" in result.output


def test_plugin_that_cannot_load_is_create_faas_fault() -> None:
    doc = faas_test(options("broken", samples=2))
    assert not doc["summary"]["ok"] and doc["calls"] == []
    assert (
        doc["error"]["cause"] == "Create faas fault" and "plugtune_no_such_module" in doc["error"]["message"]
    )


def test_group_grader_gets_the_jobs_group_size_in_the_runtime() -> None:
    doc = faas_test(options("group_grader", samples=2, concurrency=6, policy_url="http://127.0.0.1:9/v1"))
    summary = doc["summary"]
    assert summary["ok"], summary["errors_by_cause"]
    names = [c["name"] for c in doc["calls"]]
    assert names.count("answers") == 6 and names.count("ranks") == 2
    assert sorted(c["value"] for c in doc["calls"] if c["name"] == "ranks") == [[0.0, 0.5, 1.0]] * 2
    assert summary["demand"]["driven_concurrency"] == 6
