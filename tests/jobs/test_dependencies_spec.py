"""job.yaml's ``dependencies:``: checked at validation with the line and field, carried to the runtime;
a job that failed on a dependency is retried automatically, like a platform failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugtune.errors import InvalidValueError
from plugtune.jobs.retry_policy import FailJob, FailureKind, RetryJobAfter, decide
from plugtune.runtime.dependencies import Dependency
from plugtune.spec.models import RetryPolicy, spec_reference
from plugtune.spec.validation import validate_job
from tests.jobs.jobkit import make_job


def test_declared_dependencies_reach_the_runtime_as_written(tmp_path: Path) -> None:
    deps = {
        "judge": "http://127.0.0.1:8000/v1",
        "api": {"url": "api.example.com:443", "rpm": 600, "concurrency": 8, "timeout_s": 20},
    }
    job = validate_job(make_job(tmp_path / "deps", extra={"dependencies": deps}))
    assert job.spec.declared() == (
        Dependency("judge", "http://127.0.0.1:8000/v1", "127.0.0.1", 8000),
        Dependency("api", "api.example.com:443", "api.example.com", 443, 600, 8, 20.0),
    )


@pytest.mark.parametrize(
    ("deps", "field", "said"),
    [
        ({"judge": "ftp://judge:21"}, "dependencies.judge.url", "has scheme 'ftp'; use one of http, https"),
        ({"judge": "judge"}, "dependencies.judge.url", "is neither a URL nor host:port"),
        ({"judge": {"url": "judge:80", "rpm": 0}}, "dependencies.judge.rpm", "must be >= 1, got 0"),
        (
            {"judge": {"url": "judge:80", "concurrency": 1.5}},
            "dependencies.judge.concurrency",
            "must be a whole number, got 1.5",
        ),
        (
            {"judge": {"url": "judge:80", "qps": 3}},
            "dependencies.judge.qps",
            "allowed here: url, rpm, concurrency, timeout_s",
        ),
        ({"judge": {"rpm": 3}}, "dependencies.judge.url", "required key is missing"),
        ({"9judge": "judge:80"}, "dependencies.9judge", "must start with a letter"),
    ],
)
def test_a_bad_dependency_is_invalid_value_at_its_line(
    tmp_path: Path, deps: dict[str, object], field: str, said: str
) -> None:
    job_file = make_job(tmp_path / "bad", extra={"dependencies": deps})
    with pytest.raises(InvalidValueError) as info:
        validate_job(job_file)
    problems = [p for p in info.value.problems if p.field and p.field.startswith(field)]
    assert problems, str(info.value)
    line = next(
        i + 1 for i, text in enumerate(job_file.read_text().splitlines()) if text.startswith("dependencies:")
    )
    assert problems[0].line is not None and problems[0].line > line, str(info.value)
    assert said in problems[0].message, str(info.value)


def test_a_dependency_error_is_retried_as_a_job_after_a_delay_then_fails() -> None:
    retry = RetryPolicy(platform_delay_s=2.0, max_auto_retries=1)
    assert decide(FailureKind.DEPENDENCY, 1, retry=retry) == RetryJobAfter(delay_s=2.0, retry_number=1)
    assert decide(FailureKind.DEPENDENCY, 2, retry=retry) == FailJob(
        "dependency: 1 automatic retries used up"
    )


def test_the_job_yaml_reference_documents_each_dependencys_keys() -> None:
    rows = {row.path: row for row in spec_reference()}
    assert rows["dependencies"].type == "mapping of name -> DependencySpec"
    assert {"dependencies.<name>.url", "dependencies.<name>.rpm", "dependencies.<name>.timeout_s"} <= set(
        rows
    )
    assert "Dependency error, cause timeout" in rows["dependencies.<name>.timeout_s"].description
    assert "all instances and plugins of the job" in rows["dependencies.<name>.rpm"].description
    assert "a 429 halves it" in rows["dependencies.<name>.concurrency"].description
