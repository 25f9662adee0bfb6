"""Turn any exception into exactly one job error of the DESIGN §2 table."""

from __future__ import annotations

import traceback as tb
from typing import Any

from plugtune.errors import HINTS, OWNERS, ErrorType, PlugtuneError
from plugtune.types import ErrorRecord


def classify(exc: BaseException, *, evidence: dict[str, Any] | None = None) -> ErrorRecord:
    """The job error for ``exc``: type, owner, cause, message, hint and evidence.

    plugtune's own classified errors keep their fields; anything else raised inside the platform
    is an ``internal error`` whose evidence carries the traceback.
    """
    if isinstance(exc, PlugtuneError):
        return exc.record(evidence=evidence)
    if not isinstance(exc, Exception):  # SystemExit, KeyboardInterrupt: nothing in plugtune raises them
        return job_error(
            ErrorType.UNKNOWN,
            type(exc).__name__,
            f"the attempt was stopped by {type(exc).__name__} from outside plugtune",
            evidence,
        )
    trace = "".join(tb.format_exception(type(exc), exc, exc.__traceback__))
    message = str(exc) or type(exc).__name__
    evidence = {**(evidence or {}), "traceback": trace}
    return job_error(ErrorType.INTERNAL, type(exc).__name__, message, evidence)


def attempt_died(exitcode: int | None, stderr_tail: str = "") -> ErrorRecord:
    """The job error when an attempt process ended without reporting one."""
    evidence = {"exitcode": exitcode, "stderr_tail": stderr_tail[-4000:]}
    if exitcode == 0:
        return job_error(
            ErrorType.UNKNOWN,
            "no result",
            "the attempt process exited normally but never reported a result",
            evidence,
        )
    how = "was killed by a signal" if exitcode is not None and exitcode < 0 else "exited"
    message = f"the job's attempt process {how} (exit code {exitcode}) before it reported a result"
    return job_error(ErrorType.INTERNAL, "attempt process died", message, evidence)


def job_error(
    error_type: ErrorType, cause: str, message: str, evidence: dict[str, Any] | None, hint: str = ""
) -> ErrorRecord:
    """A job error that no exception carried (the attempt process died, the supervisor stopped):
    ``hint`` replaces the type's general one; a ``traceback`` in ``evidence`` is shown as such."""
    found = dict(evidence or {})
    return ErrorRecord(
        type=error_type.value,
        owner=OWNERS[error_type].value,
        cause=cause,
        message=message,
        hint=hint or HINTS[error_type],
        traceback=str(found.get("traceback") or ""),
        evidence=found,
    )
