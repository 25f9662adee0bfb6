"""Run a job's attempts as child processes, classify how each ended, and retry when that helps.

The scheduler survives its attempts: an attempt that dies (killed, crashed interpreter) becomes
an ``internal error`` recorded here. Platform errors retry automatically after
``retry.platform_delay_s`` from the last checkpoint; after the last automatic retry a support
bundle is written and the job error says where. An attempt dies with the process that supervises
it (kill -9 of ``plugtune serve``), and :func:`recover_interrupted` settles the jobs such a process
left "running" the same way, when the server starts again. The server's loop, :class:`Scheduler`,
runs the queued jobs so, and cancelling a job (running here or in another process) is here too.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from plugtune.errors import ErrorType
from plugtune.jobs.classify import attempt_died, job_error
from plugtune.jobs.engine_members import member_lives
from plugtune.jobs.retry_policy import RetryJobAfter, Stop, decide, job_kind
from plugtune.jobs.support_bundle import write_bundle
from plugtune.settings import Settings
from plugtune.spec.models import RetryPolicy
from plugtune.store import Attempt, IllegalTransitionError, Job, Store
from plugtune.types import ErrorRecord

#: ``-P``: the attempt never imports a module from the server's working folder (``-m`` would first).
SAFE_PATH = ("-P",) if sys.version_info >= (3, 11) else ()

log = logging.getLogger(__name__)

POLL_S = 0.5
PR_SET_PDEATHSIG = 1
CANCELLED_BY_USER = "cancelled by the user"

#: ``progress(job_id)`` is called about every POLL_S while an attempt runs.
Progress = Callable[[int], None]


@dataclass(frozen=True)
class AttemptEnd:
    status: str  # succeeded | failed | cancelled
    error: ErrorRecord | None


class AttemptRunner:
    """Starts and watches attempt processes; ``cancel()`` stops the running one cleanly."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self.proc: subprocess.Popen[bytes] | None = None
        self.job_id: int | None = None
        self.cancel_requested = threading.Event()
        self.cancel_reason = CANCELLED_BY_USER

    def run(self, job_id: int, progress: Progress | None = None) -> AttemptEnd:
        env = dict(
            os.environ,
            PLUGTUNE_DATABASE_URL=self.settings.database_url,
            PLUGTUNE_HOME=str(self.settings.home),
        )
        before = len(self.store.list_attempts(job_id))
        self.job_id = job_id
        with tempfile.TemporaryFile() as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, *SAFE_PATH, "-m", "plugtune.jobs.attempt", str(job_id)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
                preexec_fn=_die_with_parent(),
            )
            if self.cancel_requested.is_set():  # cancelled while the attempt was being started
                self._stop(self.proc)
            while self.proc.poll() is None:
                if progress is not None:
                    progress(job_id)
                time.sleep(POLL_S)
            rc = self.proc.returncode
            stderr.seek(0)
            tail = stderr.read()[-8000:].decode(errors="replace")
        self.proc, self.job_id = None, None
        return self._ended(job_id, before, rc, tail)

    def _ended(self, job_id: int, before: int, rc: int, stderr_tail: str) -> AttemptEnd:
        attempts = self.store.list_attempts(job_id)
        mine = attempts[-1] if len(attempts) > before else None
        if mine is not None and mine.status in ("succeeded", "failed", "cancelled"):
            return AttemptEnd(mine.status, mine.error)
        if self.cancel_requested.is_set() or self.store.cancel_request(job_id) is not None:
            status, error = "cancelled", None
        else:
            status, error = "failed", attempt_died(rc, stderr_tail)
        if mine is not None:
            self.store.end_attempt(job_id, mine.number, status, error)
        return AttemptEnd(status, error)

    def cancel(self, reason: str = CANCELLED_BY_USER) -> None:
        """Stop the running attempt as cancelled. Safe in a signal handler: the store write and the
        SIGTERM happen on a thread of their own (the handler may interrupt a store write)."""
        self.cancel_reason = reason
        self.cancel_requested.set()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            threading.Thread(target=self._stop, args=(proc,), name="plugtune-cancel", daemon=True).start()

    def _stop(self, proc: subprocess.Popen[bytes]) -> None:
        """Record the cancel request, then SIGTERM the attempt: it reads the request to end cancelled."""
        if self.job_id is not None:
            try:
                self.store.request_cancel(self.job_id, self.cancel_reason)
            except Exception:  # the attempt then ends failed and retried, never left running
                log.exception("job %d: could not record the cancel request", self.job_id)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)


def run_job(
    store: Store,
    settings: Settings,
    job_id: int,
    *,
    runner: AttemptRunner | None = None,
    progress: Progress | None = None,
    wait_for_retries: bool = True,
) -> str:
    """Run attempts until the job succeeds, fails for good or is cancelled; return its status.

    With ``wait_for_retries=False`` a platform failure only schedules the automatic retry
    (``next_retry_at``) and returns; the server's scheduler loop starts it when it is due.
    """
    runner = runner or AttemptRunner(store, settings)
    while True:
        store.clear_job_error(job_id)
        store.clear_cancel_request(job_id)  # one made for an earlier run is not for this one
        store.update_job(job_id, next_retry_at=None)  # a retry that starts is no longer pending
        store.transition(job_id, "running", "attempt starting")
        end = runner.run(job_id, progress)
        status, delay = settle(store, settings, job_id, end)
        if status != "failed" or delay is None or not wait_for_retries:
            return status
        changed = wait_for_retry(store, runner, job_id, delay, progress)
        if changed is not None:
            return changed
        job = store.get_job(job_id)
        store.update_job(job_id, next_retry_at=None)
        try:
            store.transition(job_id, "queued", f"automatic retry {job.auto_retries if job else ''}")
        except IllegalTransitionError:  # cancelled elsewhere in the same moment
            return "cancelled"


def settle(store: Store, settings: Settings, job_id: int, end: AttemptEnd) -> tuple[str, float | None]:
    """Record how a running job's attempt ended: the job's new status, and for a failure the delay
    before its automatic retry (None: no retry)."""
    if end.status == "succeeded":
        store.transition(job_id, "succeeded", "all steps done")
        return "succeeded", None
    if end.status == "cancelled":
        store.transition(job_id, "cancelled", store.cancel_request(job_id) or CANCELLED_BY_USER)
        return "cancelled", None
    error = end.error or attempt_died(None)
    number = len(store.list_attempts(job_id))
    store.set_job_error(job_id, error, attempt=number)
    # The retry is decided while the job still shows running: a supervisor killed between the two
    # writes leaves it running, and the next one's recover_interrupted settles it again (spending one
    # more automatic retry), where the other order left it failed for good with no retry scheduled.
    delay = schedule_retry(store, settings, job_id, error)
    store.transition(job_id, "failed", f"{error.type}: {error.cause}")
    return "failed", delay


def recover_interrupted(store: Store, settings: Settings) -> list[int]:
    """Settle the jobs left "running" by a supervisor that is gone (``plugtune serve`` or ``run``
    killed, crashed, or the machine restarted); return their ids.

    A job with a live attempt process (in this store) is left alone: its supervisor lives, since
    attempts die with theirs. Otherwise its attempt is recorded as ended with the supervisor (an
    ``internal error``), and the job goes on as if its supervisor had seen that: a finished attempt
    succeeds the job, a failed one is retried automatically from the last checkpoint.

    A job an engine runs (TRL, verl: ``EngineRun``) has no supervisor here: it is left alone while
    its engine process lives, or when that process is on another host (a shared PostgreSQL store);
    one whose process on this host is gone failed with it, and is not retried (the engine's own
    launcher started it). A job that several processes record (verl's workers: its run key's
    members) is left alone while any of them lives or runs on another host, and fails once every
    one of them is gone without ending the run."""
    settled = []
    for job in store.list_jobs("running", limit=1000):
        if "engine" in job.spec:
            if _settle_engine_run(store, job):
                settled.append(job.id)
            continue
        if _attempt_alive(settings, job.id):
            continue
        attempts = store.list_attempts(job.id)
        last = attempts[-1] if attempts else None
        if last is not None and last.status == "running":
            store.end_attempt(job.id, last.number, "failed", supervisor_gone(last.number, last.pid))
            last = store.list_attempts(job.id)[-1]
        end = AttemptEnd(last.status, last.error) if last else AttemptEnd("failed", supervisor_gone(0, None))
        status, delay = settle(store, settings, job.id, end)
        when = f", automatic retry in {delay:g} s" if delay is not None else ""
        log.warning("job %d was left running by a stopped supervisor: now %s%s", job.id, status, when)
        settled.append(job.id)
    return settled


def settle_stopped_engine_runs(store: Store) -> list[int]:
    """Fail the running jobs of engine runs (a run key's worker processes: verl's) whose every
    member process is gone without leaving the run, as a running ``plugtune serve`` checks every
    ``Scheduler.ENGINE_RUNS_EVERY_S``; their ids. A job without member rows (one engine process:
    TRL) is settled when serve starts only (``recover_interrupted``)."""
    settled = []
    for job in store.list_jobs("running", limit=1000):
        if "engine" in job.spec and job.spec.get("run_key") and _settle_engine_run(store, job, True):
            settled.append(job.id)
    return settled


def _settle_engine_run(store: Store, job: Job, members_only: bool = False) -> bool:
    """Fail an engine's running job whose process on this host is gone; False: left alone.
    ``members_only``: judge a run by its member rows only (none: left alone)."""
    attempts = store.list_attempts(job.id)
    last = attempts[-1] if attempts else None
    run_key = str(job.spec.get("run_key") or "")
    members = store.engine_run_members(run_key) if run_key else []
    if members:  # the run's processes (the one that created the job may have ended before the others)
        if any(member_lives(m) is not False for m in members):
            return False  # one lives, or is on another machine, where nothing here can tell
        return _fail_engine_run(store, job, last, run_key, [m.pid for m in members])
    if members_only:
        return False
    if job.spec.get("engine_host", socket.gethostname()) != socket.gethostname():
        return False  # its process is on another machine: nothing here can tell whether it lives
    if last is not None and last.status == "running" and _process_since(last.pid, last.started_at):
        return False
    engine, pid = str(job.spec["engine"]), last.pid if last is not None else None
    error = job_error(
        ErrorType.UNKNOWN,
        "engine process stopped",
        f"the {engine} process that ran this job (pid {pid}) stopped without ending its run "
        "(killed, crashed, or the machine restarted); the training ended with it",
        {"pid": pid, "engine": engine},
        hint=(
            f"Look at the {engine} launcher's own output for why the process stopped (out of "
            "memory, a signal); plugtune did not see it end. Start the run again with the engine."
        ),
    )
    number = last.number if last is not None else 0
    if last is not None and last.status == "running":
        store.end_attempt(job.id, number, "failed", error)
    store.set_job_error(job.id, error, attempt=number)
    store.transition(job.id, "failed", f"{error.type}: {error.cause}")
    log.warning("job %d (%s run) lost its process %s: now failed", job.id, engine, pid)
    return True


def _fail_engine_run(store: Store, job: Job, last: Attempt | None, run_key: str, pids: list[int]) -> bool:
    """Fail the job of engine run ``run_key`` whose every member process (``pids``) is gone."""
    engine, listed = str(job.spec["engine"]), ", ".join(str(p) for p in pids)
    error = job_error(
        ErrorType.UNKNOWN,
        "engine run stopped",
        f"every {engine} process of run {run_key!r} that recorded this job (pids {listed}) stopped "
        "without ending the run (killed, crashed, or the machine restarted); the training ended "
        "with them",
        {"run_key": run_key, "pids": pids, "engine": engine},
        hint=(
            f"Look at the {engine} launcher's own output for why its workers stopped (out of memory, "
            "a signal); plugtune did not see the run end. Start the run again with a new run key."
        ),
    )
    number = last.number if last is not None else 0
    try:  # the status first: should its last process end the run in the same moment, keep that
        store.transition(job.id, "failed", f"{error.type}: {error.cause}")
    except IllegalTransitionError:
        return False
    if last is not None and last.status == "running":
        store.end_attempt(job.id, number, "failed", error)
    store.set_job_error(job.id, error, attempt=number)
    log.warning("job %d (%s run %r) lost every process (%s): now failed", job.id, engine, run_key, listed)
    return True


def _process_since(pid: int | None, started_at: float) -> bool:
    """A process ``pid`` lives that started by ``started_at`` (not a later one given its pid)."""
    if pid is None:
        return False
    try:
        return bool(psutil.Process(pid).create_time() <= started_at + 1.0)
    except psutil.Error:
        return False


def supervisor_gone(number: int, pid: int | None) -> ErrorRecord:
    """The attempt error when the process that supervised the attempt stopped while it ran."""
    return job_error(
        ErrorType.INTERNAL,
        "supervisor stopped",
        f"the plugtune process that ran attempt {number} (pid {pid}) stopped while it ran "
        "(killed, crashed, or the machine restarted); the attempt ended with it",
        {"pid": pid},
    )


def _attempt_alive(settings: Settings, job_id: int) -> bool:
    wanted = ["-m", "plugtune.jobs.attempt", str(job_id)]
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if (proc.info["cmdline"] or [])[-3:] != wanted:
                continue
            if proc.environ().get("PLUGTUNE_DATABASE_URL") == settings.database_url:
                return True
        except psutil.Error:
            continue
    return False


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when this process ends (Linux), so that no
    attempt runs on unsupervised after its supervisor was killed."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def die_with_parent() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent ended before the line above
            os._exit(1)

    return die_with_parent


def wait_for_retry(
    store: Store, runner: AttemptRunner, job_id: int, delay_s: float, progress: Progress | None = None
) -> str | None:
    """Wait ``delay_s`` for a failed job's automatic retry; None when it is due, else the job's new
    status: cancelled here (``runner.cancel()``, Ctrl-C), or cancelled or retried by hand elsewhere."""
    deadline = time.monotonic() + delay_s
    while not runner.cancel_requested.wait(max(0.0, min(POLL_S, deadline - time.monotonic()))):
        if progress is not None:
            progress(job_id)
        job = store.get_job(job_id)
        if job is None or job.status != "failed" or job.next_retry_at is None:
            return job.status if job else "failed"
        if time.monotonic() >= deadline:
            return None
    store.update_job(job_id, next_retry_at=None)
    try:
        store.transition(job_id, "cancelled", "cancelled while waiting for an automatic retry")
    except IllegalTransitionError:  # cancelled or retried elsewhere in the same moment
        job = store.get_job(job_id)
        return job.status if job else "cancelled"
    return "cancelled"


def schedule_retry(store: Store, settings: Settings, job_id: int, error: ErrorRecord) -> float | None:
    """Apply the retry policy to a failed job: the delay before its automatic retry, or None."""
    job = store.get_job(job_id)
    if job is None:
        return None
    retry = RetryPolicy.model_validate(job.spec.get("retry") or {})
    decision = decide(job_kind(error), job.auto_retries + 1, retry=retry)
    if isinstance(decision, RetryJobAfter):
        store.update_job(
            job_id, next_retry_at=time.time() + decision.delay_s, auto_retries=job.auto_retries + 1
        )
        return decision.delay_s
    store.update_job(job_id, next_retry_at=None)
    if isinstance(decision, Stop):
        path = bundle(store, settings, job_id)
        error = replace(
            error,
            message=f"{error.message} — {decision.reason}; support bundle: {path}",
            evidence={**error.evidence, "support_bundle": str(path)},
        )
        store.set_job_error(job_id, error, attempt=len(store.list_attempts(job_id)))
    return None


def bundle(store: Store, settings: Settings, job_id: int) -> Path:
    job = store.get_job(job_id)
    if job is None:
        raise LookupError(f"there is no job {job_id} to bundle")
    code = {p.code_hash: store.get_code(p.code_hash) for p in store.list_plugins(job_id) if p.code_hash}
    logs = [row.to_dict() for row in store.logs(job_id, limit=500)]
    return write_bundle(
        settings.home / "support",
        job=job.to_dict(),
        attempts=[a.to_dict() for a in store.list_attempts(job_id)],
        code=code,
        logs=logs,
    )


class JobNotFoundError(LookupError):
    """Raised when a command names a job id the store does not hold."""


class NotCancellableError(ValueError):
    """Raised when a job has nothing left to cancel: it ended and no automatic retry is pending."""


def require(store: Store, job_id: int) -> None:
    if store.get_job(job_id) is None:
        raise JobNotFoundError(
            f"there is no job {job_id} in {store.url}; `plugtune jobs list` shows the jobs"
        )


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
    ENGINE_RUNS_EVERY_S = 30.0  # how often an engine run whose every process is gone is failed

    def __init__(self, store: Store, settings: Settings, poll_s: float = 1.0, max_running: int = 1) -> None:
        if max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {max_running}")
        self.store, self.settings, self.poll_s, self.max_running = store, settings, poll_s, max_running
        self._purged_at = 0.0
        self._engine_runs_at = time.time()  # start() settles them first
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
        if now - self._engine_runs_at >= self.ENGINE_RUNS_EVERY_S:
            self._engine_runs_at = now
            settle_stopped_engine_runs(self.store)
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
