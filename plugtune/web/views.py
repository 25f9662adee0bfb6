"""Store records → the API's models: one translation, shared by the JSON API and the pages."""

from __future__ import annotations

import json
from typing import Any

from plugtune.store.records import Attempt, Job, LogRow, Plugin, TrajectorySummary, Transition
from plugtune.types import ErrorRecord, TrajectoryRecord
from plugtune.web.models import (
    AttemptOut,
    ErrorOut,
    JobOut,
    LogOut,
    MessageOut,
    PluginOut,
    ToolCallOut,
    TrajectoryErrorOut,
    TrajectoryLogs,
    TrajectoryOut,
    TrajectorySummaryOut,
)


def error_out(error: ErrorRecord | None) -> ErrorOut | None:
    if error is None:
        return None
    return ErrorOut(
        type=error.type or "unknown error",
        owner=error.owner,
        cause=error.cause,
        message=error.message,
        hint=error.hint,
        plugin=error.plugin,  # the banner shows these in their own rows; evidence keeps them too
        trajectory_id=error.trajectory_id,
        traceback=error.traceback,
        evidence=_jsonable(error.evidence),
        time=error.time,
        attempt=error.attempt,
    )


def job_out(job: Job, queue_positions: dict[int, int] | None = None) -> JobOut:
    return JobOut(
        queue_position=(queue_positions or {}).get(job.id),
        id=job.id,
        name=job.name,
        status=job.status,
        created_at=job.created_at,
        updated_at=job.updated_at,
        steps_done=job.steps_done,
        total_steps=job.steps_total,
        error=error_out(job.error),
        next_retry_at=job.next_retry_at,
        auto_retries=job.auto_retries,
    )


def attempts_out(
    attempts: list[Attempt], errors: list[ErrorRecord], transitions: list[Transition]
) -> list[AttemptOut]:
    """Attempts, newest first, each with what started it (from the job's status history) and its error."""
    by_attempt = {e.attempt: e for e in errors if e.attempt is not None}
    requeued = [t for t in transitions if t.to_status == "queued" and t.from_status is not None]
    out: list[AttemptOut] = []
    for i, a in enumerate(attempts):
        out.append(
            AttemptOut(
                number=a.number,
                trigger="first run" if i == 0 else _trigger(a, requeued),
                status=a.status,
                started_at=a.started_at,
                ended_at=a.ended_at,
                resumed_from_step=a.resumed_from_step,
                error=error_out(a.error if a.error else by_attempt.get(a.number)),
                pid=a.pid,
            )
        )
    return out[::-1]


def _trigger(attempt: Attempt, requeued: list[Transition]) -> str:
    """The reason of the last re-queueing before the attempt started (manual or automatic retry)."""
    before = [t for t in requeued if t.time <= attempt.started_at]
    if not before:
        return "retry"
    reason = before[-1].reason
    if reason.startswith("automatic"):
        return "automatic retry"
    if reason.startswith("manual"):
        return "manual retry"
    return reason or "retry"


def plugin_out(plugin: Plugin) -> PluginOut:
    return PluginOut(
        name=plugin.name,
        kind=plugin.role,
        entry=plugin.entry,
        status=plugin.status,
        failure_reason=plugin.failure_reason,
        code_hash=plugin.code_hash,
        runtime=_jsonable(plugin.runtime),
        started_at=plugin.started_at,
        ended_at=plugin.ended_at,
        retention_expires_at=plugin.retention_expires_at,
        monitoring_reclaimed=plugin.monitoring_expired,
    )


def log_out(row: LogRow) -> LogOut:
    return LogOut(
        id=row.id,
        time=row.time,
        level=row.level,
        plugin=row.plugin,
        source=row.source,
        trajectory_id=row.trajectory_id,
        call_id=row.call_id,
        message=row.message,
    )


def summary_out(row: TrajectorySummary) -> TrajectorySummaryOut:
    return TrajectorySummaryOut(
        id=row.trajectory_id,
        row=row.id,
        group_id=row.group_id,
        step=row.step,
        status=row.status,
        phase=row.phase,
        reward=row.reward,
        advantage=row.advantage,
        plugins=list(row.plugins),
        error_cause=row.error_cause,
        preview=row.preview,
        discard_reason=row.discard_reason,
    )


def trajectory_out(record: TrajectoryRecord, logs: TrajectoryLogs) -> TrajectoryOut:
    return TrajectoryOut(
        id=record.trajectory_id,
        group_id=record.group_id,
        step=record.step,
        attempt=record.attempt,
        status=record.status,
        phase=record.phase,
        stop_reason=record.stop_reason,
        discard_reason=record.discard_reason,
        reward=_finite(record.reward),
        advantage=_finite(record.advantage),
        reward_components={k: _finite(v) for k, v in record.reward_components.items()},
        errors=[_trajectory_error(e) for e in record.errors],
        messages=[message_out(m) for m in record.messages if isinstance(m, dict)],
        code_hash=dict(record.code_hash),
        metrics={k: float(v) for k, v in record.metrics.items() if _finite(v) is not None},
        prompt_ids=record.prompt_ids,
        response_ids=record.response_ids,
        response_mask=record.response_mask,
        response_logprobs=record.response_logprobs,
        logs=logs,
    )


def _trajectory_error(e: ErrorRecord) -> TrajectoryErrorOut:
    return TrajectoryErrorOut(
        type=e.type,
        owner=e.owner,
        cause=e.cause,
        message=e.message,
        plugin=e.plugin,
        attempt=e.attempt if e.attempt is not None else 1,
        traceback=e.traceback,
    )


def message_out(message: dict[str, Any]) -> MessageOut:
    """An OpenAI-format message made readable: content parts joined, tool-call arguments pretty."""
    calls = []
    for call in message.get("tool_calls") or []:
        if not isinstance(call, dict):
            continue
        inner = call.get("function")
        function: dict[str, Any] = inner if isinstance(inner, dict) else call
        calls.append(
            ToolCallOut(
                id=str(call.get("id") or ""),
                name=str(function.get("name") or "?"),
                arguments=_pretty_arguments(function.get("arguments")),
            )
        )
    return MessageOut(
        role=str(message.get("role") or "?"),
        name=str(message.get("name") or ""),
        content=_content_text(message.get("content")),
        tool_call_id=str(message.get("tool_call_id") or ""),
        tool_calls=calls,
    )


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                parts.append(str(part.get("text") or part.get("content") or json.dumps(part)))
            else:
                parts.append(str(part))
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False)


def _pretty_arguments(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    return json.dumps(arguments, ensure_ascii=False, indent=1 if isinstance(arguments, dict) else None)


def _finite(value: float | None) -> float | None:
    if value is None or value != value or value in (float("inf"), float("-inf")):
        return None
    return float(value)


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
