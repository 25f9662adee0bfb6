"""The trajectories of a stopped step, the failing one first of all, kept so the console and
doctor can show them (no log line may link to a trajectory that was never stored)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

from plugtune.jobs.caller import JobStop
from plugtune.jobs.classify import classify
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
    why = "the job was cancelled" if cancelled else f"the job stopped: {error.type}: {error.cause}"
    failing = stop.ctx.trajectory_id if stop is not None and stop.ctx is not None else ""
    out = []
    for r in records:
        reason = (
            f"its evaluation after step {r.step} was stopped ({why})"
            if r.phase == "eval"
            else f"step {r.step} was not applied ({why})"
        )
        r = dataclasses.replace(r, discard_reason="; ".join(filter(None, [reason, r.discard_reason])))
        if r.stop_reason != STOPPED:
            out.append(r)
        elif cancelled:
            out.append(dataclasses.replace(r, stop_reason="job cancelled"))
        else:
            own = stop.error if stop is not None and r.trajectory_id == failing else None
            e = own.record(trajectory_id=r.trajectory_id, attempt=r.attempt) if own else _stopped(r, error)
            last = (r.errors[-1].call_id, r.errors[-1].cause) if r.errors else None
            kept = own is not None and last == (own.call_id, own.cause)
            errors = r.errors if kept else [*r.errors, e]  # the trainer keeps every try's error itself
            out.append(dataclasses.replace(r, stop_reason="job stopped", errors=errors))
    return out


def _stopped(r: TrajectoryRecord, error: ErrorRecord) -> ErrorRecord:
    """The error of a trajectory that was still running when ``error`` stopped its job."""
    return ErrorRecord(
        type=error.type,
        owner=error.owner,
        cause=STOP_CAUSE,
        message=f"still running when the job stopped, because of {error.cause}: {error.message}"[:2000],
        hint="Nothing to fix in this trajectory: the job's error (on the job page) stopped it.",
        trajectory_id=r.trajectory_id,
        attempt=r.attempt,
    )
