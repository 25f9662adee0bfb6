"""The failing trajectory of a job-ending plugin call, kept so the console and doctor can show it."""

from __future__ import annotations

from typing import Any

from plugtune.jobs.caller import JobStop
from plugtune.sdk import Sample, Trajectory
from plugtune.types import TrajectoryRecord


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
