"""``plugtune run``'s foreground display: a progress bar with step, reward, loss and plugin errors."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from plugtune.jobs.caller import FAILED_CALLS, waiting_summary
from plugtune.jobs.scheduler import AttemptRunner, run_job
from plugtune.settings import Settings
from plugtune.store import Store


def run_with_progress(store: Store, settings: Settings, job_id: int) -> str:
    """Run the job here until it ends; Ctrl-C stops the attempt cleanly and cancels the job."""
    runner = AttemptRunner(store, settings)
    columns = (
        TextColumn("[bold]job {task.fields[job]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[summary]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task("train", total=None, job=job_id, summary="starting")

        def progress(jid: int) -> None:
            job = store.get_job(jid)
            if job is None:
                return
            latest = {m.name: m.value for m in store.latest_metrics([jid], plugin="")}
            summary = _summary(latest, failed_calls(store, jid))
            waiting = waiting_summary(latest) if job.status == "running" else ""
            if waiting:
                summary += f"  {waiting}"
            if job.status == "failed" and job.next_retry_at is not None:
                wait = max(0.0, job.next_retry_at - time.time())
                summary += f"  automatic retry {job.auto_retries} in {wait:.0f} s (Ctrl-C cancels)"
            bar.update(task, completed=job.steps_done, total=job.steps_total or None, summary=summary)

        previous = signal.getsignal(signal.SIGINT)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, lambda *_: runner.cancel())
        try:
            status = run_job(store, settings, job_id, runner=runner, progress=progress)
        finally:
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, previous)
        progress(job_id)
    return status


def failed_calls(store: Store, job_id: int) -> float:
    """The job's failed plugin calls so far, over every step written (the one that stopped it too)."""
    points = store.metrics(job_id, names=[FAILED_CALLS]).get(FAILED_CALLS, [])
    return sum(p.value * p.count for p in points)


def _summary(latest: dict[str, Any], errors: float) -> str:
    parts = []
    if "reward/mean" in latest:
        parts.append(f"reward {latest['reward/mean']:.3f}")
    if "loss" in latest:
        parts.append(f"loss {latest['loss']:.4f}")
    filtered = latest.get("dynamic_sampling/filtered_groups", 0.0)
    if filtered:  # hyperparameters.dynamic_sampling left groups out of the last step
        parts.append(
            f"filtered {filtered:.0f} (+{latest.get('dynamic_sampling/extra_rollouts', 0.0):.0f} rollouts)"
        )
    if "memory/peak_mib" in latest:
        parts.append(f"mem {latest['memory/peak_mib']:.0f} MiB")
    parts.append(f"plugin errors {errors:.0f}")
    return "  ".join(parts)
