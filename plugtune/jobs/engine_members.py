"""Which processes of an engine run (verl's workers sharing one job) still live: read by the
process that leaves the run (does a live member remain, or only ones killed without leaving?) and
by ``plugtune serve``'s housekeeping (is the run's job still worked on?)."""

from __future__ import annotations

import os
import socket

import psutil

from plugtune.store.engine_runs import EngineMember

#: a process's start time as two reads of it may differ (psutil rounds to the clock tick)
SAME_START_S = 1.0


def this_process() -> EngineMember:
    """The calling process as a member of an engine run."""
    pid = os.getpid()
    return EngineMember(pid=pid, host=socket.gethostname(), started=psutil.Process(pid).create_time())


def member_lives(member: EngineMember, host: str | None = None) -> bool | None:
    """Whether ``member``'s process still runs (its pid, started when it joined: not a later
    process given the same pid); None when it runs on another host than ``host`` (this one),
    where nothing here can tell."""
    if member.host != (host or socket.gethostname()):
        return None
    try:
        process = psutil.Process(member.pid)
        started, status = process.create_time(), process.status()
    except psutil.Error:
        return False
    return abs(started - member.started) <= SAME_START_S and status != psutil.STATUS_ZOMBIE


def stopped_members(members: list[EngineMember]) -> list[EngineMember]:
    """The members of this host whose processes are gone (a member elsewhere is not among them)."""
    return [m for m in members if member_lives(m) is False]
