"""``plugtune test --faas`` reports the calls that failed on a declared dependency (a judge answering
500 or 429) apart from the plugins' own errors: counts by dependency and cause, in text and --json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plugtune.cli import app
from tests.jobs.jobkit import make_job
from tests.judge_server import JUDGED_GRADER, judge

runner = CliRunner()


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "cause"), [("500", "server error"), ("429", "rate limited")])
def test_faas_counts_a_judges_failures_by_dependency_and_cause_apart_from_plugin_errors(
    tmp_path: Path, mode: str, cause: str
) -> None:
    with judge() as server:
        port = server.server_address[1]
        job_file = make_job(
            tmp_path / "judged",
            grader=JUDGED_GRADER.format(url=f"http://127.0.0.1:{port}/{mode}"),
            extra={"dependencies": {"judge": {"url": f"http://127.0.0.1:{port}", "rpm": 600}}},
        )
        args = ["test", "--faas", str(job_file), "--samples", "2", "--concurrency", "2"]
        as_json = runner.invoke(app, [*args, "--json"])
        text = runner.invoke(app, args)
        requests = server.requests  # type: ignore[attr-defined]
    assert as_json.exit_code == 1, as_json.output
    summary = json.loads(as_json.stdout)["summary"]
    deps = summary["dependency_errors"]
    graded = [c for c in json.loads(as_json.stdout)["calls"] if c["kind"] == "grader"]
    assert len(graded) == 2 and requests >= 4  # two graded rollouts, each run twice (json and text)
    assert deps["calls"] == 2 and deps["plugin_errors"] == 0
    assert list(deps["by_dependency"]) == ["judge"] and list(deps["by_dependency"]["judge"]) == [cause]
    first = deps["by_dependency"]["judge"][cause]
    assert first["count"] == 2 and f"HTTP {mode}" in first["message"] and first["plugin"].endswith(":exact")
    assert {c["error"]["dependency"] for c in graded} == {"judge"}
    assert text.exit_code == 1, text.output
    out = text.output
    assert "dependency errors: 2 call(s) failed on services the plugins call, not on their code" in out
    assert "(plugin errors: 0)" in out and f"  judge: {cause} 2\n" in out
    assert "FAILED (on dependencies: the services the plugins call, not the plugins' code)" in out


@pytest.mark.slow
def test_faas_weighs_a_dependencys_rpm_against_the_trainers_pace(tmp_path: Path) -> None:
    """A judge asked once per rollout: rpm 60 cannot keep a trainer that wants several rollouts a
    second (the line says the budget sets the pace), a generous rpm can (within budget)."""
    with judge() as server:
        port = server.server_address[1]
        outputs = {}
        for rpm in (60, 1_000_000):
            job_file = make_job(
                tmp_path / f"rpm{rpm}",
                grader=JUDGED_GRADER.format(url=f"http://127.0.0.1:{port}/ok"),
                extra={"dependencies": {"judge": {"url": f"http://127.0.0.1:{port}", "rpm": rpm}}},
            )
            args = ["test", "--faas", str(job_file), "--samples", "4", "--concurrency", "4"]
            as_json = runner.invoke(app, [*args, "--json"])
            assert as_json.exit_code == 0, as_json.output
            outputs[rpm] = (json.loads(as_json.stdout)["summary"]["demand"], runner.invoke(app, args).output)
    (tight, tight_text), (ample, ample_text) = outputs[60], outputs[1_000_000]
    [dep] = tight["dependencies"]
    assert dep["name"] == "judge" and dep["requests_per_rollout"] == 1.0 and dep["rpm"] == 60
    assert dep["needed_rpm"] == pytest.approx(tight["needed_qps"] * 60, rel=0.01) and dep["needed_rpm"] > 60
    assert dep["rpm_sets_pace"] and dep["allowed_qps"] == 1.0
    assert "dependency judge: 1.00 requests per rollout; the trainer's pace" in tight_text
    assert "rpm 60 allows 1.00 rollouts/s — the budget, not the runtime, sets the pace" in tight_text
    assert not ample["dependencies"][0]["rpm_sets_pace"]
    assert "rpm 1000000 — within budget" in ample_text


@pytest.mark.slow
def test_faas_injects_dependency_faults_that_the_report_counts_as_the_services(tmp_path: Path) -> None:
    with judge() as server:
        port = server.server_address[1]
        job_file = make_job(
            tmp_path / "injected",
            grader=JUDGED_GRADER.format(url=f"http://127.0.0.1:{port}/ok"),
            extra={"dependencies": {"judge": f"http://127.0.0.1:{port}"}},
        )
        args = ["test", str(job_file), "--samples", "2", "--inject", "dependency-5xx", "--inject-rate", "1"]
        as_json = runner.invoke(app, [*args, "--faas", "--json"])
        local = runner.invoke(app, args)
        requests = server.requests  # type: ignore[attr-defined]
    assert as_json.exit_code == 1, as_json.output
    deps = json.loads(as_json.stdout)["summary"]["dependency_errors"]
    assert deps["calls"] == 2 and list(deps["by_dependency"]["judge"]) == ["server error"]
    assert "HTTP 503" in deps["by_dependency"]["judge"]["server error"]["message"]
    assert requests == 0  # every connection met the fault in the relay
    assert (
        local.exit_code == 2
        and "dependency faults are met in the function runtime's relay; add --faas" in (local.output)
    )
