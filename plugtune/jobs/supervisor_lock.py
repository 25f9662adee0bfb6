"""One supervisor of a home's jobs at a time: ``plugtune serve`` or ``plugtune run``, never both.

A server's scheduler starts every queued job and every due automatic retry of its store, so a
``plugtune run`` beside it would race it for its own job (two attempts of one job). The server
holds an exclusive ``flock`` on ``$PLUGTUNE_HOME/supervisor.lock`` while its scheduler runs; each
``run`` (and ``demo``) holds a shared one while it supervises its job. The kernel drops a lock with
its process, so a crashed or killed server never blocks anything (serve.json, its address, may be
left behind; it is never what decides). ``/proc/locks`` names the holder.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from plugtune.home import private_dir, private_file
from plugtune.jobs.remote import read_serve

LOCK_FILE = "supervisor.lock"
WAIT_S = 0.5


class StoreServedError(Exception):
    """``plugtune run`` on a home whose ``plugtune serve`` runs the queue; the message says which
    server and what to do."""


def _open(home: Path) -> int:
    path = private_file(private_dir(home) / LOCK_FILE)
    return os.open(path, os.O_RDWR | os.O_CLOEXEC)


def holders(home: Path, *, exclusive: bool) -> list[int]:
    """The pids holding the home's lock (exclusive: the server; shared: runs), from /proc/locks."""
    try:
        info = (home / LOCK_FILE).stat()
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    inode, kind = f":{info.st_ino}", "WRITE" if exclusive else "READ"
    pids = []
    for line in lines:
        fields = line.split()
        if "->" in fields:  # a waiter, not a holder
            continue
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[3] == kind and fields[5].endswith(inode):
            pids.append(int(fields[4]))
    return sorted(set(pids))


@contextmanager
def running_alone(home: Path) -> Iterator[None]:
    """Supervise a job here (``plugtune run``, ``demo``) while no ``plugtune serve`` runs this home's
    queue; raises :class:`StoreServedError` when one does."""
    fd = _open(home)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreServedError(served_message(home)) from None
    try:
        yield
    finally:
        os.close(fd)


def served_message(home: Path) -> str:
    pids = holders(home, exclusive=True)
    record = read_serve(home)
    url = record.get("url") if record.get("pid") in pids else None
    who = f"pid {pids[0]}" if pids else "pid unknown"
    where = f", {url}" if isinstance(url, str) else ""
    return (
        f"a plugtune serve ({who}{where}) is serving this store ({home}): its scheduler runs this "
        "store's queued jobs, so running one here too would race it for the job. Submit the job to "
        "it with `plugtune submit JOB.yaml`, or stop that server first"
    )


class ServeLock:
    """A server's hold on its home: its scheduler runs only while this process holds the lock."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.fd = _open(home)
        self._stop = threading.Event()
        self._waiter: threading.Thread | None = None
        self.started = threading.Event()

    def take(self) -> bool:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def start(self, start_scheduler: Callable[[], None]) -> list[int]:
        """Start the scheduler now when no run supervises a job of this home; otherwise return the
        runs' pids and start it, on a thread, as soon as they end."""
        if self.take():
            start_scheduler()
            self.started.set()
            return []
        runs = holders(self.home, exclusive=False)
        self._waiter = threading.Thread(
            target=self._wait, args=(start_scheduler,), name="plugtune-serve-lock", daemon=True
        )
        self._waiter.start()
        return runs

    def _wait(self, start_scheduler: Callable[[], None]) -> None:
        while not self._stop.is_set():
            if self.take():
                if not self._stop.is_set():
                    start_scheduler()
                    self.started.set()
                return
            time.sleep(WAIT_S)

    def close(self, stop_scheduler: Callable[[], None]) -> None:
        """Stop waiting, stop the scheduler if it started, then let the lock go (it also goes with
        the process, however that ends)."""
        self._stop.set()
        if self._waiter is not None:
            self._waiter.join(timeout=10)
        try:
            if self.started.is_set():
                stop_scheduler()
        finally:
            os.close(self.fd)
