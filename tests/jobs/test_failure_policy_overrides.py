"""``failure_policy.by_cause``, ``failure_policy.plugins`` and ``backoff_s`` (issue 26 item 5): a
cause's and a plugin's own attempts, backoff and on_exhausted, each unset field falling back to the
level above; unknown causes and plugin names are refused at their line."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from plugtune.errors import Cause, DataError, PluginCallError
from plugtune.jobs.caller import JobStop, PolicyCaller
from plugtune.sdk import Context, Kind, PluginSpec, Runtime
from plugtune.spec.models import FailurePolicy
from plugtune.spec.validation import validate_job
from plugtune.types import CallOutcome
from tests.jobs.jobkit import make_job


class Scripted:
    def __init__(self, name: str, *script: Any) -> None:
        self.script = list(script)
        self.attempts: list[float] = []
        self.spec = PluginSpec(kind=Kind.GRADER, name=name, runtime=Runtime())

    async def invoke(self, ctx: Context, *args: Any) -> CallOutcome:
        self.attempts.append(time.monotonic())
        step = self.script.pop(0)
        if isinstance(step, Cause):
            raise PluginCallError(step, f"scripted {step.value}", plugin=self.spec.name)
        return CallOutcome(status=step, value=1.0 if step == "success" else None, reason="scripted")


POLICY = FailurePolicy.model_validate(
    {
        "max_attempts": 3,
        "by_cause": {"Timeout": {"max_attempts": 1, "on_exhausted": "drop_sample"}},
        "plugins": {
            "judge": {"max_attempts": 5, "by_cause": {"EOF": {"on_exhausted": "drop_sample"}}},
        },
    }
)


def test_each_field_comes_from_the_first_level_that_sets_it() -> None:
    assert POLICY.for_call("other", "500").max_attempts == 3  # the job's
    timeout = POLICY.for_call("other", "Timeout")
    assert (timeout.max_attempts, timeout.on_exhausted) == (1, "drop_sample")  # the job's by_cause
    judged = POLICY.for_call("judge", "Timeout")
    assert (judged.max_attempts, judged.on_exhausted) == (5, "drop_sample")  # plugin over the job's cause
    eof = POLICY.for_call("judge", "EOF")
    assert (eof.max_attempts, eof.on_exhausted) == (5, "drop_sample")  # plugin's cause, then plugin
    assert POLICY.for_call("judge", "500").on_exhausted == "fail_job"


async def test_a_cause_drops_at_once_where_the_job_would_retry_then_fail() -> None:
    timing_out = Scripted("other", Cause.TIMEOUT, "success")
    with pytest.raises(PluginCallError) as dropped:
        await PolicyCaller(POLICY)(timing_out, Context())
    assert not isinstance(dropped.value, JobStop) and len(timing_out.attempts) == 1
    erroring = Scripted("other", Cause.ERROR_500, Cause.ERROR_500, Cause.ERROR_500)
    with pytest.raises(JobStop):
        await PolicyCaller(POLICY)(erroring, Context())
    assert len(erroring.attempts) == 3


async def test_a_plugin_gets_its_own_attempts() -> None:
    judge = Scripted("judge", *[Cause.ERROR_500] * 4, "success")
    outcome = await PolicyCaller(POLICY)(judge, Context())
    assert outcome.status == "success" and len(judge.attempts) == 5


async def test_backoff_doubles_between_tries_with_jitter_in_its_upper_half() -> None:
    policy = FailurePolicy(max_attempts=3, backoff_s=0.2)
    fn = Scripted("g", Cause.EOF, Cause.EOF, "success")
    caller = PolicyCaller(policy, rng=random.Random(1))
    assert (await caller(fn, Context())).status == "success"
    first, second = (b - a for a, b in zip(fn.attempts, fn.attempts[1:], strict=False))
    assert 0.1 <= first < 0.3 and 0.2 <= second < 0.5, (first, second)
    assert caller.backoff_waited_s == pytest.approx(first + second, abs=0.05)
    assert FailurePolicy(backoff_s=10).backoff(10, 0.999) <= 60  # capped
    assert FailurePolicy().backoff(3, 0.5) == 0.0  # the default retries at once


def test_unknown_causes_and_plugin_names_are_refused_at_their_line(tmp_path: Path) -> None:
    job_file = make_job(tmp_path / "p")
    spec = yaml.safe_load(job_file.read_text())
    spec["failure_policy"] = {
        "by_cause": {"Timeout": {"max_attempts": 2}},
        "plugins": {"exakt": {"max_attempts": 2}},
    }
    job_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    with pytest.raises(DataError) as info:
        validate_job(job_file)
    [problem] = info.value.problems
    assert problem.field == "failure_policy.plugins.exakt" and problem.line is not None
    assert "no plugin of this job is named 'exakt'; name one of answer, exact" in problem.message
    lines = job_file.read_text().splitlines()
    assert "exakt" in lines[problem.line - 1]
    spec["failure_policy"] = {"by_cause": {"Create faas fault": {"max_attempts": 2}}}
    job_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    with pytest.raises(DataError) as info:
        validate_job(job_file)
    assert any("failure_policy.by_cause" in (p.field or "") for p in info.value.problems), info.value
