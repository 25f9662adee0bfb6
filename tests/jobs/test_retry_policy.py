from __future__ import annotations

import pytest

from plugtune.errors import (
    Cause,
    DependencyCallError,
    DependencyCause,
    ErrorType,
    InvalidDataError,
    LossNanError,
    PlatformError,
    PluginCallError,
    Problem,
)
from plugtune.jobs.retry_policy import (
    JOB_KINDS,
    DropGroup,
    DropSample,
    FailJob,
    FailureKind,
    RetryCall,
    RetryJobAfter,
    Stop,
    breaker,
    decide,
    job_kind,
    kind_of,
)
from plugtune.spec.models import CircuitBreaker, FailurePolicy, RetryPolicy
from plugtune.types import ErrorRecord

FAIL = FailurePolicy(max_attempts=3, on_exhausted="fail_job")
DROP = FailurePolicy(max_attempts=3, on_exhausted="drop_sample")
RETRY = RetryPolicy(platform_delay_s=900, max_auto_retries=3)

TABLE = [
    # kind, attempt, failure policy, expected decision type, fresh instance (for RetryCall)
    ("plugin_error", 1, FAIL, RetryCall, True),
    ("plugin_error", 2, FAIL, RetryCall, True),
    ("plugin_error", 3, FAIL, FailJob, None),
    ("plugin_error", 3, DROP, DropSample, None),
    ("status_failure", 1, FAIL, RetryCall, True),
    ("status_failure", 3, FAIL, FailJob, None),
    ("status_failure", 3, DROP, DropSample, None),
    ("status_retry", 1, FAIL, RetryCall, False),
    ("status_retry", 2, FAIL, RetryCall, False),
    ("status_retry", 3, FAIL, DropSample, None),
    ("status_retry", 3, DROP, DropSample, None),
    ("status_discard", 1, FAIL, DropGroup, None),
    ("status_discard", 1, DROP, DropGroup, None),
    ("create_fault", 1, FAIL, FailJob, None),
    ("create_fault", 1, DROP, FailJob, None),
    ("data", 1, FAIL, FailJob, None),
    ("data", 1, DROP, FailJob, None),
    ("loss_nan", 1, FAIL, FailJob, None),
    ("platform", 1, FAIL, RetryJobAfter, None),
    ("platform", 3, FAIL, RetryJobAfter, None),
    ("platform", 4, FAIL, Stop, None),
    ("unknown", 1, FAIL, RetryJobAfter, None),
    ("unknown", 4, FAIL, Stop, None),
]


@pytest.mark.parametrize(("kind", "attempt", "policy", "expected", "fresh"), TABLE)
def test_decision_table(kind: str, attempt: int, policy: FailurePolicy, expected: type, fresh: bool) -> None:
    decision = decide(kind, attempt, policy, RETRY)
    assert type(decision) is expected
    if isinstance(decision, RetryCall):
        assert decision.fresh_instance is fresh
        assert decision.attempt == attempt + 1


def test_every_kind_has_a_rule() -> None:
    for kind in FailureKind:
        assert decide(kind, 1) is not None


def test_platform_retries_wait_the_configured_delay_and_then_stop_with_a_bundle() -> None:
    policy = RetryPolicy(platform_delay_s=0.5, max_auto_retries=2)
    decisions = [decide("platform", n, retry=policy) for n in (1, 2, 3)]
    assert decisions[:2] == [RetryJobAfter(0.5, 1), RetryJobAfter(0.5, 2)]
    assert isinstance(decisions[2], Stop) and decisions[2].support_bundle
    assert isinstance(decide("platform", 1, retry=RetryPolicy(max_auto_retries=0)), Stop)


def test_max_attempts_one_means_no_retry() -> None:
    assert isinstance(decide("plugin_error", 1, FailurePolicy(max_attempts=1)), FailJob)
    assert isinstance(decide("status_retry", 1, FailurePolicy(max_attempts=1)), DropSample)


def test_bad_inputs_are_rejected() -> None:
    with pytest.raises(ValueError):
        decide("plugin_error", 0)
    with pytest.raises(ValueError):
        decide("typo", 1)


def test_kind_of_classified_errors() -> None:
    assert kind_of(PluginCallError(Cause.TIMEOUT, "slow")) is FailureKind.PLUGIN_ERROR
    assert kind_of(PluginCallError(Cause.INVALID_REWARD, "nan")) is FailureKind.PLUGIN_ERROR
    assert kind_of(PluginCallError(Cause.CREATE_FAULT, "import")) is FailureKind.CREATE_FAULT
    assert kind_of(InvalidDataError([Problem("f", "missing")])) is FailureKind.DATA
    assert kind_of(LossNanError("nan", step=1, stats={}, trajectory_ids=[])) is FailureKind.LOSS_NAN
    assert kind_of(PlatformError("boom")) is FailureKind.PLATFORM
    assert kind_of(RuntimeError("boom")) is FailureKind.PLATFORM


def test_a_jobs_error_record_has_the_kind_of_its_type() -> None:
    assert set(JOB_KINDS) == set(ErrorType)  # every type the taxonomy has is handled
    for exc in (
        PluginCallError(Cause.TIMEOUT, "slow"),
        InvalidDataError([Problem("f", "missing")]),
        LossNanError("nan", step=1, stats={}, trajectory_ids=[]),
        PlatformError("boom"),
    ):
        assert job_kind(exc.record()) is kind_of(exc)
    dependency = DependencyCallError(DependencyCause.TIMEOUT, "slow judge").record()
    assert job_kind(dependency) is FailureKind.DEPENDENCY
    assert job_kind(ErrorRecord("Invalid value", "data", "", "")) is FailureKind.DATA
    assert job_kind(ErrorRecord("unknown error", "platform", "", "")) is FailureKind.UNKNOWN
    assert job_kind(ErrorRecord("a type no version wrote", "?", "", "")) is FailureKind.UNKNOWN


BREAKER = CircuitBreaker(max_error_share=0.5, min_calls=8)


@pytest.mark.parametrize(
    ("calls", "errors", "trip", "dominant"),
    [
        (32, {}, False, None),
        (32, {"Timeout": 16}, False, "Timeout"),  # exactly the share: not exceeded
        (32, {"Timeout": 17}, True, "Timeout"),
        (32, {"Timeout": 6, "500": 12}, True, "500"),
        (32, {"EOF": 9, "500": 9}, True, "EOF"),  # ties: the taxonomy's order decides
        (4, {"500": 4}, False, "500"),  # too few calls to judge
        (0, {}, False, None),
    ],
)
def test_circuit_breaker(calls: int, errors: dict, trip: bool, dominant: str | None) -> None:
    decision = breaker(calls, errors, BREAKER)
    assert decision.trip is trip
    assert decision.dominant_cause == dominant
    assert (dominant in decision.message) if trip else decision.message == ""


def test_circuit_breaker_rejects_inconsistent_counts() -> None:
    with pytest.raises(ValueError):
        breaker(2, {"500": 3})
