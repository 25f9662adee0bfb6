"""The worker's side of isolation: become the function's user, enter the instance's temp space and
rlimits, and name the failures those limits cause.

Order at a zygote's (or spawned worker's) start, before the user's module is imported: the
environment is already scrubbed (the supervisor built it), then :func:`enter_network`, then
``enter_mounts`` (:mod:`.mounts`: its own /tmp, Python readable, the rest of closed folders hidden),
then :func:`drop_privileges`. Each forked instance then calls :func:`enter_instance`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import importlib.util
import os
import resource
import signal
import tempfile
import traceback
from typing import Any

from plugtune.runtime.protocol import DISK, PIDS

PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 4, 38
RLIMITS = {"nproc": resource.RLIMIT_NPROC, "nofile": resource.RLIMIT_NOFILE, "fsize": resource.RLIMIT_FSIZE}
DISK_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}
FORKING_FILES = ("subprocess.py", "popen_fork.py", "os.py", "pty.py", "threading.py")


class SandboxError(Exception):
    """The worker could not enter its sandbox; the message says which step and why."""


def enter_network(config: dict[str, Any]) -> None:
    """The network namespace step (``plugtune.runtime.worker.network``, where present)."""
    if importlib.util.find_spec("plugtune.runtime.worker.network") is None:
        return
    from plugtune.runtime.worker import network  # type: ignore[attr-defined]

    network.enter_network(config)


def drop_privileges(config: dict[str, Any]) -> None:
    """Become the function's own uid/gid with no supplementary groups and no way back."""
    user = config.get("user")
    if not user:
        return
    uid, gid = int(user[0]), int(user[1])
    try:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    except OSError as exc:
        raise SandboxError(
            f"could not switch to the plugin user {uid}:{gid} ({exc.strerror}); "
            "is that range mapped in this container's user namespace?"
        ) from None
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # setuid binaries (su, sudo) cannot give root back
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # its own /proc/self stays readable to it


def enter_instance(config: dict[str, Any]) -> None:
    """Point HOME/TMPDIR at the instance's private folder and lower its rlimits."""
    tmp = config.get("tmp_dir")
    if tmp:
        os.environ["HOME"] = os.environ["TMPDIR"] = tmp
        tempfile.tempdir = None  # gettempdir() may have been cached while the zygote imported
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file past RLIMIT_FSIZE is EFBIG, not a kill
    for name, value in (config.get("rlimits") or {}).items():
        _, hard = resource.getrlimit(RLIMITS[name])
        limit = int(value) if hard == resource.RLIM_INFINITY else min(int(value), hard)
        resource.setrlimit(RLIMITS[name], (limit, limit))


def limit_kind(exc: BaseException) -> str | None:
    """``PIDS`` or ``DISK`` when the exception (or what caused it) is the instance's limit."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in DISK_ERRNOS:
            return DISK
        if _is_fork_failure(current):
            return PIDS
        current = current.__cause__ or current.__context__
    return None


def limit_hint(exc: BaseException) -> str:
    """A hint for an exception that is a limit kept as ``500`` (open files)."""
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return (
            f" (the instance may hold {soft} open files, RLIMIT_NOFILE: close files and sockets "
            "when a call ends, e.g. with `with open(...)`)"
        )
    return ""


def _is_fork_failure(exc: BaseException) -> bool:
    if isinstance(exc, RuntimeError) and "can't start new thread" in str(exc):
        return True
    if not (isinstance(exc, OSError) and exc.errno == errno.EAGAIN):
        return False
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return False
    last = frames[-1]
    return "fork" in (last.line or "") or last.filename.endswith(FORKING_FILES)
