from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from plugtune.store import Store, StoreWriter
from plugtune.types import LogLine

from .conftest import Target

CHILD = """
import sys
from plugtune.store import Store, StoreWriter
from plugtune.types import LogLine
url, schema, name = sys.argv[1], sys.argv[2] or None, sys.argv[3]
store = Store.open(url, schema=schema)          # the database may not exist yet: both create it
job_id = store.create_job(name, {})
store.transition(job_id, "running", "started")
with StoreWriter(store, job_id, max_batch=7, interval_s=0.01) as writer:
    for i in range(300):
        writer.add_log(LogLine(time=float(i), level="INFO", plugin=name, message=f"{name} {i}"))
        if i % 10 == 9:
            writer.flush()
            store.update_job(job_id, steps_done=i)
store.transition(job_id, "succeeded", "done")
"""


def test_two_processes_create_and_write_one_database_at_once(fresh_target: Target) -> None:
    target = fresh_target
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, target.url, target.schema or "", name],
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("alpha", "beta")
    ]
    for child in children:
        _, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
    store = target.open()
    try:
        jobs = store.list_jobs()
        assert sorted(j.name for j in jobs) == ["alpha", "beta"]
        for job in jobs:
            assert (job.status, job.steps_done) == ("succeeded", 299)
            assert store.count_logs(job.id) == 300 == store.count_logs(job.id, plugin=job.name)
    finally:
        store.close()


def test_threads_share_one_store(store: Store) -> None:
    job_ids = [store.create_job(f"j{k}", {}) for k in range(4)]
    errors: list[BaseException] = []

    def work(job_id: int) -> None:
        try:
            with StoreWriter(store, job_id, max_batch=13, interval_s=0.01) as writer:
                for i in range(200):
                    writer.add_log(LogLine(time=float(i), level="INFO", plugin="p", message=str(i)))
                    if i % 50 == 0:
                        store.logs(job_id, limit=5)
        except BaseException as e:  # noqa: BLE001 - surfaced below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(j,)) for j in job_ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert [store.count_logs(j) for j in job_ids] == [200] * 4


RACE = """
import sys
from plugtune.store.database import Database, normalize_url
folder = sys.argv[1]
for line in sys.stdin:  # the parent's barrier: one line per fresh file, sent to both at once
    db = Database(normalize_url(f"sqlite:///{folder}/{line.strip()}.db"))
    db.create_schema()
    db.close()
    print("done", flush=True)
"""


def test_processes_creating_fresh_sqlite_files_in_lockstep_never_see_locked(tmp_path: Path) -> None:
    # Switching a fresh file to WAL from two processes at once deadlocks their read locks, and
    # SQLite answers one "database is locked" at once, without waiting its busy timeout: before the
    # switch was retried, about one create in eight failed here.
    children = [
        subprocess.Popen(
            [sys.executable, "-c", RACE, str(tmp_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        for i in range(60):
            for child in children:
                assert child.stdin is not None
                child.stdin.write(f"{i}\n")
                child.stdin.flush()
            answers = [child.stdout.readline() if child.stdout else "" for child in children]
            if answers != ["done\n", "done\n"]:  # a child died: its error is asserted below
                break
    finally:
        for child in children:
            _, err = child.communicate(timeout=60)
            assert child.returncode == 0, err
