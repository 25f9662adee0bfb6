"""The runtime boundary: backend facts -> the failure taxonomy; return values -> validated outcomes.

This is the one place where a failed call gets its ``Cause`` (DESIGN §2; a ``DependencyCause`` and
the ``Dependency error`` type when it failed on a service the plugin called) and where a grader's
reward is checked, for every backend alike.
"""

from __future__ import annotations

import math
from typing import Any

from plugtune.errors import (
    POLICY_REFUSED_HINT,
    TIMEOUT_HINTS,
    Cause,
    DependencyCallError,
    DependencyCause,
    PluginCallError,
)
from plugtune.runtime.backend import Failed, Happened
from plugtune.runtime.protocol import TYPE_KEY, is_finite_number
from plugtune.sdk import Kind
from plugtune.types import LogLine

CAUSES: dict[Happened, Cause] = {
    Happened.RAISED: Cause.ERROR_500,
    Happened.BAD_RETURN: Cause.ERROR_500,
    Happened.MEMORY_ERROR: Cause.OOM,
    Happened.OOM_KILLED: Cause.OOM,
    Happened.PIDS_LIMIT: Cause.PIDS,
    Happened.DISK_FULL: Cause.DISK,
    Happened.DEADLINE: Cause.TIMEOUT,
    Happened.DIED: Cause.EOF,
    Happened.NOT_CREATED: Cause.CREATE_FAULT,
    Happened.POLICY_REFUSED: Cause.ERROR_500,  # the job's network settings: the plugin's side
}

STATUSES = ("success", "failure", "retry", "discard")


class InvalidReturn(Exception):
    """A return value failed validation; ``cause`` is Invalid reward or 500 (wrong kind of value)."""

    def __init__(self, cause: Cause, message: str) -> None:
        super().__init__(message)
        self.cause = cause
        self.message = message


def call_error(
    cause: Cause,
    message: str,
    *,
    plugin: str,
    call_id: str = "",
    instance_id: str = "",
    trajectory_id: str = "",
    traceback: str = "",
    peak_memory_mb: float | None = None,
    code_hash: str = "",
    logs: list[LogLine] | None = None,
    is_async: bool | None = None,
    hint: str | None = None,
) -> PluginCallError:
    """A ``PluginCallError`` with the call's log lines; ``is_async`` (the plugin is ``async def``,
    when known) picks the hint that fits it, unless ``hint`` names one."""
    if hint is None and cause is Cause.TIMEOUT and is_async is not None:
        hint = TIMEOUT_HINTS[is_async]
    return PluginCallError(
        cause,
        message,
        plugin=plugin,
        call_id=call_id,
        instance_id=instance_id,
        trajectory_id=trajectory_id,
        traceback=traceback,
        peak_memory_mb=peak_memory_mb,
        code_hash=code_hash,
        hint=hint,
        logs=logs,
    )


def classify(
    failed: Failed,
    *,
    plugin: str,
    call_id: str,
    trajectory_id: str,
    code_hash: str,
    is_async: bool | None = None,
) -> PluginCallError:
    if failed.happened is Happened.DEPENDENCY:
        cause, _, rest = failed.cause.partition("/")
        name, _, after = rest.partition("/")
        return DependencyCallError(
            DependencyCause(cause),
            failed.message,
            dependency=name,
            retry_after_s=_seconds(after),
            plugin=plugin,
            call_id=call_id,
            instance_id=failed.instance_id,
            trajectory_id=trajectory_id,
            traceback=failed.traceback,
            peak_memory_mb=failed.peak_memory_mb,
            code_hash=code_hash,
            logs=failed.logs,
        )
    return call_error(
        CAUSES[failed.happened],
        failed.message,
        plugin=plugin,
        call_id=call_id,
        instance_id=failed.instance_id,
        trajectory_id=trajectory_id,
        traceback=failed.traceback,
        peak_memory_mb=failed.peak_memory_mb,
        code_hash=code_hash,
        logs=failed.logs,
        is_async=is_async,
        hint=POLICY_REFUSED_HINT if failed.happened is Happened.POLICY_REFUSED else None,
    )


def validate(kind: Kind, value: Any, group_size: int) -> tuple[str, Any, str]:
    """``(status, value, reason)`` of an encoded return value, or raise :class:`InvalidReturn`. A
    ``Retry`` raised on a dependency's failure has that as its value: ``{"cause", "name",
    "retry_after_s", "message"}`` (None for any other status)."""
    if isinstance(value, dict) and value.get(TYPE_KEY) == "status":
        dependency = value.get("dependency") if value.get("status") == "retry" else None
        return (
            str(value["status"]),
            dependency if isinstance(dependency, dict) else None,
            str(value.get("reason") or ""),
        )
    if kind is Kind.ROLLOUT:
        return _rollout(value)
    if kind is Kind.GRADER:
        return _graded(value, "the grader")
    if not isinstance(value, list):
        raise InvalidReturn(
            Cause.INVALID_REWARD,
            f"the group grader returned {_describe(value)}; it must return a list of {group_size} "
            "rewards (float or None), one per trajectory",
        )
    if len(value) != group_size:
        raise InvalidReturn(
            Cause.INVALID_REWARD,
            f"the group grader returned {len(value)} rewards for {group_size} trajectories",
        )
    rewards = [_reward(item, f"the group grader's reward [{i}]") for i, item in enumerate(value)]
    return "success", rewards, ""


def _rollout(value: Any) -> tuple[str, Any, str]:
    if value is None:
        return "success", None, ""
    if isinstance(value, dict) and value.get(TYPE_KEY) == "rollout_result":
        fields = {k: v for k, v in value.items() if k != TYPE_KEY}
        status = _status(fields.get("status"))
        return status, fields, str(fields.get("reason") or "")
    raise InvalidReturn(
        Cause.ERROR_500, f"the rollout returned {_describe(value)}; return a RolloutResult or None"
    )


def _graded(value: Any, who: str) -> tuple[str, Any, str]:
    if isinstance(value, dict) and value.get(TYPE_KEY) == "grader_result":
        status = _status(value.get("status"))
        return status, _reward(value.get("reward"), who), str(value.get("reason") or "")
    return "success", _reward(value, who), ""


def _reward(value: Any, who: str) -> float | None:
    if value is None:
        return None
    if is_finite_number(value):
        return float(value)
    if isinstance(value, float) and math.isnan(value):
        raise InvalidReturn(Cause.INVALID_REWARD, f"{who} returned NaN; return a finite float or None")
    if isinstance(value, float):
        raise InvalidReturn(Cause.INVALID_REWARD, f"{who} returned {value}; return a finite float or None")
    raise InvalidReturn(
        Cause.INVALID_REWARD, f"{who} returned {_describe(value)}; a reward is a finite float or None"
    )


def _status(raw: Any) -> str:
    status = str(raw or "success")
    if status not in STATUSES:
        raise InvalidReturn(Cause.ERROR_500, f"unknown status {status!r}; use one of {', '.join(STATUSES)}")
    return status


def _describe(value: Any) -> str:
    if isinstance(value, dict) and value.get(TYPE_KEY) == "object":
        return f"a {value['type']} ({value['repr']})"
    if isinstance(value, bool):
        return f"a bool ({value})"
    text = repr(value)
    return f"a {type(value).__name__} ({text[:80]})"


def _seconds(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value >= 0 else None
