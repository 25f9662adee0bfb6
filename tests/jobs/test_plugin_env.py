"""job.yaml ``env:`` and ``secrets:`` reach every plugin instance, and nothing of the platform does."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugtune.errors import InvalidValueError
from plugtune.jobs.plugins import deploy_all
from plugtune.runtime import LocalRuntime
from plugtune.spec.validation import validate_job
from tests.jobs.jobkit import make_job
from tests.runtime.helpers import ctx, sample, trajectory

ENV_GRADER = """
import os
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    ctx.logger.info("env %s", " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())))
    return 1.0
"""
ALLOWED = {"PATH", "LANG", "LANGUAGE", "TZ", "PYTHONPATH", "PYTHONUNBUFFERED", "HOME", "TMPDIR"}


async def test_plugins_get_job_env_and_named_secrets_and_nothing_of_the_platform(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUDGE_KEY", "sk-judge")
    monkeypatch.setenv("UNLISTED_KEY", "sk-not-for-plugins")
    monkeypatch.setenv("PLUGTUNE_API_TOKEN", "console-token")
    monkeypatch.setenv("PLUGTUNE_DATABASE_URL", "postgresql://admin:pw@db/plugtune")
    extra = {"env": {"JUDGE_URL": "http://judge:8000", "MODE": "strict"}, "secrets": ["JUDGE_KEY"]}
    job = validate_job(make_job(tmp_path / "envjob", grader=ENV_GRADER, extra=extra))
    async with LocalRuntime(spare_instances=False) as rt:
        functions = await deploy_all(rt, job)
        outcome = await functions[1].invoke(ctx(), sample(), trajectory())
    (line,) = [entry.message for entry in outcome.logs if entry.message.startswith("env ")]
    env = dict(item.split("=", 1) for item in line[4:].split(" "))
    assert {k: env.get(k) for k in ("JUDGE_URL", "MODE", "JUDGE_KEY")} == {
        "JUDGE_URL": "http://judge:8000",
        "MODE": "strict",
        "JUDGE_KEY": "sk-judge",
    }
    assert set(env) - {"JUDGE_URL", "MODE", "JUDGE_KEY"} <= ALLOWED | {k for k in env if k.startswith("LC_")}
    assert "UNLISTED_KEY" not in env and not [k for k in env if k.startswith("PLUGTUNE_")]


async def test_a_secret_missing_from_the_attempts_environment_is_invalid_value_saying_to_export_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("JUDGE_KEY", raising=False)
    job_file = make_job(tmp_path / "nokey", extra={"secrets": ["JUDGE_KEY"]})
    job = validate_job(job_file)
    async with LocalRuntime(spare_instances=False) as rt:
        with pytest.raises(InvalidValueError) as info:
            await deploy_all(rt, job)
        assert rt.functions == []  # refused before anything was deployed
    (problem,) = info.value.problems
    assert problem.file == str(job_file) and problem.field == "secrets[0]"
    assert job_file.read_text().splitlines()[problem.line - 1].strip() == "- JUDGE_KEY"  # type: ignore[operator]
    assert "JUDGE_KEY is not set" in problem.message and "export JUDGE_KEY=" in problem.message


@pytest.mark.parametrize(
    ("extra", "field", "says"),
    [
        ({"env": {"PLUGTUNE_HOME": "/x"}}, "env", "PLUGTUNE_* are the platform's"),
        ({"secrets": ["PLUGTUNE_API_TOKEN"]}, "secrets[0]", "PLUGTUNE_* are the platform's"),
        ({"env": {"BAD-NAME": "1"}}, "env", "is not an environment variable name"),
        ({"env": {"PORT": 8080}}, "env.PORT", "string"),
    ],
)
def test_bad_env_and_secrets_are_invalid_value_naming_the_field(
    tmp_path: Path, extra: dict[str, object], field: str, says: str
) -> None:
    with pytest.raises(InvalidValueError) as info:
        validate_job(make_job(tmp_path / "bad", extra=extra))
    problems = [p for p in info.value.problems if p.field and p.field.startswith(field)]
    assert problems and says in problems[0].message, info.value.problems
    assert problems[0].line is not None
