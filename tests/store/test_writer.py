from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from plugtune.errors import PlatformError
from plugtune.store import Store, StoreWriter
from plugtune.types import LogLine, MetricPoint, TrajectoryRecord

from .conftest import Target


def _line(i: int) -> LogLine:
    return LogLine(time=float(i), level="INFO", plugin="solve", message=f"line {i}")


def _trajectory(i: int) -> TrajectoryRecord:
    return TrajectoryRecord(
        trajectory_id=f"t{i}",
        group_id=f"g{i // 4}",
        step=0,
        sample_index=i // 4,
        rollout_index=i % 4,
        attempt=1,
        policy_version=0,
        prompt_ids=[1, 2],
        response_ids=[3],
        response_mask=[1],
        response_logprobs=[-0.5],
        messages=[{"role": "user", "content": f"q{i}"}],
    )


def _wait_for(predicate: object, timeout_s: float = 30.0) -> bool:
    """Poll until ``predicate()`` holds: a background thread's write, on a busy machine too."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def test_flush_writes_everything_added_in_one_go(store: Store, job_id: int) -> None:
    writer = StoreWriter(store, job_id, max_batch=10_000, interval_s=60)
    writer.add_logs(_line(i) for i in range(500))
    writer.add_metrics([MetricPoint(time=1.0, plugin="solve", name="cpu_percent", value=3.0)])
    writer.add_trajectories([_trajectory(0), _trajectory(1)])
    assert store.count_logs(job_id) == 0 and writer.pending == 503  # nothing written before a flush
    writer.flush()
    assert writer.pending == 0
    assert store.count_logs(job_id) == 500 and store.count_trajectories(job_id) == 2
    assert len(store.metrics(job_id, "solve")["cpu_percent"]) == 1
    writer.close()


def test_background_flush_by_size_and_by_interval(store: Store, job_id: int) -> None:
    with StoreWriter(store, job_id, max_batch=100, interval_s=60) as by_size:
        by_size.add_logs(_line(i) for i in range(100))
        assert _wait_for(lambda: store.count_logs(job_id) == 100)
    with StoreWriter(store, job_id, max_batch=10_000, interval_s=0.1) as by_time:
        by_time.add_log(_line(100))
        assert _wait_for(lambda: store.count_logs(job_id) == 101)


def test_write_soon_has_the_background_thread_write_without_the_caller_waiting(
    store: Store, job_id: int
) -> None:
    writer = StoreWriter(store, job_id, max_batch=10_000, interval_s=60)  # neither size nor time
    writer.add_trajectories([_trajectory(i) for i in range(3)])
    writer.write_soon()
    assert _wait_for(lambda: store.count_trajectories(job_id) == 3)
    writer.close()


def test_the_jobs_progress_is_written_after_its_batch_and_never_goes_back(store: Store, job_id: int) -> None:
    writer = StoreWriter(store, job_id, max_batch=10_000, interval_s=60)
    writer.add_trajectories([_trajectory(i) for i in range(3)])
    writer.set_steps_done(2)
    writer.set_steps_done(1)  # a late report of an earlier step
    assert store.get_job(job_id).steps_done == 0  # type: ignore[union-attr]  # nothing written yet
    writer.write_soon()
    assert _wait_for(lambda: store.get_job(job_id).steps_done == 2)  # type: ignore[union-attr]
    assert store.count_trajectories(job_id) == 3
    writer.close()


def test_close_flushes_what_is_left(store: Store, job_id: int) -> None:
    writer = StoreWriter(store, job_id, max_batch=10_000, interval_s=60)
    writer.add_trajectories([_trajectory(i) for i in range(10)])
    writer.close()
    assert store.count_trajectories(job_id) == 10


def test_retried_trajectories_through_the_writer_are_not_duplicated(store: Store, job_id: int) -> None:
    with StoreWriter(store, job_id) as writer:
        writer.add_trajectories([_trajectory(i) for i in range(8)])
        writer.flush()
        writer.add_trajectories([_trajectory(i) for i in range(4, 12)])  # attempt 2 redoes 4..7
    assert store.count_trajectories(job_id) == 12


def test_a_failed_write_keeps_the_items_and_raises(store: Store) -> None:
    writer = StoreWriter(store, 424242, max_batch=10_000, interval_s=60)  # no such job: the write fails
    writer.add_logs([_line(1), _line(2)])
    with pytest.raises(PlatformError, match="database error while writing a batch"):
        writer.flush()
    assert writer.pending == 2
    with pytest.raises(PlatformError):
        writer.close()


CHILD = """
import sys
from plugtune.store import Store, StoreWriter
from plugtune.types import LogLine
url, schema, job_id = sys.argv[1], sys.argv[2] or None, int(sys.argv[3])
store = Store.open(url, schema=schema)
writer = StoreWriter(store, job_id, max_batch=40, interval_s=0.01)
for i in range(1_000_000):
    writer.add_log(LogLine(time=float(i), level="INFO", plugin="solve", message=f"line {i}"))
    if i % 25 == 24:
        writer.flush()
        print(f"ACK {i}", flush=True)
"""


def test_kill_9_loses_nothing_acknowledged(target: Target, store: Store, job_id: int) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, target.url, target.schema or "", str(job_id)],
        stdout=subprocess.PIPE,
        text=True,
    )
    acked = -1
    try:
        assert child.stdout is not None
        deadline = time.monotonic() + 60  # the child imports plugtune first: slow on a busy machine
        while acked < 400 and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            acked = int(line.split()[1])
        os.kill(child.pid, signal.SIGKILL)  # mid-batch: more lines were added after this ACK
    finally:
        child.kill()
        child.wait(timeout=10)
    assert acked >= 400, "the child process never acknowledged its writes"

    reopened = target.open()
    messages = [r.message for r in reopened.logs(job_id, limit=1000)]
    before = None
    rows: list[str] = []
    for _ in range(10_000):  # bounded walk over every page
        page = reopened.logs(job_id, limit=1000, before_id=before)
        if not page:
            break
        rows += [r.message for r in page]
        before = page[-1].id
    reopened.close()
    written = {int(m.split()[1]) for m in rows}
    assert messages and len(written) == len(rows), "no line is written twice"
    assert set(range(acked + 1)) <= written, "every acknowledged line survived the kill"
