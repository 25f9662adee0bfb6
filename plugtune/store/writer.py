"""Batched writes from a running job: log lines, metric points, trajectories and its progress
(``steps_done``, written after the batch it follows).

``add_*`` only appends to memory and never touches the database, so a producer (the runtime's
log pump, the trainer) is never slowed by a write. A background thread writes everything
pending in one transaction when ``max_batch`` items are waiting or every ``interval_s``.

**Acknowledged** means: ``flush()`` (or ``close()``) returned without raising. Everything added
before that call is then committed and fsynced, and survives a crash of the process (kill -9)
or of the machine. Items added but not yet acknowledged may be lost in a crash; nothing
acknowledged is. If a write fails, the items stay pending and are retried on the next flush;
``flush()`` raises the :class:`PlatformError`.

Thread-safe: any number of threads may add; flushes are serialised.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from plugtune.errors import PlatformError
from plugtune.store.store import Store
from plugtune.types import LogLine, MetricPoint, TrajectoryRecord

log = logging.getLogger(__name__)


class _Pending:
    def __init__(self) -> None:
        self.logs: list[LogLine] = []
        self.metrics: list[MetricPoint] = []
        self.trajectories: list[TrajectoryRecord] = []
        self.steps_done: int | None = None  # the job's progress, written after the batch

    def __len__(self) -> int:
        return len(self.logs) + len(self.metrics) + len(self.trajectories) + (self.steps_done is not None)

    def put_back(self, newer: _Pending) -> None:
        self.logs.extend(newer.logs)
        self.metrics.extend(newer.metrics)
        self.trajectories.extend(newer.trajectories)
        if newer.steps_done is not None:
            self.steps_done = max(self.steps_done or 0, newer.steps_done)


class StoreWriter:
    """Buffers one job's monitoring data and writes it in batches (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        job_id: int,
        *,
        max_batch: int = 2000,
        interval_s: float = 1.0,
        max_pending: int = 500_000,
        steps_forward_only: bool = False,
    ) -> None:
        """``steps_forward_only``: other processes write this job's progress too (an engine run's
        workers): ``steps_done`` is only ever raised, never set lower than what one of them wrote."""
        if max_batch < 1 or interval_s <= 0 or max_pending < max_batch:
            raise ValueError("StoreWriter needs max_batch >= 1, interval_s > 0 and max_pending >= max_batch")
        self._store = store
        self._job_id = job_id
        self._max_batch = max_batch
        self._interval_s = interval_s
        self._max_pending = max_pending
        self._steps_forward_only = steps_forward_only
        self._pending = _Pending()
        self._lock = threading.Lock()  # guards _pending
        self._flush_lock = threading.Lock()  # one write at a time, in order
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._last_error: PlatformError | None = None
        self._thread = threading.Thread(target=self._run, name=f"store-writer-{job_id}", daemon=True)
        self._thread.start()

    def add_log(self, line: LogLine) -> None:
        self.add_logs((line,))

    def add_logs(self, lines: Iterable[LogLine]) -> None:
        with self._lock:
            self._pending.logs.extend(lines)
        self._after_add()

    def add_metrics(self, points: Iterable[MetricPoint]) -> None:
        with self._lock:
            self._pending.metrics.extend(points)
        self._after_add()

    def add_trajectories(self, records: Iterable[TrajectoryRecord]) -> None:
        """Queue trajectories; a trajectory_id already stored (a retried attempt) is replaced."""
        with self._lock:
            self._pending.trajectories.extend(records)
        self._after_add()

    def set_steps_done(self, step: int) -> None:
        """Record the job's progress (``steps_done``) with the next write, after its batch."""
        with self._lock:
            self._pending.steps_done = max(self._pending.steps_done or 0, step)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def flush(self) -> None:
        """Write everything added so far; return only when it is durable (acknowledged)."""
        with self._flush_lock:
            with self._lock:
                batch, self._pending = self._pending, _Pending()
            if not len(batch):
                return
            try:
                self._store.write_batch(
                    self._job_id, logs=batch.logs, metrics=batch.metrics, trajectories=batch.trajectories
                )
                # Written: should the progress fail below, only the progress stays pending.
                batch.logs, batch.metrics, batch.trajectories = [], [], []
                if batch.steps_done is not None and self._steps_forward_only:
                    self._store.advance_steps_done(self._job_id, batch.steps_done)
                elif batch.steps_done is not None:
                    self._store.update_job(self._job_id, steps_done=batch.steps_done)
            except PlatformError as e:
                with self._lock:
                    batch.put_back(self._pending)
                    self._pending = batch
                self._last_error = e
                raise
            self._last_error = None

    def write_soon(self) -> None:
        """Have the background thread write what is pending now, without waiting for it."""
        self._wake.set()

    def close(self) -> None:
        """Stop the background thread and flush what is left (raises if that write fails)."""
        self._closed.set()
        self._wake.set()
        self._thread.join(timeout=60)
        self.flush()

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _after_add(self) -> None:
        size = self.pending
        if size > self._max_pending and self._last_error is not None:
            raise PlatformError(
                f"{size} log lines, metric points and trajectories of job {self._job_id} are waiting "
                f"because the store cannot write them: {self._last_error.message}",
                hint=self._last_error.hint,
            )
        if size >= self._max_batch:
            self._wake.set()

    def _run(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(self._interval_s)
            self._wake.clear()
            if self._closed.is_set():
                return
            try:
                self.flush()
            except PlatformError as e:
                log.warning("store writer for job %s could not write; will retry: %s", self._job_id, e)
