"""``plugtune doctor`` on a job that failed on a dependency (a service its plugins call) names the
service, where it is, the cause and HTTP status, and what to do: not the plugin's code."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.errors import DependencyCallError, DependencyCause
from plugtune.runtime.worker.dependency import Finding
from plugtune.store import Store
from plugtune.types import ErrorRecord

runner = CliRunner()


def _failed_on(store: Store, spec: dict, finding: Finding, cause: DependencyCause) -> int:  # type: ignore[type-arg]
    """A job whose attempt failed as the worker classifies a failed call: the error it stores."""
    job = store.create_job("judged", spec)
    store.transition(job, "running")
    attempt = store.start_attempt(job, pid=1)
    error = DependencyCallError(
        cause, finding.message(), dependency=finding.dependency, plugin="judge_grader", call_id="c1"
    ).record()
    store.end_attempt(job, attempt, "failed", error)
    store.set_job_error(job, error, attempt=attempt)
    store.transition(job, "failed", "dependency error")
    return job


def test_doctor_names_the_rate_limited_dependency_its_budget_and_the_failure_policy(store: Store) -> None:
    spec = {
        "model": "tiny",
        "dependencies": {"judge": {"url": "http://127.0.0.1:8123/v1", "rpm": 60}},
        "failure_policy": {"dependency": {"max_wait_s": 30}},
    }
    finding = Finding(
        "rate limited",
        host="127.0.0.1",
        port=8123,
        status=429,
        retry_after="1",
        where="grader.py:12",
        error="RateLimitError: Error code: 429",
        dependency="judge",
    )
    job = _failed_on(store, spec, finding, DependencyCause.RATE_LIMITED)
    text = runner.invoke(app, ["doctor", str(job)])
    assert text.exit_code == 0, text.output
    assert "dependency judge at 127.0.0.1:8123: rate limited, HTTP 429\n" in text.output
    assert "the plugin's code is not at fault" in text.output
    assert "check dependency judge at 127.0.0.1:8123" in text.output
    assert "`rpm`/`concurrency` under job.yaml `dependencies: judge:`" in text.output
    assert "(now: rpm 60)" in text.output
    assert "failure_policy.dependency" in text.output and "max_wait_s 30" in text.output
    doc = json.loads(runner.invoke(app, ["doctor", str(job), "--json"]).stdout)
    dep = doc["dependency"]
    assert {k: dep[k] for k in ("name", "address", "declared", "cause", "status")} == {
        "name": "judge",
        "address": "127.0.0.1:8123",
        "declared": True,
        "cause": "rate limited",
        "status": 429,
    }
    assert dep["policy"]["max_wait_s"] == 30 and dep["policy"]["max_attempts"] == 5


def test_doctor_names_an_undeclared_unreachable_service_and_says_to_declare_it(store: Store) -> None:
    finding = Finding(
        "unreachable",
        host="judge.internal",
        port=9000,
        where="grader.py:7",
        error="ConnectError: [Errno 111] Connection refused",
    )
    job = _failed_on(store, {"model": "tiny"}, finding, DependencyCause.UNREACHABLE)
    out = runner.invoke(app, ["doctor", str(job)]).output
    assert "dependency (not declared in job.yaml) at judge.internal:9000: unreachable\n" in out
    assert "declare it in job.yaml `dependencies:`" in out
    assert "rate limit" not in out
    doc = json.loads(runner.invoke(app, ["doctor", str(job), "--json"]).stdout)
    assert doc["dependency"]["status"] is None and doc["dependency"]["declared"] is False


def test_doctor_says_nothing_of_dependencies_for_a_plugin_error(store: Store) -> None:
    job = store.create_job("plain", {"model": "tiny"})
    store.transition(job, "running")
    error = {
        "type": "Call plugin error",
        "owner": "plugin",
        "cause": "500",
        "message": "KeyError: 'x'",
        "hint": "h",
    }
    store.set_job_error(job, ErrorRecord.from_dict(error))
    store.transition(job, "failed", "plugin error")
    out = runner.invoke(app, ["doctor", str(job)]).output
    assert "dependency" not in out
    assert json.loads(runner.invoke(app, ["doctor", str(job), "--json"]).stdout)["dependency"] is None
