"""Turn any exception into exactly one job error of the DESIGN §2 table."""

from __future__ import annotations

import traceback as tb
from typing import Any

from plugtune.errors import HINTS, OWNERS, ErrorType, PlugtuneError


def classify(exc: BaseException, *, evidence: dict[str, Any] | None = None) -> dict[str, Any]:
    """The job error for ``exc``: type, owner, cause, message, hint and evidence.

    plugtune's own classified errors keep their fields; anything else raised inside the platform
    is an ``internal error`` whose evidence carries the traceback.
    """
    if isinstance(exc, PlugtuneError):
        error = exc.to_dict()
    elif not isinstance(exc, Exception):  # SystemExit, KeyboardInterrupt: nothing in plugtune raises them
        error = {
            "type": ErrorType.UNKNOWN.value,
            "owner": OWNERS[ErrorType.UNKNOWN].value,
            "cause": type(exc).__name__,
            "message": f"the attempt was stopped by {type(exc).__name__} from outside plugtune",
            "hint": HINTS[ErrorType.UNKNOWN],
        }
    else:
        error = {
            "type": ErrorType.INTERNAL.value,
            "owner": OWNERS[ErrorType.INTERNAL].value,
            "cause": type(exc).__name__,
            "message": str(exc) or type(exc).__name__,
            "hint": HINTS[ErrorType.INTERNAL],
            "traceback": "".join(tb.format_exception(type(exc), exc, exc.__traceback__)),
        }
    error["evidence"] = {**error.get("evidence", {}), **(evidence or {})}
    return error


def attempt_died(exitcode: int | None, stderr_tail: str = "") -> dict[str, Any]:
    """The job error when an attempt process ended without reporting one."""
    if exitcode == 0:
        return {
            "type": ErrorType.UNKNOWN.value,
            "owner": OWNERS[ErrorType.UNKNOWN].value,
            "cause": "no result",
            "message": "the attempt process exited normally but never reported a result",
            "hint": HINTS[ErrorType.UNKNOWN],
            "evidence": {"exitcode": exitcode, "stderr_tail": stderr_tail[-4000:]},
        }
    how = "was killed by a signal" if exitcode is not None and exitcode < 0 else "exited"
    message = f"the job's attempt process {how} (exit code {exitcode}) before it reported a result"
    return {
        "type": ErrorType.INTERNAL.value,
        "owner": OWNERS[ErrorType.INTERNAL].value,
        "cause": "attempt process died",
        "message": message,
        "hint": HINTS[ErrorType.INTERNAL],
        "evidence": {"exitcode": exitcode, "stderr_tail": stderr_tail[-4000:]},
    }


def is_platform(error: dict[str, Any]) -> bool:
    """Platform-owned errors (and, through the retry policy, dependency-owned ones: a service the
    plugins call) are the ones retried automatically."""
    return error.get("owner") == OWNERS[ErrorType.INTERNAL].value
