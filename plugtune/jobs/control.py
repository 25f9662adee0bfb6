"""What a user does to jobs: create (with validation), retry, cancel; and the server's scheduler loop."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

from plugtune.errors import DataError
from plugtune.jobs.classify import classify
from plugtune.jobs.scheduler import AttemptRunner, recover_interrupted, run_job
from plugtune.jobs.validation import validate_job
from plugtune.settings import Settings
from plugtune.store import Store

log = logging.getLogger(__name__)


class JobNotFoundError(LookupError):
    """Raised when a command names a job id the store does not hold."""


class NotCancellableError(ValueError):
    """Raised when a job has nothing left to cancel: it ended and no automatic retry is pending."""


def create_job(store: Store, job_file: str | Path) -> tuple[int, DataError | None]:
    """Record a job from ``job.yaml`` and validate it before any compute.

    A job that fails validation is still recorded (failed, with its classified error) so that
    ``jobs show`` and the console explain it; the error is returned too.
    """
    path = Path(job_file).resolve()
    text = path.read_text(errors="replace") if path.is_file() else ""
    name = path.parent.name if path.name == "job.yaml" else path.stem
    try:
        job = validate_job(path)
    except DataError as exc:
        job_id = store.create_job(name, {"job_file": str(path)}, spec_yaml=text)
        store.set_job_error(job_id, classify(exc), attempt=None)
        store.transition(job_id, "failed", exc.type)
        return job_id, exc
    spec = {"job_file": str(path), **job.spec.model_dump(mode="json")}
    job_id = store.create_job(job.spec.name, spec, spec_yaml=text)
    store.update_job(job_id, steps_total=job.spec.hyperparameters.steps)
    return job_id, None


def require(store: Store, job_id: int) -> None:
    if store.get_job(job_id) is None:
        raise JobNotFoundError(
            f"there is no job {job_id} in {store.url}; `plugtune jobs list` shows the jobs"
        )


def retry_job(store: Store, job_id: int) -> None:
    """Put a failed or cancelled job back in the queue now; it resumes from its last checkpoint."""
    require(store, job_id)
    store.update_job(job_id, next_retry_at=None)
    store.transition(job_id, "queued", "manual retry")


def cancel_job(store: Store, job_id: int, runners: dict[int, AttemptRunner] | None = None) -> None:
    """Cancel a queued, running or retry-pending job (a running attempt is stopped with SIGTERM)."""
    require(store, job_id)
    runner = (runners or {}).get(job_id)
    if runner is not None:
        runner.cancel()  # run_job records the transition when the attempt has stopped
        return
    _cancel_now(store, job_id)


def request_cancel(store: Store, job_id: int) -> None:
    """Cancel a job from any process: a running attempt gets SIGTERM (its scheduler records the
    cancellation when it has stopped); a queued or retry-pending job is cancelled at once."""
    require(store, job_id)
    job = store.get_job(job_id)
    if job is not None and job.status == "running":
        running = [a for a in store.list_attempts(job_id) if a.status == "running" and a.pid]
        for attempt in running:
            try:
                os.kill(int(attempt.pid or 0), signal.SIGTERM)
            except ProcessLookupError:
                continue
        if running:
            return
    _cancel_now(store, job_id)


def _cancel_now(store: Store, job_id: int) -> None:
    job = store.get_job(job_id)
    if job is not None and job.status == "failed" and job.next_retry_at is None:
        raise NotCancellableError(
            f"job {job_id} failed and no automatic retry is pending, so there is nothing to cancel; "
            f"`plugtune jobs show {job_id}` says why it failed"
        )
    store.update_job(job_id, next_retry_at=None)
    reason = "cancelled while waiting for an automatic retry" if job and job.status == "failed" else ""
    store.transition(job_id, "cancelled", reason or "cancelled by the user")


class Scheduler:
    """The server's loop: runs queued jobs one at a time and starts automatic retries when due."""

    PURGE_EVERY_S = 3600.0

    def __init__(self, store: Store, settings: Settings, poll_s: float = 1.0) -> None:
        self.store, self.settings, self.poll_s = store, settings, poll_s
        self._purged_at = 0.0
        self.runners: dict[int, AttemptRunner] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="plugtune-scheduler", daemon=True)

    def start(self) -> None:
        """Settle the jobs a stopped server left running (see ``recover_interrupted``), then loop."""
        recover_interrupted(self.store, self.settings)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        for runner in list(self.runners.values()):
            runner.cancel()
        self._thread.join(timeout=30)

    def cancel(self, job_id: int) -> None:
        cancel_job(self.store, job_id, self.runners)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception:  # the loop must survive anything one job does
                log.exception("scheduler tick failed")
            self._stop.wait(self.poll_s)

    def _tick(self) -> None:
        now = time.time()
        if now - self._purged_at >= self.PURGE_EVERY_S:
            purged = self.store.purge_expired(now)
            self._purged_at = now
            if purged:
                log.info("purged the monitoring data of %d ended plugins past their retention", purged)
        for job in self.store.list_jobs("failed", limit=200):
            if job.next_retry_at is not None and job.next_retry_at <= now:
                self.store.transition(job.id, "queued", f"automatic retry {job.auto_retries}")
        queued = self.store.list_jobs("queued", limit=200)
        if not queued or self._stop.is_set():
            return
        job = queued[-1]  # oldest first
        runner = AttemptRunner(self.store, self.settings)
        self.runners[job.id] = runner
        try:
            run_job(self.store, self.settings, job.id, runner=runner, wait_for_retries=False)
        finally:
            self.runners.pop(job.id, None)
