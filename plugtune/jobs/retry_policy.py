"""What to do after a failure: one pure, table-driven function (DESIGN §2), and the circuit breaker.

``decide(kind, attempt, failure, retry)`` reads one row of :data:`RULES`:

=================  =========================  ===================================================
kind               retried                    when retries are used up / not retryable
=================  =========================  ===================================================
plugin_error       call, fresh instance       ``failure_policy.on_exhausted``: fail / drop sample
status_failure     call, fresh instance       ``failure_policy.on_exhausted``: fail / drop sample
status_retry       call, same instance        drop the sample
status_discard     never                      drop the prompt's group
create_fault       never (same code fails)    fail the job
platform, unknown  whole job after a delay    stop and write a support bundle
dependency         whole job after a delay    fail the job (the service is at fault, not plugtune)
data, loss_nan     never                      fail the job
=================  =========================  ===================================================

``attempt`` is the 1-based number of the try that just failed: of the call for plugin kinds,
of the job for platform and dependency kinds. A call that failed on a dependency is not decided
here: the job's caller (``plugtune.jobs.caller``) retries it on the same instance with backoff under
``failure_policy.dependency``, and the breaker does not count it; once those retries are used up the
job fails with the ``Dependency error`` and is retried after a delay like a platform failure.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from plugtune.errors import Cause, DataError, ErrorType, LossNanError, PluginCallError
from plugtune.spec.models import CircuitBreaker, FailurePolicy, RetryPolicy
from plugtune.types import ErrorRecord


class FailureKind(str, enum.Enum):
    PLUGIN_ERROR = "plugin_error"  # an exception / Timeout / EOF / OOM / Invalid reward
    STATUS_FAILURE = "status_failure"
    STATUS_RETRY = "status_retry"
    STATUS_DISCARD = "status_discard"
    CREATE_FAULT = "create_fault"
    PLATFORM = "platform"
    UNKNOWN = "unknown"
    DATA = "data"
    LOSS_NAN = "loss_nan"
    DEPENDENCY = "dependency"  # the job failed on a service its plugins call (Dependency error)


class Retries(str, enum.Enum):
    CALL_FRESH = "call on a fresh instance"
    CALL = "call"
    JOB = "job after a delay"
    NEVER = "never"


class Then(str, enum.Enum):
    POLICY = "failure_policy.on_exhausted"
    DROP_SAMPLE = "drop the sample"
    DROP_GROUP = "drop the group"
    FAIL = "fail the job"
    STOP = "stop with a support bundle"


@dataclass(frozen=True)
class RetryCall:
    """Call the plugin again (on a fresh instance when ``fresh_instance``)."""

    attempt: int
    fresh_instance: bool


@dataclass(frozen=True)
class FailJob:
    """Fail the job now with the error that triggered the decision."""

    reason: str


@dataclass(frozen=True)
class DropSample:
    """Leave this sample out of the batch and count it."""

    reason: str


@dataclass(frozen=True)
class DropGroup:
    """Leave the prompt's whole group out of the batch."""

    reason: str


@dataclass(frozen=True)
class RetryJobAfter:
    """Retry the whole job from its last checkpoint after ``delay_s`` seconds."""

    delay_s: float
    retry_number: int


@dataclass(frozen=True)
class Stop:
    """Stop retrying; the job stays failed and a support bundle is written."""

    reason: str
    support_bundle: bool = True


Decision = RetryCall | FailJob | DropSample | DropGroup | RetryJobAfter | Stop

RULES: dict[FailureKind, tuple[Retries, Then]] = {
    FailureKind.PLUGIN_ERROR: (Retries.CALL_FRESH, Then.POLICY),
    FailureKind.STATUS_FAILURE: (Retries.CALL_FRESH, Then.POLICY),
    FailureKind.STATUS_RETRY: (Retries.CALL, Then.DROP_SAMPLE),
    FailureKind.STATUS_DISCARD: (Retries.NEVER, Then.DROP_GROUP),
    FailureKind.CREATE_FAULT: (Retries.NEVER, Then.FAIL),
    FailureKind.PLATFORM: (Retries.JOB, Then.STOP),
    FailureKind.UNKNOWN: (Retries.JOB, Then.STOP),
    FailureKind.DATA: (Retries.NEVER, Then.FAIL),
    FailureKind.LOSS_NAN: (Retries.NEVER, Then.FAIL),
    FailureKind.DEPENDENCY: (Retries.JOB, Then.FAIL),
}


def decide(
    kind: FailureKind | str,
    attempt: int,
    failure: FailurePolicy | None = None,
    retry: RetryPolicy | None = None,
) -> Decision:
    """The next step after try number ``attempt`` failed with ``kind``."""
    kind = FailureKind(kind)
    if attempt < 1:
        raise ValueError(f"attempt numbers start at 1, got {attempt}")
    failure = failure or FailurePolicy()
    retry = retry or RetryPolicy()
    retries, then = RULES[kind]
    if retries in (Retries.CALL, Retries.CALL_FRESH) and attempt < failure.max_attempts:
        return RetryCall(attempt=attempt + 1, fresh_instance=retries is Retries.CALL_FRESH)
    if retries is Retries.JOB and attempt <= retry.max_auto_retries:
        return RetryJobAfter(delay_s=retry.platform_delay_s, retry_number=attempt)
    return _exhausted(kind, then, attempt, failure, retry)


def _exhausted(
    kind: FailureKind, then: Then, attempt: int, failure: FailurePolicy, retry: RetryPolicy
) -> Decision:
    tries = f"after {attempt} tr{'y' if attempt == 1 else 'ies'}"
    if then is Then.POLICY:
        then = Then.DROP_SAMPLE if failure.on_exhausted == "drop_sample" else Then.FAIL
    if then is Then.DROP_SAMPLE:
        return DropSample(f"{kind.value} {tries}")
    if then is Then.DROP_GROUP:
        return DropGroup("the plugin asked to discard the group")
    if then is Then.STOP:
        return Stop(f"{kind.value}: {retry.max_auto_retries} automatic retries used up")
    if kind in (FailureKind.PLUGIN_ERROR, FailureKind.STATUS_FAILURE):
        return FailJob(f"{kind.value} {tries}")
    if kind is FailureKind.DEPENDENCY:
        return FailJob(f"{kind.value}: {retry.max_auto_retries} automatic retries used up")
    return FailJob(f"{kind.value}: retrying cannot help")


def kind_of(error: BaseException) -> FailureKind:
    """The failure kind of a classified (or unclassified) exception."""
    if isinstance(error, PluginCallError):
        return (
            FailureKind.CREATE_FAULT if error.cause_enum is Cause.CREATE_FAULT else FailureKind.PLUGIN_ERROR
        )
    if isinstance(error, DataError):
        return FailureKind.DATA
    if isinstance(error, LossNanError):
        return FailureKind.LOSS_NAN
    return FailureKind.PLATFORM


#: The kind of a job's error, by its type (DESIGN §2's table: who owns it decides its handling).
JOB_KINDS: dict[ErrorType, FailureKind] = {
    ErrorType.INTERNAL: FailureKind.PLATFORM,
    ErrorType.UNKNOWN: FailureKind.UNKNOWN,
    ErrorType.CALL_PLUGIN: FailureKind.PLUGIN_ERROR,
    ErrorType.INVALID_DATA: FailureKind.DATA,
    ErrorType.INVALID_VALUE: FailureKind.DATA,
    ErrorType.LOSS_NAN: FailureKind.LOSS_NAN,
    ErrorType.DEPENDENCY: FailureKind.DEPENDENCY,
}
_TYPES = {t.value: t for t in ErrorType}


def job_kind(error: ErrorRecord) -> FailureKind:
    """The failure kind of a job's classified error (a type plugtune never wrote is unknown)."""
    found = _TYPES.get(error.type)
    return FailureKind.UNKNOWN if found is None else JOB_KINDS[found]


# --- circuit breaker ------------------------------------------------------------------------


@dataclass(frozen=True)
class BreakerDecision:
    """Whether a step's plugin errors trip the breaker, and which cause dominates."""

    trip: bool
    calls: int
    errors: int
    share: float
    dominant_cause: str | None

    @property
    def message(self) -> str:
        if not self.trip:
            return ""
        return (
            f"{self.errors} of {self.calls} plugin calls in this step failed ({self.share:.0%}); "
            f"most with {self.dominant_cause!s}. The job stopped early instead of burning compute."
        )


def breaker(
    calls: int, errors_by_cause: Mapping[str, int], config: CircuitBreaker | None = None
) -> BreakerDecision:
    """Trip when a step's failed calls exceed ``max_error_share`` of at least ``min_calls`` calls."""
    config = config or CircuitBreaker()
    counts = {cause: n for cause, n in errors_by_cause.items() if n > 0}
    errors = sum(counts.values())
    if calls < 0 or errors > calls:
        raise ValueError(f"inconsistent counts: {errors} errors in {calls} calls")
    share = errors / calls if calls else 0.0
    dominant = min(counts, key=lambda cause: (-counts[cause], _cause_order(cause))) if counts else None
    trip = calls >= config.min_calls and share > config.max_error_share
    return BreakerDecision(trip=trip, calls=calls, errors=errors, share=share, dominant_cause=dominant)


def _cause_order(cause: str) -> tuple[int, str]:
    order = [c.value for c in Cause]
    return (order.index(cause), cause) if cause in order else (len(order), cause)
