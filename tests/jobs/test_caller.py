"""The failure policy applied to plugin calls, with in-process plugins (no processes)."""

from __future__ import annotations

from typing import Any

import pytest

from plugtune.errors import HINTS, Cause, PluginCallError, StatusCause
from plugtune.jobs.caller import JobStop, PolicyCaller
from plugtune.sdk import Context, Kind, PluginSpec, Runtime
from plugtune.spec.models import FailurePolicy
from plugtune.types import CallOutcome


class Scripted:
    """A plugin whose successive calls fail or answer as scripted."""

    def __init__(self, *script: Any) -> None:
        self.script = list(script)
        self.attempts: list[int] = []
        self.spec = PluginSpec(kind=Kind.GRADER, name="g", runtime=Runtime())

    async def invoke(self, ctx: Context, *args: Any) -> CallOutcome:
        self.attempts.append(ctx.attempt)
        step = self.script.pop(0)
        if isinstance(step, Cause):
            raise PluginCallError(step, f"scripted {step.value}", plugin="g.py:g")
        return CallOutcome(status=step, value=1.0 if step == "success" else None, reason="scripted")


async def test_a_failing_call_is_retried_then_succeeds() -> None:
    fn = Scripted(Cause.EOF, Cause.TIMEOUT, "success")
    caller = PolicyCaller(FailurePolicy(max_attempts=3))
    outcome = await caller(fn, Context())
    assert outcome.status == "success"
    assert fn.attempts == [1, 2, 3]
    counts = caller.take_counts(0)
    assert (counts.calls, dict(counts.errors), counts.worst_plugin) == (3, {"EOF": 1, "Timeout": 1}, "g.py:g")
    assert counts.examples["EOF"].message == "scripted EOF"
    assert caller.take_counts(0).calls == 0  # taken once


async def test_exhausted_retries_fail_the_job_with_the_last_cause() -> None:
    fn = Scripted(Cause.ERROR_500, Cause.ERROR_500)
    with pytest.raises(JobStop) as stop:
        await PolicyCaller(FailurePolicy(max_attempts=2))(fn, Context())
    assert stop.value.error.cause == "500"
    # the exception's own args are its message (pickling, logging and repr rely on them); the failing
    # call's arguments are kept apart (they replaced args, so str(stop) was the call's first argument)
    assert stop.value.args == (str(stop.value),) and "500" in str(stop.value)
    assert isinstance(stop.value.call_args, tuple)


async def test_drop_sample_hands_the_error_back_to_the_trainer() -> None:
    fn = Scripted(Cause.OOM, Cause.OOM)
    with pytest.raises(PluginCallError) as err:
        await PolicyCaller(FailurePolicy(max_attempts=2, on_exhausted="drop_sample"))(fn, Context())
    assert not isinstance(err.value, JobStop) and err.value.cause == "FaaS OOM"


async def test_create_fault_is_never_retried() -> None:
    fn = Scripted(Cause.CREATE_FAULT, "success")
    with pytest.raises(JobStop):
        await PolicyCaller(FailurePolicy(max_attempts=3))(fn, Context())
    assert fn.attempts == [1]


async def test_status_retry_is_retried_then_dropped_and_failure_fails_the_job() -> None:
    retry = Scripted("retry", "retry")
    outcome = await PolicyCaller(FailurePolicy(max_attempts=2))(retry, Context())
    assert outcome.status == "retry" and retry.attempts == [1, 2]
    failing = Scripted("failure", "failure")
    with pytest.raises(JobStop) as stop:
        await PolicyCaller(FailurePolicy(max_attempts=2))(failing, Context())
    assert "g returned Status.FAILURE (try 2 of 2); its reason: scripted" in stop.value.error.message


async def test_status_failure_is_the_plugins_own_verdict_not_an_exception() -> None:
    """A plugin returning Status.FAILURE did not raise: the error says so, with its reason."""
    caller = PolicyCaller(FailurePolicy(max_attempts=2))
    with pytest.raises(JobStop) as stop:
        await caller(Scripted("failure", "failure"), Context(step=1, trajectory_id="s1-p0-r0"))
    error = stop.value.error
    assert (error.type, error.owner, error.cause, error.plugin) == (
        "Call plugin error",
        "plugin",
        "Status failure",
        "g",
    )
    assert error.trajectory_id == "s1-p0-r0" and error.message.endswith("its reason: scripted")
    assert error.hint == HINTS[StatusCause.FAILURE] and "raised" not in error.hint.split(":")[0]
    assert dict(caller.take_counts(1).errors) == {"Status failure": 2}  # not counted as 500s


async def test_status_retry_is_counted_as_the_plugins_retry() -> None:
    caller = PolicyCaller(FailurePolicy(max_attempts=2))
    await caller(Scripted("retry", "success"), Context(step=1))
    assert dict(caller.take_counts(1).errors) == {"Status retry": 1}


async def test_discard_comes_back_at_once() -> None:
    fn = Scripted("discard")
    assert (await PolicyCaller(FailurePolicy())(fn, Context())).status == "discard"
    assert fn.attempts == [1]


async def test_counts_are_kept_by_the_step_a_call_belongs_to() -> None:
    """The next step's rollouts start while this step trains: their calls are not this step's."""
    caller = PolicyCaller(FailurePolicy(max_attempts=1, on_exhausted="drop_sample"))
    await caller(Scripted("success"), Context(step=1))
    with pytest.raises(PluginCallError):
        await caller(Scripted(Cause.TIMEOUT), Context(step=2))
    first = caller.take_counts(1)
    assert (first.calls, dict(first.errors)) == (1, {})
    second = caller.take_counts(2)
    assert (second.calls, dict(second.errors), second.worst_plugin) == (1, {"Timeout": 1}, "g.py:g")


def test_a_step_mostly_failed_trips_the_breaker_with_the_first_errors_evidence() -> None:
    from plugtune.jobs.caller import FAILED_CALLS, StepCounts
    from plugtune.spec.models import CircuitBreaker

    counts = StepCounts()
    counts.calls = 10
    counts.errors.update({"FaaS OOM": 7, "Timeout": 1})
    counts.by_plugin.update({"grade.py:score": 8})
    first = PluginCallError(
        Cause.OOM,
        "killed at its 256 MiB limit",
        plugin="grade.py:score",
        call_id="c1",
        trajectory_id="t1",
        peak_memory_mb=255.5,
        code_hash="abc",
    )
    counts.examples["FaaS OOM"] = first
    error = counts.breaker_error(CircuitBreaker(max_error_share=0.5, min_calls=8))
    assert error is not None and error.cause == Cause.OOM.value
    assert "First one: killed at its 256 MiB limit" in error.message
    assert (error.plugin, error.call_id, error.trajectory_id, error.peak_memory_mb, error.code_hash) == (
        "grade.py:score",
        "c1",
        "t1",
        255.5,
        "abc",
    )
    assert counts.breaker_error(CircuitBreaker(max_error_share=0.9, min_calls=8)) is None
    points = {p.name: p.value for p in counts.metric_points(3, prefix="eval/")}
    assert points == {
        f"eval/{FAILED_CALLS}": 8.0,
        "eval/plugin/calls": 10.0,
        f"eval/{FAILED_CALLS}/FaaS OOM": 7.0,
        f"eval/{FAILED_CALLS}/Timeout": 1.0,
    }
