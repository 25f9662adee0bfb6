"""What became of one instance: whether it still serves, why the runtime killed it, which of its
limits a watch found it over, and whether its end has been read. One record per instance, changed
only through its methods (the supervisor, the pool and the watches each call one)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Overrun(enum.Enum):
    """A limit a watch (not the kernel) found an instance over, and killed it for."""

    MEMORY = "memory"  # the memory watchdog (rlimit + watchdog: no memory cgroup)
    PIDS = "pids"  # the process watch (no pids cgroup)
    DISK = "disk"  # the temp folder's size watch (a plain folder: no tmpfs of its own)


@dataclass(slots=True)
class Fate:
    draining: bool = False  # no new call is routed to it (it is ending, retiring or suspect)
    ended: bool = False  # its end was seen: its calls are answered, it is being cleaned up
    killed: str = ""  # why the runtime killed (or retires) it; "" while it was not
    over_memory: str = ""  # what the memory watchdog saw when it killed it
    over_pids: str = ""  # what the process watch counted when it killed it
    over_disk: str = ""  # what the size watch found in its temp folder when it killed it

    def drain(self) -> None:
        """Route no new call to it."""
        self.draining = True

    def kill(self, reason: str) -> None:
        """It is being killed (the first reason stays): it serves no new call."""
        if not self.killed:
            self.killed = reason
        self.draining = True

    def overran(self, limit: Overrun, what: str) -> None:
        """A watch found it over ``limit`` (``what`` says by how much); it is killed for it."""
        if limit is Overrun.MEMORY:
            self.over_memory = what
        elif limit is Overrun.PIDS:
            self.over_pids = what
        else:
            self.over_disk = what

    def end(self) -> bool:
        """Its end is seen now; False when it was seen already."""
        if self.ended:
            return False
        self.ended = True
        self.draining = True
        return True
