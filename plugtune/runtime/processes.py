"""Processes the supervisor may signal, found from the kernel and never from a message.

A plugin's process may say anything (a pid in a frame, a fork() that lies), so the runtime learns
its processes from what the kernel says: its own spawns, ``/proc`` parentage, session and real
uid, a cgroup's members. A process is checked while held by a pidfd (:class:`Held`), so the
signal reaches the process that was checked or none: a pid reused meanwhile cannot redirect it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

SWEEP_S = 2.0  # how long a sweep tries before it names what is left


@dataclass(frozen=True)
class Status:
    """What ``/proc/PID`` says of a process (``uid``: its real uid; ``nspid``: its pid in its own
    pid namespace, the one its parent's fork() returned)."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    uid: int
    nspid: int
    zombie: bool


def read_status(pid: int) -> Status | None:
    """The process's status, None when it has ended (or was never there)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        with open(f"/proc/{pid}/status", "rb") as f:
            lines = f.read().splitlines()
        fields = stat[stat.rindex(b")") + 2 :].split()
        uid = nspid = -1
        for line in lines:
            if line.startswith(b"Uid:"):
                uid = int(line.split()[1])
            elif line.startswith(b"NSpid:"):
                nspid = int(line.split()[-1])
        state, ppid, pgid, sid = fields[0], int(fields[1]), int(fields[2]), int(fields[3])
    except (OSError, ValueError, IndexError):
        return None
    return Status(pid, ppid, pgid, sid, uid, nspid if nspid > 0 else pid, state in (b"Z", b"X"))


class Held:
    """One verified process, held by a pidfd where the kernel has them (Linux 5.3+; elsewhere the
    pid, checked once: a small window for its reuse remains there)."""

    def __init__(self, pid: int, fd: int | None) -> None:
        self.pid = pid
        self.fd = fd
        self.closed = False

    def signal(self, sig: int = signal.SIGKILL) -> bool:
        """Send ``sig`` (0: only ask) to the held process; False when it has ended or was let go."""
        if self.closed:
            return False
        try:
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, sig)
            else:
                os.kill(self.pid, sig)
        except OSError:
            return False
        return True

    def close(self) -> None:
        """Let the process go (its pid stays readable for messages)."""
        if self.fd is not None:
            os.close(self.fd)
        self.fd, self.closed = None, True


def hold(pid: int, check: Callable[[Status], bool]) -> Held | None:
    """The process ``pid`` held, if ``check`` accepts its status; None otherwise (or ended).

    The pidfd is opened first, the status read second, and the pidfd asked last whether its
    process still exists (a zombie does: its pid is not reused before it is reaped), so the status
    read was that process's own."""
    if pid <= 0:
        return None
    fd = _pidfd(pid)
    status = read_status(pid)
    held = Held(pid, fd if fd is not None and fd >= 0 else None)
    if fd == -1 or status is None or not check(status) or not held.signal(0):
        held.close()
        return None
    return held


def signal_verified(pid: int, check: Callable[[Status], bool], sig: int = signal.SIGKILL) -> bool:
    """Send ``sig`` to ``pid`` if ``check`` accepts it (see :func:`hold`); True when it was sent."""
    held = hold(pid, check)
    if held is None:
        return False
    try:
        return held.signal(sig)
    finally:
        held.close()


def pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def children(parent: int) -> list[int]:
    """The children of ``parent`` now (every thread's list in /proc; a scan where there is none)."""
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{parent}/task"):
            with open(f"/proc/{parent}/task/{tid}/children") as f:
                out.extend(int(x) for x in f.read().split())
    except OSError:
        return [s.pid for s in map(read_status, pids()) if s is not None and s.ppid == parent]
    return out


def find_child(parent: int, claimed: int, uid: int | None) -> Held | None:
    """The child of ``parent`` that ``claimed`` names (its pid here, or in its own pid namespace),
    held; None when ``parent`` has no such child (of ``uid``, when given)."""

    def is_it(s: Status) -> bool:
        return s.ppid == parent and (uid is None or s.uid == uid) and not s.zombie

    for pid in children(parent):
        status = read_status(pid)
        if status is not None and claimed in (status.pid, status.nspid):
            return hold(pid, is_it)
    return None


def sweep(match: Callable[[Status], bool], within_s: float = SWEEP_S) -> list[int]:
    """SIGKILL every process ``match`` accepts, again until none is left or ``within_s`` passed;
    returns those still running then (zombies have ended: they are not counted)."""
    deadline = time.monotonic() + within_s
    pause = 0.002
    while True:
        left = []
        for pid in pids():
            status = read_status(pid)
            if status is None or status.zombie or status.pid == os.getpid() or not match(status):
                continue
            signal_verified(pid, lambda s: match(s) and not s.zombie)
            left.append(pid)
        if not left:
            return []
        if time.monotonic() >= deadline:
            return [p for p in left if _running(p, match)]
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def kill_tree(root: Held, uid: int | None) -> None:
    """SIGKILL ``root``'s descendants and the rest of its session, then ``root`` (one pass over /proc;
    each checked again as it is signalled: still below ``root`` or in its session, of ``uid``)."""
    if root.signal(0):  # alive, so its pid (and session id) is not another process's
        table = {s.pid: s for s in map(read_status, pids()) if s is not None and not s.zombie}
        below: dict[int, list[int]] = {}
        for status in table.values():
            below.setdefault(status.ppid, []).append(status.pid)
        tree, stack = set(), [root.pid]
        while stack:
            for child in below.get(stack.pop(), []):
                if child not in tree:
                    tree.add(child)
                    stack.append(child)
        session = {pid for pid, status in table.items() if status.sid == root.pid}
        parents = tree | {root.pid}

        def is_its(s: Status) -> bool:
            return (s.sid == root.pid or s.ppid in parents) and (uid is None or s.uid == uid)

        for pid in (tree | session) - {root.pid}:
            signal_verified(pid, is_its)
    root.signal(signal.SIGKILL)


def of_uid(uid: int) -> Callable[[Status], bool]:
    return lambda s: s.uid == uid


def in_session(sid: int, uid: int | None) -> Callable[[Status], bool]:
    return lambda s: s.sid == sid and (uid is None or s.uid == uid)


def _running(pid: int, match: Callable[[Status], bool]) -> bool:
    status = read_status(pid)
    return status is not None and not status.zombie and match(status)


def _pidfd(pid: int) -> int | None:
    """A pidfd for ``pid``; -1 when the process has ended; None where the kernel has no pidfds."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return -1
    except (OSError, AttributeError):
        return None
