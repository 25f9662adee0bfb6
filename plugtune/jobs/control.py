"""What a user does to jobs: create (with validation), retry, cancel; and the server's scheduler loop."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import yaml

from plugtune.errors import DataError
from plugtune.jobs.classify import classify
from plugtune.jobs.scheduler import CANCELLED_BY_USER, AttemptRunner, recover_interrupted, run_job
from plugtune.settings import Settings
from plugtune.spec import job_yaml
from plugtune.spec.reach import Confinement, is_submission, submission_root
from plugtune.spec.validation import validate_job
from plugtune.store import Store

log = logging.getLogger(__name__)


class JobNotFoundError(LookupError):
    """Raised when a command names a job id the store does not hold."""


class NotCancellableError(ValueError):
    """Raised when a job has nothing left to cancel: it ended and no automatic retry is pending."""


class NotRetryableError(ValueError):
    """Raised when retrying a job an engine ran (TRL, verl): its launcher, not plugtune, starts it."""


class NotDeletableError(ValueError):
    """Raised when deleting a job that has not ended (queued, running, or awaiting a retry)."""


ENDED = ("succeeded", "failed", "cancelled")
MAX_QUEUE = 1000  # queued jobs given a position; later ones show none


def create_job(
    store: Store, job_file: str | Path, *, base_dir: Path | None = None, confine: Confinement | None = None
) -> tuple[int, DataError | None]:
    """Record a job from ``job.yaml`` and validate it before any compute.

    A job that fails validation is still recorded (failed, with its classified error) so that
    ``jobs show`` and the console explain it; the error is returned too. ``base_dir``: where the
    relative paths of job.yaml start (default: its folder), kept for the job's attempts. ``confine``:
    where a job submitted over the API may read (see ``validate_job``).
    """
    path = Path(job_file).resolve()
    text = path.read_text(errors="replace") if path.is_file() else ""
    name = _declared_name(text) or (path.parent.name if path.name == "job.yaml" else path.stem)
    where = {"job_file": str(path), **({"base_dir": str(base_dir.resolve())} if base_dir else {})}
    try:
        job = validate_job(path, base_dir=base_dir, confine=confine)
    except DataError as exc:
        job_id = store.create_job(name, where, spec_yaml=text)
        store.set_job_error(job_id, classify(exc), attempt=None)
        store.transition(job_id, "failed", exc.type)
        return job_id, exc
    spec = {**where, **job.spec.model_dump(mode="json")}
    job_id = store.create_job(job.spec.name, spec, spec_yaml=text)
    store.update_job(job_id, steps_total=job.spec.hyperparameters.steps)
    return job_id, None


def _declared_name(text: str) -> str | None:
    """job.yaml's ``name:`` when the file parses that far (an invalid job keeps the name it asked for,
    not its folder's, which for a submission over the API is a random id)."""
    try:
        raw = job_yaml.load(text)
    except yaml.YAMLError:
        return None
    name = raw.get("name") if isinstance(raw, dict) else None
    return name.strip()[:200] or None if isinstance(name, str) else None


def check_job(
    job_file: Path, *, base_dir: Path | None = None, confine: Confinement | None = None
) -> DataError | None:
    """Validate a job.yaml as ``create_job`` does, recording nothing (a dry run)."""
    try:
        validate_job(job_file, base_dir=base_dir, confine=confine)
    except DataError as exc:
        return exc
    return None


def delete_job(store: Store, home: Path, job_id: int) -> None:
    """Remove an ended job's rows and its files ($PLUGTUNE_HOME/jobs/<id>, and the submission folder
    the API unpacked it into); NotDeletableError while it is queued, running or awaiting a retry."""
    require(store, job_id)
    job = store.get_job(job_id)
    if job is None or job.status not in ENDED or job.next_retry_at is not None:
        state = (
            "waiting for its automatic retry" if job and job.next_retry_at else (job.status if job else "")
        )
        raise NotDeletableError(
            f"job {job_id} is {state}; only a succeeded, failed or cancelled job can be deleted: "
            f"cancel it first (`plugtune jobs cancel {job_id}`)"
        )
    job_file = Path(str(job.spec.get("job_file") or ""))
    store.delete_job(job_id)
    shutil.rmtree(home / "jobs" / str(job_id), ignore_errors=True)
    if job_file.name and is_submission(home, job_file):
        shutil.rmtree(submission_root(home, job_file), ignore_errors=True)


def queue_positions(store: Store) -> dict[int, int]:
    """Queued job id -> its place in the queue (1 starts next: the scheduler takes the oldest)."""
    queued = store.list_jobs("queued", limit=MAX_QUEUE)
    return {j.id: i + 1 for i, j in enumerate(reversed(queued))}


def require(store: Store, job_id: int) -> None:
    if store.get_job(job_id) is None:
        raise JobNotFoundError(
            f"there is no job {job_id} in {store.url}; `plugtune jobs list` shows the jobs"
        )


def retry_job(store: Store, job_id: int) -> None:
    """Put a failed or cancelled job back in the queue now; it resumes from its last checkpoint."""
    require(store, job_id)
    job = store.get_job(job_id)
    if job is not None and "engine" in job.spec:
        raise NotRetryableError(
            f"job {job_id} was run by {job.spec['engine']} from its own launcher, which plugtune "
            "cannot start again: run that script (or command) again; it records a new job"
        )
    store.update_job(job_id, next_retry_at=None)
    store.transition(job_id, "queued", "manual retry")


def cancel_job(store: Store, job_id: int, runners: dict[int, AttemptRunner] | None = None) -> None:
    """Cancel a queued, running or retry-pending job (a running attempt is stopped with SIGTERM)."""
    require(store, job_id)
    runner = (runners or {}).get(job_id)
    if runner is not None:
        runner.cancel()  # run_job records the transition when the attempt has stopped
        return
    request_cancel(store, job_id)


def request_cancel(store: Store, job_id: int) -> None:
    """Cancel a job from any process: the request is recorded in the store, then a running attempt
    gets SIGTERM (it ends cancelled because the request is there; its scheduler records the job's
    cancellation when it has stopped); a queued or retry-pending job is cancelled at once."""
    require(store, job_id)
    job = store.get_job(job_id)
    if job is not None and job.status == "running" and "engine" in job.spec:
        # an engine's process (a user's TRL script, a verl worker) is not ours to signal: the run
        # sees the cancellation (TRL stops after its current step) and ends its attempt
        reason = f"cancelled by the user; the {job.spec['engine']} run stops at its next step"
        store.transition(job_id, "cancelled", reason)
        return
    if job is not None and job.status == "running":
        running = [a for a in store.list_attempts(job_id) if a.status == "running" and a.pid]
        if running:  # first: an attempt reads it to tell this SIGTERM from a kill from outside
            store.request_cancel(job_id, CANCELLED_BY_USER)
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
    store.transition(job_id, "cancelled", reason or CANCELLED_BY_USER)


class Scheduler:
    """The server's loop: runs up to ``max_running`` queued jobs at once, oldest first, each attempt in
    its own process supervised by its own thread, and starts automatic retries when due."""

    PURGE_EVERY_S = 3600.0

    def __init__(self, store: Store, settings: Settings, poll_s: float = 1.0, max_running: int = 1) -> None:
        if max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {max_running}")
        self.store, self.settings, self.poll_s, self.max_running = store, settings, poll_s, max_running
        self._purged_at = 0.0
        self.runners: dict[int, AttemptRunner] = {}
        self._threads: dict[int, threading.Thread] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="plugtune-scheduler", daemon=True)

    def start(self) -> None:
        """Settle the jobs a stopped server left running (see ``recover_interrupted``), then loop."""
        recover_interrupted(self.store, self.settings)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        with self._lock:
            runners, threads = list(self.runners.values()), list(self._threads.values())
        for runner in runners:
            runner.cancel("cancelled: the server stopped")
        self._thread.join(timeout=30)
        for thread in threads:
            thread.join(timeout=30)

    def wake(self, _job_id: str = "") -> None:
        """Look at the queue now (a job was submitted or retried) instead of at the next poll."""
        self._wake.set()

    def cancel(self, job_id: int) -> None:
        with self._lock:
            runners = dict(self.runners)
        cancel_job(self.store, job_id, runners)

    def running(self) -> list[int]:
        """The ids of the jobs this scheduler is running now."""
        with self._lock:
            return sorted(self._threads)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception:  # the loop must survive anything one job does
                log.exception("scheduler tick failed")
            self._wake.wait(self.poll_s)
            self._wake.clear()

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
                self.store.update_job(job.id, next_retry_at=None)  # no longer pending: it is queued
        with self._lock:
            free = self.max_running - len(self._threads)
            busy = set(self._threads)
        if free <= 0 or self._stop.is_set():
            return
        queued = [j for j in reversed(self.store.list_jobs("queued", limit=200)) if j.id not in busy]
        for job in queued[:free]:  # oldest first
            self._launch(job.id)

    def _launch(self, job_id: int) -> None:
        runner = AttemptRunner(self.store, self.settings)
        thread = threading.Thread(
            target=self._run, args=(job_id, runner), name=f"plugtune-job-{job_id}", daemon=True
        )
        with self._lock:
            self.runners[job_id] = runner
            self._threads[job_id] = thread
        thread.start()

    def _run(self, job_id: int, runner: AttemptRunner) -> None:
        try:
            run_job(self.store, self.settings, job_id, runner=runner, wait_for_retries=False)
        except Exception:  # e.g. cancelled before it started: the next job must still run
            log.exception("job %d could not be run", job_id)
        finally:
            with self._lock:
                self.runners.pop(job_id, None)
                self._threads.pop(job_id, None)
            self._wake.set()
