"""``EngineRun``: an external engine's training run (TRL, verl, ...) recorded as a plugtune job.

An engine adapter opens one ``EngineRun`` per training run. It deploys the job's plugins to the
function runtime (a ``LocalRuntime`` on an event loop of its own, in a background thread, so any
engine thread may call it), calls them under the job's ``failure_policy`` and writes what the
console shows: the job and its attempt, the plugins and the exact code that ran, trajectories,
training metrics, plugin logs and resource metrics, and the one classified error a failed run
ends with. Nothing here imports an engine.

    run = EngineRun.open("job.yaml", engine="trl")      # or graders=["grader.py:score"]
    outcome = run.call(run.graders[0], ctx, sample, trajectory)   # blocking, any thread
    future = run.submit(run.rollout, ctx, policy, sample)         # concurrent.futures.Future
    futures = run.submit_all([(fn, ctx, args), ...])             # many at once
    run.add_trajectories(records); run.add_metrics(step, {"reward/mean": 0.5}); run.flush(step)
    run.close()                       # succeeded; run.close(error) records the failure

A call that fails raises ``PluginCallError`` when the policy drops the sample (the adapter scores
it ``None`` / masks it), and ``PluginCallError`` too, after ``fail()`` recorded it, when the policy
fails the job (``run.stopped`` then holds the error). ``flush(step)`` applies the job's
``circuit_breaker`` to the step's calls as a native job does: when most of them failed it fails
the run and raises the classified error (cause: the dominant one). Under ``plugtune run`` (``trainer:`` an
engine) the attempt process owns the job's lifecycle: pass ``job_id=`` and ``close()`` leaves
the job's status to the attempt.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import dataclasses
import functools
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from plugtune.errors import PluginCallError
from plugtune.jobs.caller import JobStop, PolicyCaller, StepCounts
from plugtune.jobs.classify import classify
from plugtune.jobs.engine_members import stopped_members, this_process
from plugtune.jobs.plugins import Drain, JobFunction, deploy_all, record_deployed
from plugtune.jobs.report import JOB_WARNINGS
from plugtune.runtime.runtime import BaseRuntime, LocalRuntime
from plugtune.sdk import Context, Kind
from plugtune.spec.models import CircuitBreaker, FailurePolicy
from plugtune.spec.validation import ValidatedJob, refuse_tasks, validate_job
from plugtune.store import Store, StoreWriter
from plugtune.store.engine_runs import EngineMember
from plugtune.types import CallOutcome, LogLine, MetricPoint, TrajectoryRecord

if TYPE_CHECKING:
    from plugtune.trainer.tracking import Trackers

log = logging.getLogger(__name__)

T = TypeVar("T")

CANCEL_CHECK_S = 1.0  # how often cancel_requested() reads the job's status


class EngineRun:
    """One engine run as a plugtune job: deployed plugins, the failure policy, the store."""

    def __init__(
        self,
        store: Store,
        job_id: int,
        functions: list[JobFunction],
        *,
        job: ValidatedJob | None,
        failure_policy: FailurePolicy,
        loop: asyncio.AbstractEventLoop,
        runtime: BaseRuntime,
        owns_job: bool,
        attempt: int,
        run_key: str = "",
        member: EngineMember | None = None,
    ) -> None:
        self.store, self.job_id, self.job, self.functions = store, job_id, job, functions
        self.caller = PolicyCaller(failure_policy)
        self.hashes = {jf.spec.name: jf.fn.code_hash for jf in functions}
        self.stopped: PluginCallError | None = None
        self._tasks: set[asyncio.Task[CallOutcome]] = set()
        self._failure: tuple[BaseException, str] | None = None
        self._loop, self._runtime = loop, runtime
        self._owns_job, self._attempt, self.run_key = owns_job, attempt, run_key
        self._member = member  # this process in the engine run's members (run_key)
        self._drain = Drain(functions)
        # an engine run's processes each report their progress: steps_done only moves forward
        self._writer = StoreWriter(store, job_id, steps_forward_only=bool(run_key))
        self._closed = False
        self._cancelled, self._cancel_checked = False, 0.0
        self._steps_total = job.spec.hyperparameters.steps if job is not None else 0
        self.trackers: Trackers | None = None  # when set, training and plugin metrics go there too
        from plugtune.trainer.health import SignalMonitor

        # the reward-signal checks, from the trajectories the engine records (job.yaml's signal:)
        self.monitor = SignalMonitor(
            job.spec.signal.thresholds() if job is not None else None, self._steps_total
        )
        self._warned: set[str] = set()  # warning keys shown this run
        atexit.register(self.close)  # a run whose engine never said it ended still ends in the store

    @property
    def rollout(self) -> JobFunction | None:
        found = [jf for jf in self.functions if jf.spec.kind is Kind.ROLLOUT]
        return found[0] if found else None

    @property
    def graders(self) -> list[JobFunction]:
        return [jf for jf in self.functions if jf.spec.kind is Kind.GRADER]

    @property
    def group_graders(self) -> list[JobFunction]:
        return [jf for jf in self.functions if jf.spec.kind is Kind.GROUP_GRADER]

    @classmethod
    def open(
        cls,
        job: ValidatedJob | str | Path | None = None,
        *,
        engine: str,
        graders: Sequence[str] = (),
        failure_policy: FailurePolicy | None = None,
        store: Store | None = None,
        job_id: int | None = None,
        name: str = "",
        run_key: str = "",
    ) -> EngineRun:
        """Deploy the plugins of ``job`` (a job.yaml or a validated job), or only ``graders``
        (``file.py:function`` entries), and record the run in ``store`` (default: the store
        ``plugtune serve`` reads). ``job_id``: the job already exists (``plugtune run``).
        ``run_key``: the engine's run, whose processes (verl's workers) each open an ``EngineRun``:
        the first creates the job, the others join it, and the last one to close ends it."""
        validated = validate_job(job) if isinstance(job, (str, Path)) else job
        if validated is not None:
            refuse_tasks(validated, engine)  # an engine scores every row with one plugin set
        if validated is None and not graders:
            raise ValueError("EngineRun.open needs a job.yaml or at least one grader entry")
        policy = failure_policy or (validated.spec.failure_policy if validated else FailurePolicy())
        store = store or Store.open()
        owns_job, created = job_id is None, job_id is None
        member = this_process() if job_id is None and run_key else None
        if member is not None:
            job_id, created = _join_job(store, validated, graders, engine, name, run_key, member)
        elif job_id is None:
            job_id = _create_job(store, validated, graders, engine, name)
        loop = _loop_thread()
        runtime = LocalRuntime()
        try:
            functions = _run(loop, _deploy(runtime, validated, graders))
        except BaseException as exc:
            _run(loop, runtime.close())
            loop.call_soon_threadsafe(loop.stop)
            if owns_job:
                if member is not None:
                    store.leave_engine_run(run_key, member)
                _end_job(store, job_id, _attempt_of(store, job_id, created), exc)
            raise
        if created or not run_key:
            record_deployed(store, job_id, functions)
        attempt = store.start_attempt(job_id, os.getpid()) if created else 0
        return cls(
            store,
            job_id,
            functions,
            job=validated,
            failure_policy=policy,
            loop=loop,
            runtime=runtime,
            owns_job=owns_job,
            attempt=attempt,
            run_key=run_key,
            member=member,
        )

    # --- calling plugins -------------------------------------------------------------------

    def submit(self, fn: JobFunction, ctx: Context, *args: Any) -> concurrent.futures.Future[CallOutcome]:
        """Start a call on the run's loop; the future raises as :meth:`call` does."""
        return asyncio.run_coroutine_threadsafe(self._call(fn, ctx, *args), self._loop)

    def submit_all(
        self, calls: Sequence[tuple[JobFunction, Context, tuple[Any, ...]]]
    ) -> list[concurrent.futures.Future[CallOutcome]]:
        """Start many calls on the run's loop at once (one wake-up of the loop, not one per call);
        each future raises as :meth:`call` does."""
        futures: list[concurrent.futures.Future[CallOutcome]] = [concurrent.futures.Future() for _ in calls]

        def start() -> None:
            for future, (fn, ctx, args) in zip(futures, calls, strict=True):
                if future.set_running_or_notify_cancel():
                    task = self._loop.create_task(self._call(fn, ctx, *args))
                    self._tasks.add(task)  # the loop keeps only weak references to tasks
                    task.add_done_callback(functools.partial(self._settle, future))

        self._loop.call_soon_threadsafe(start)
        return futures

    def _settle(
        self, future: concurrent.futures.Future[CallOutcome], task: asyncio.Task[CallOutcome]
    ) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            future.set_exception(concurrent.futures.CancelledError())
        elif (exc := task.exception()) is not None:
            future.set_exception(exc)
        else:
            future.set_result(task.result())

    def call(self, fn: JobFunction, ctx: Context, *args: Any) -> CallOutcome:
        """Call a plugin under the failure policy and wait (from any thread but the run's loop)."""
        return self.submit(fn, ctx, *args).result()

    def run_coroutine(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the run's loop (where the runtime lives) and wait for its result."""
        return _run(self._loop, coro)

    async def _call(self, fn: JobFunction, ctx: Context, *args: Any) -> CallOutcome:
        if not ctx.job_id or ctx.plugin != fn.spec.name:  # (a caller may have set both: no copy)
            ctx = dataclasses.replace(ctx, job_id=ctx.job_id or str(self.job_id), plugin=fn.spec.name)
        try:
            return await self.caller(fn, ctx, *args)
        except JobStop as stop:
            self.fail(stop.error, reason=stop.reason)
            raise stop.error from stop

    # --- recording -------------------------------------------------------------------------

    def add_trajectories(self, records: Sequence[TrajectoryRecord]) -> None:
        hashes = self.hashes  # a record built with them needs no copy
        self._writer.add_trajectories(
            r if r.code_hash == hashes else dataclasses.replace(r, code_hash=hashes) for r in records
        )

    def add_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """Training metrics of ``step`` (names as the console's curves: ``reward/mean``, ``loss``...)."""
        now = time.time()
        self._writer.add_metrics(
            MetricPoint(now, "", name, float(v), step=step) for name, v in metrics.items() if _finite(v)
        )
        if self.trackers is not None:
            self.trackers.log(step, {name: float(v) for name, v in metrics.items() if _finite(v)})

    def flush(self, step: int | None = None, *, durable: bool = True) -> None:
        """Write plugin logs and resource metrics so far (and ``step``'s call counts); durable on
        return, or with ``durable=False`` left to the store writer's thread, which writes what is
        pending every ``interval_s`` (1 s): a TRL step neither waits for the store nor pays for a
        write of its own while the next step computes (a write per 60 ms step of the demo task
        took its thread ~4 ms of CPU and slowed the step's torch work by as much); a checkpoint
        and the run's end wait. With ``step``, the circuit breaker may then fail the run (raises
        its error)."""
        counts = None
        if step is not None:
            counts = self._write_counts(step)
            self._writer.set_steps_done(step)
        logs, points = self._drain.take()
        self._writer.add_logs(logs)
        self._writer.add_metrics(points)
        if durable:
            self._writer.flush()
        if counts is not None:
            self._check_breaker(counts)

    def expect_steps(self, total: int) -> None:
        """The engine's own step count (TRL's ``max_steps``), for a run without a job.yaml (which
        would have given it): the job shows steps done out of it, not out of 0."""
        if self.job is None and total > 0 and not self._steps_total:
            self._steps_total = total
            self.monitor.steps = total
            self.store.update_job(self.job_id, steps_total=total)

    def set_steps(self, total: int) -> None:
        """The engine's own step count where it knows the run's length better than job.yaml
        (verl's total_training_steps): the job shows steps done out of it, and the signal checks'
        window knows the run's end."""
        if total > 0 and total != self._steps_total:
            self._steps_total = total
            self.monitor.steps = total
            self.store.update_job(self.job_id, steps_total=total)

    def add_signal(
        self,
        step: int,
        records: Sequence[TrajectoryRecord],
        weights: dict[str, float],
        max_new_tokens: int | None = None,
    ) -> None:
        """The reward-signal checks on ``step``'s recorded trajectories: their metrics
        (``grader/<name>/unscorable_share``, ``reward/at_ceiling_share``...) and each kind of warning
        once per run, in the job's warnings (log, ``jobs show``, API, job page). With
        ``max_new_tokens`` (records whose ``advantage`` says which trained: verl's), the zero-variance
        and truncation shares and their warnings too."""
        if max_new_tokens is None:
            metrics, warnings = self.monitor.observe(step, records, weights)
        else:
            from plugtune.trainer.health import signal_metrics

            signal = self.monitor.measure(step, records, weights)
            metrics = signal_metrics(signal)
            metrics["groups/zero_variance_share"] = signal.zero_variance_share
            metrics["response/truncated_share"] = signal.truncated_share
            warnings = self.monitor.warnings(signal, max_new_tokens)
        self.add_metrics(step, metrics)
        fresh = [w for w in warnings if w.key not in self._warned]
        self._warned.update(w.key for w in fresh)
        for w in fresh:
            log.warning("job %d: %s", self.job_id, w.message)
        self._writer.add_logs(
            [LogLine(time.time(), "WARNING", JOB_WARNINGS, w.message, source="trainer") for w in fresh]
        )

    def _write_counts(self, step: int) -> StepCounts:
        """``step``'s call counts and ``ctx.metric`` aggregates (and any earlier step's left)."""
        counts = self.caller.take_counts(step)
        self._writer.add_metrics(counts.metric_points(step))
        if self.trackers is not None and counts.plugin_metrics.by_plugin:
            self.trackers.log(step, counts.plugin_metrics.flat())
        return counts

    def cancel_requested(self) -> bool:
        """Whether the job was cancelled in the console (``plugtune jobs cancel``): looked up in the
        store at most once every ``CANCEL_CHECK_S``; the engine then stops its run."""
        now = time.monotonic()
        if not self._cancelled and now - self._cancel_checked >= CANCEL_CHECK_S:
            self._cancel_checked = now
            job = self.store.get_job(self.job_id)
            self._cancelled = job is not None and job.status == "cancelled"
        return self._cancelled

    def _check_breaker(self, counts: StepCounts) -> None:
        config = self.job.spec.circuit_breaker if self.job is not None else CircuitBreaker()
        error = counts.breaker_error(config)
        if error is not None:
            self.fail(error, reason="circuit breaker")
            raise error

    def fail(self, error: BaseException, *, reason: str = "") -> None:
        """Record ``error`` as the way this run ends (the first one recorded wins)."""
        if self._failure is not None:
            return
        if isinstance(error, PluginCallError):
            self.stopped = error
            self.store.set_plugin_status(self.job_id, error.plugin, "failed", failure_reason=str(error))
        self._failure = (error, reason)

    def close(self, error: BaseException | None = None) -> None:
        """End the run: flush (the call counts and ``ctx.metric`` values of steps not flushed yet
        too), stop the plugins, and (when this run created the job) end it in the store as
        succeeded, or failed with ``error`` / the error ``fail()`` recorded."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        if error is not None:
            self.fail(error)
        failure = self._failure
        try:
            for jf in self.functions:
                jf.fn.flush_metrics()
            for step in self.caller.pending_steps():  # the last step's counts and ctx.metric values
                self._write_counts(step)
            self.flush()
            for jf in self.functions:
                if self.stopped is None or jf.spec.name != self.stopped.plugin:
                    self.store.set_plugin_status(self.job_id, jf.spec.name, "completed")
        finally:
            self._writer.close()
            _run(self._loop, self._runtime.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._owns_job:
            exc, reason = failure if failure is not None else (None, "")
            others = self._leave() if self.run_key else 0
            if exc is None and others:  # the run's other processes go on: the last one ends it
                return
            done = self.store.get_job(self.job_id)
            if exc is None and not self._steps_total and done is not None and done.steps_done:
                self.store.update_job(self.job_id, steps_total=done.steps_done)  # all it was to run
            attempt = self._attempt or _attempt_of(self.store, self.job_id)
            _end_job(self.store, self.job_id, attempt, exc, reason)

    def _leave(self) -> int:
        """Count this process out of its engine run: how many members are left to end it. Members
        of this host whose processes stopped without leaving (SIGKILL: no exit hooks) are counted
        out too, so that the last live one still ends the job; 0: this process ends it."""
        left = self.store.leave_engine_run(self.run_key, self._member)
        if not left or self._member is None:
            return left
        gone = stopped_members(self.store.engine_run_members(self.run_key))
        if not gone:
            return left
        after = self.store.drop_engine_run_members(self.run_key, gone)
        pids = ", ".join(str(m.pid) for m in gone)
        log.warning(
            "job %d: engine run %r lost process(es) %s without them leaving it (killed?)",
            self.job_id,
            self.run_key,
            pids,
        )
        return left if after is None else after  # None: another leaving process counted them out


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _create_job(
    store: Store, job: ValidatedJob | None, graders: Sequence[str], engine: str, name: str
) -> int:
    # the engine's process runs the job (its attempt's pid), on this host: ``plugtune serve``
    # started meanwhile leaves it alone while it lives (scheduler.recover_interrupted)
    owner = {"engine": engine, "engine_host": socket.gethostname()}
    if job is not None:
        text = job.job_file.read_text(errors="replace")
        spec = {"job_file": str(job.job_file), **job.spec.model_dump(mode="json"), **owner}
        job_id = store.create_job(name or job.spec.name, spec, spec_yaml=text)
        store.update_job(job_id, steps_total=job.spec.hyperparameters.steps)
    else:
        job_id = store.create_job(name or f"{engine}-run", {**owner, "graders": list(graders)})
    store.transition(job_id, "running", f"{engine} run started")
    return job_id


def _join_job(
    store: Store,
    job: ValidatedJob | None,
    graders: Sequence[str],
    engine: str,
    name: str,
    run_key: str,
    member: EngineMember,
) -> tuple[int, bool]:
    """The job of the engine run ``run_key`` (created by its first process); (job id, created)."""
    owner = {"engine": engine, "engine_host": socket.gethostname(), "run_key": run_key}
    if job is not None:
        text = job.job_file.read_text(errors="replace")
        spec = {"job_file": str(job.job_file), **job.spec.model_dump(mode="json"), **owner}
        job_id, created = store.join_engine_run(
            run_key, name or job.spec.name, spec, spec_yaml=text, member=member
        )
    else:
        spec = {**owner, "graders": list(graders)}
        job_id, created = store.join_engine_run(run_key, name or f"{engine}-run", spec, member=member)
    if created:
        if job is not None:
            store.update_job(job_id, steps_total=job.spec.hyperparameters.steps)
        store.transition(job_id, "running", f"{engine} run started (run key {run_key})")
        return job_id, True
    found = store.get_job(job_id)
    if found is not None and found.status not in ("queued", "running"):
        store.leave_engine_run(run_key, member)
        raise ValueError(
            f"the {engine} run key {run_key!r} names job {job_id}, which has already ended "
            f"({found.status}): a new run needs a new key (PLUGTUNE_RUN, or the run= setting)"
        )
    return job_id, False


def _attempt_of(store: Store, job_id: int, start: bool = False) -> int:
    """The job's latest attempt (a process that joined an engine run ends the creator's)."""
    attempts = store.list_attempts(job_id)
    if start or not attempts:
        return store.start_attempt(job_id, os.getpid())
    return attempts[-1].number


def _end_job(store: Store, job_id: int, attempt: int, error: BaseException | None, reason: str = "") -> None:
    job = store.get_job(job_id)
    status = job.status if job is not None else "running"
    if status != "running":  # cancelled in the console, or settled as lost meanwhile: keep that
        log.warning("job %d is %s: the engine's run ended without changing it", job_id, status)
        if store.list_attempts(job_id)[-1].status == "running":
            store.end_attempt(job_id, attempt, "cancelled" if status == "cancelled" else "failed")
        return
    if error is None:
        store.end_attempt(job_id, attempt, "succeeded")
        store.transition(job_id, "succeeded", "the engine's run ended")
        return
    doc = classify(error, evidence={"decision": reason} if reason else None)
    store.end_attempt(job_id, attempt, "failed", doc)
    store.set_job_error(job_id, doc, attempt=attempt)
    store.transition(job_id, "failed", f"{doc.type}: {doc.cause}")


async def _deploy(rt: BaseRuntime, job: ValidatedJob | None, graders: Sequence[str]) -> list[JobFunction]:
    await rt.start()
    functions = await deploy_all(rt, job) if job is not None else []
    for entry in graders:
        functions.append(JobFunction(await rt.deploy(entry), None))
    return functions


def _loop_thread() -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="plugtune-engine-run", daemon=True).start()
    return loop


def _run(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run_coroutine_threadsafe(coro, loop).result()
