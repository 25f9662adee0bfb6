"""The chaos suite's graders: each call does what its sample's ``extra["fault"]`` says, or returns
``extra["reward"]`` when it names no fault, so the expected answer of every call is known.

``max_concurrency=1``: a fault that ends an instance ends only the call that caused it.
``timeout_s=6``: a memory bomb or fork bomb reaches its limit well inside it even on a loaded host
(at 3 s, a long run on a 2-core machine at load 10 saw 6 of 400 bombs answered ``Timeout``).
"""

import asyncio
import ctypes
import os
import signal
import time

from plugtune import Runtime, grader

CHAOS = Runtime(
    memory_mb=160, timeout_s=6.0, max_concurrency=1, min_instances=1, max_instances=3, tmp_mb=16, max_pids=16
)
BOMB_MIB = 4096  # bounded: the limit stops it long before this
MAX_FDS = 1 << 20  # bounded: RLIMIT_NOFILE stops it long before this


def _bomb() -> int:
    hold = []
    for _ in range(BOMB_MIB):
        hold.append(b"\x01" * (1 << 20))
    return len(hold)


def _exhaust_fds() -> None:
    held = []
    try:
        for _ in range(MAX_FDS):
            held.append(os.open(os.devnull, os.O_RDONLY))
    finally:
        for fd in held:
            os.close(fd)
    raise AssertionError(f"opened {MAX_FDS} files without hitting RLIMIT_NOFILE")


def _fork_bomb() -> None:
    children = []
    for _ in range(1 << 16):  # bounded: pids.max stops it long before this
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        children.append(pid)
    raise AssertionError(f"forked {len(children)} children without hitting the pids limit")


def _fill_disk() -> None:
    import tempfile

    chunk = b"\x00" * (1 << 20)
    with tempfile.NamedTemporaryFile(dir=tempfile.gettempdir()) as f:
        for _ in range(1 << 16):  # bounded: 64 GiB at most; the tmp size limit stops it first
            f.write(chunk)
            f.flush()
    raise AssertionError("wrote 64 GiB to the temp dir without hitting its size limit")


def _common(fault: str) -> None:
    if fault == "exception":
        raise ValueError("chaos: a plugin bug")
    if fault == "os_exit":
        os._exit(7)
    if fault == "segfault":
        ctypes.string_at(0)
    if fault == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "memory_bomb":
        _bomb()
    if fault == "fd_exhaustion":
        _exhaust_fds()
    if fault == "fork_bomb":
        _fork_bomb()
    if fault == "disk_fill":
        _fill_disk()


@grader(runtime=CHAOS)
def chaos(ctx, sample, trajectory):
    fault = sample.extra.get("fault", "")
    if fault == "timeout":
        time.sleep(600)  # the deadline recycles the instance long before this
    if fault == "nan":
        return float("nan")
    _common(fault)
    return float(sample.extra["reward"])


@grader(runtime=CHAOS)
async def chaos_async(ctx, sample, trajectory):
    fault = sample.extra.get("fault", "")
    if fault == "timeout":
        await asyncio.sleep(600)  # cancelled at the deadline
    if fault == "nan":
        return float("nan")
    _common(fault)
    return float(sample.extra["reward"])
