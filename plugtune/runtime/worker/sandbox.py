"""The worker's side of isolation: become the function's user, enter the instance's temp space and
rlimits, and name the failures those limits cause.

Order at a zygote's (or spawned worker's) start, before the user's module is imported: the
environment is already scrubbed (the supervisor built it), the zygote enters its limits (the same
cgroup limits and rlimits as its instances: the module's code runs in it), then
:func:`enter_network`, then ``enter_mounts`` (:mod:`.mounts`: its own /tmp, Python readable, the
rest of closed folders hidden), then :func:`drop_privileges`, then :func:`refuse_namespaces`.
After the import the zygote calls :func:`seal_zygote`; each forked instance then calls
:func:`enter_instance`.

The zygote runs the plugin's module code, so it is no more trusted than the plugin: sealing it
(not dumpable, so a process of the same uid cannot ptrace it or open its /proc files) keeps an
instance, and whatever it starts, from reaching the zygote's control socket and the later
instances' sockets, but code the module left running in the zygote (a thread, a patched
``os.fork``) can undo it. The supervisor trusts nothing the zygote says either (see
``runtime/launcher.py``).
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

PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS = 4, 22, 38
RLIMITS = {"nproc": resource.RLIMIT_NPROC, "nofile": resource.RLIMIT_NOFILE, "fsize": resource.RLIMIT_FSIZE}
DISK_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}
FORKING_FILES = ("subprocess.py", "popen_fork.py", "os.py", "pty.py", "threading.py")


class SandboxError(Exception):
    """The worker could not enter its sandbox; the message says which step and why."""


def enter_network(config: dict[str, Any]) -> None:
    """The network namespace step (``plugtune.runtime.worker.network``, where present)."""
    if importlib.util.find_spec("plugtune.runtime.worker.network") is None:
        return
    from plugtune.runtime.worker import network

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
    set_rlimits(config.get("rlimits") or {})
    _libc().prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # the zygote is sealed; its own /proc/self stays its own


def set_rlimits(rlimits: dict[str, int]) -> None:
    """Lower the open files, file size and processes rlimits (never above what is set already)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file past RLIMIT_FSIZE is EFBIG, not a kill
    for name, value in rlimits.items():
        _, hard = resource.getrlimit(RLIMITS[name])
        limit = int(value) if hard == resource.RLIM_INFINITY else min(int(value), hard)
        resource.setrlimit(RLIMITS[name], (limit, limit))


def seal_zygote() -> None:
    """After the import: no process of the function's uid may ptrace the zygote or read its /proc
    files from now on; one that attached while the module's code ran is refused (SandboxError)."""
    _libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    with open("/proc/self/status") as f:
        tracer = next((int(line.split()[1]) for line in f if line.startswith("TracerPid:")), 0)
    if tracer:
        raise SandboxError(
            f"process {tracer} is tracing the plugin's zygote (its module code attached a debugger "
            "at import); remove that from the module"
        )


def refuse_namespaces() -> bool:
    """Install a seccomp filter by which this process and all it starts may not create or enter
    namespaces: ``unshare``/``clone`` with a CLONE_NEW* flag and ``setns`` are EPERM, ``clone3`` is
    ENOSYS (its flags are out of a filter's reach; libc then falls back to ``clone``). False where
    the host has no seccomp filters or its architecture is not known here."""
    program = namespace_filter(os.uname().machine)
    if program is None:
        return False
    libc = _libc()
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    filters = (_SockFilter * len(program))(*[_SockFilter(*op) for op in program])
    fprog = _SockFprog(len(program), ctypes.cast(filters, ctypes.POINTER(_SockFilter)))
    return bool(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0)


# Classic BPF (linux/filter.h) over struct seccomp_data {int nr; u32 arch; u64 ip; u64 args[6]}.
LD_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
SECCOMP_MODE_FILTER, RET_ALLOW, RET_ERRNO = 2, 0x7FFF0000, 0x00050000
NR, ARCH, ARG0 = 0, 4, 16  # offsets (ARG0: the low half of the first argument, little-endian)
CLONE_NEW = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
CLONE_NEWTIME = 0x80  # unshare() only: in clone() these bits are the exit signal
X32 = 0x40000000  # x86_64's x32 ABI: syscall numbers with this bit
#: machine -> (AUDIT_ARCH_*, syscall numbers of clone, unshare, setns, clone3)
ARCHES = {
    "x86_64": (0xC000003E, 56, 272, 308, 435),
    "aarch64": (0xC00000B7, 220, 97, 268, 435),
}


def namespace_filter(machine: str) -> list[tuple[int, int, int, int]] | None:
    """The filter :func:`refuse_namespaces` installs, as (code, jt, jf, k) rows; None: unknown machine."""
    if machine not in ARCHES:
        return None
    arch, clone, unshare, setns, clone3 = ARCHES[machine]
    code: list[tuple[int, str, str, int]] = [
        (LD_ABS, "", "", ARCH),
        (JEQ, "", "enosys", arch),  # another ABI of this kernel (i386 on x86_64): refused
        (LD_ABS, "", "", NR),
        (JGE, "enosys", "", X32),
        (JEQ, "enosys", "", clone3),
        (JEQ, "eperm", "", setns),
        (JEQ, "unshare", "", unshare),
        (JEQ, "clone", "allow", clone),
        (LD_ABS, "", "", ARG0),  # unshare:
        (JSET, "eperm", "allow", CLONE_NEW | CLONE_NEWTIME),
        (LD_ABS, "", "", ARG0),  # clone:
        (JSET, "eperm", "allow", CLONE_NEW),
        (RET, "", "", RET_ALLOW),  # allow:
        (RET, "", "", RET_ERRNO | errno.EPERM),  # eperm:
        (RET, "", "", RET_ERRNO | errno.ENOSYS),  # enosys:
    ]
    labels = {"unshare": 8, "clone": 10, "allow": 12, "eperm": 13, "enosys": 14}
    return [
        (op, labels[jt] - i - 1 if jt else 0, labels[jf] - i - 1 if jf else 0, k)
        for i, (op, jt, jf, k) in enumerate(code)
    ]


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


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
