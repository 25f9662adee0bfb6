"""The trajectories of a stopped step, the failing one first of all, kept so the console and
doctor can show them (no log line may link to a trajectory that was never stored)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

from plugtune.jobs.caller import JobStop
from plugtune.jobs.classify import classify
from plugtune.sdk import Sample, Trajectory
from plugtune.trainer.groups import STOPPED
from plugtune.types import ErrorRecord, TrajectoryRecord

STOP_CAUSE = "step stopped"  # the cause on a trajectory that was still running when its job stopped


def stopped_records(records: Sequence[TrajectoryRecord], exc: BaseException) -> list[TrajectoryRecord]:
    """``records`` of steps that ``exc`` stopped (``GRPOTrainer.take_stopped``), each saying why.

    Every one keeps its status and says in ``discard_reason`` that its step was not applied; the
    unfinished ones are ``failed``: the call that stopped the job carries its error, the others
    an error of cause ``step stopped`` naming the job's error (none when the user cancelled).
    """
    cancelled = isinstance(exc, asyncio.CancelledError)  # SIGTERM: the user cancelled the job
    stop = exc if isinstance(exc, JobStop) else None
    error = classify(stop.error if stop is not None else exc)
    why = "the job was cancelled" if cancelled else f"the job stopped: {error['type']}: {error['cause']}"
    failing = stop.ctx.trajectory_id if stop is not None and stop.ctx is not None else ""
    out = []
    for r in records:
        reason = f"step {r.step} was not applied ({why})"
        r = dataclasses.replace(r, discard_reason="; ".join(filter(None, [reason, r.discard_reason])))
        if r.stop_reason != STOPPED:
            out.append(r)
        elif cancelled:
            out.append(dataclasses.replace(r, stop_reason="job cancelled"))
        else:
            own = stop.error if stop is not None and r.trajectory_id == failing else None
            e = own.record(trajectory_id=r.trajectory_id, attempt=r.attempt) if own else _stopped(r, error)
            out.append(dataclasses.replace(r, stop_reason="job stopped", errors=[*r.errors, e]))
    return out


def _stopped(r: TrajectoryRecord, error: dict[str, Any]) -> ErrorRecord:
    """The error of a trajectory that was still running when ``error`` stopped its job."""
    return ErrorRecord(
        type=error["type"],
        owner=error["owner"],
        cause=STOP_CAUSE,
        message=f"still running when the job stopped, because of {error['cause']}: {error['message']}"[:2000],
        hint="Nothing to fix in this trajectory: the job's error (on the job page) stopped it.",
        trajectory_id=r.trajectory_id,
        attempt=r.attempt,
    )


def failed_record(stop: JobStop, server: Any, step: int) -> list[TrajectoryRecord]:
    """A ``failed`` TrajectoryRecord for the call that stopped the job ([] when it had no trajectory).

    The messages are the most complete known: the trajectory a grader was given, else what the
    policy gateway recorded for the rollout so far, else the sample's prompt.
    """
    ctx = stop.ctx
    if ctx is None or not ctx.trajectory_id:
        return []
    sample = next((a for a in stop.args if isinstance(a, Sample)), None)
    graded = next((a for a in stop.args if isinstance(a, Trajectory)), None)
    trace = None
    try:
        trace = server.take(ctx.trajectory_id)
    except KeyError:  # already taken, or the rollout never called the policy
        trace = None
    if graded is not None:
        messages = graded.messages
    elif trace is not None and trace.messages:
        messages = trace.messages
    else:
        messages = list(sample.messages) if sample is not None else []
    e = stop.error
    error = e.record(trajectory_id=ctx.trajectory_id, attempt=ctx.attempt)
    return [
        TrajectoryRecord(
            trajectory_id=ctx.trajectory_id,
            group_id=ctx.trajectory_id.rsplit("-r", 1)[0],  # trajectory ids are <group id>-r<index>
            step=step,
            sample_index=ctx.sample_id,
            rollout_index=ctx.rollout_index,
            attempt=ctx.attempt,
            policy_version=step - 1,
            prompt_ids=list(trace.prompt_ids) if trace else [],
            response_ids=list(trace.response_ids) if trace else [],
            response_mask=list(trace.response_mask) if trace else [],
            response_logprobs=list(trace.response_logprobs) if trace else [],
            messages=list(messages),
            tools=list(sample.tools) if sample is not None else [],
            status="failed",
            stop_reason="job stopped",
            errors=[error],
            code_hash={e.plugin: e.code_hash} if e.code_hash else {},
            phase=ctx.phase,
        )
    ]
