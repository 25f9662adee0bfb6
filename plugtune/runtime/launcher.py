"""Starting instance processes: forked by the function's zygote, or freshly spawned as a fallback.

The launcher learns each instance's process from the kernel, never from what a worker says: a
spawned instance is its own child; a forked one must be a child of the zygote it spawned (by
/proc parentage, and the function's uid when it has one). The zygote runs the plugin's module
code, so its FORKED frame is only a claim: a pid it names that is not a child it forked (a
patched ``os.fork``, a forged frame) gets no instance, and that zygote is no longer used.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

from plugtune.runtime.backend import DeployFailed
from plugtune.runtime.instance import Instance
from plugtune.runtime.processes import find_child, hold
from plugtune.runtime.zygote_client import Zygote, spawn


class Launcher:
    def __init__(self, zygote: Zygote | None, log: Callable[[str, str], None]) -> None:
        self.zygote = zygote
        self.log = log
        self.spawned: dict[str, asyncio.subprocess.Process] = {}
        self._told_zygote_gone = False

    async def launch(self, instance: Instance, config: dict[str, Any], sock_fd: int, out_fd: int) -> None:
        """Start the process for ``instance``; its exit status reaches ``instance.exit_code``."""
        if self.zygote is not None and self.zygote.alive:
            try:
                await self._fork(self.zygote, instance, config, sock_fd, out_fd)
                return
            except (ConnectionError, OSError, asyncio.TimeoutError) as exc:
                self.log("WARNING", f"zygote unavailable ({exc}); starting instances by fresh spawn")
        elif self.zygote is not None and not self._told_zygote_gone:
            self._told_zygote_gone = True
            self.log("WARNING", "the zygote has ended; new instances start by fresh spawn")
        proc = await spawn(config, sock_fd, out_fd)
        own = os.getpid()
        instance.process = hold(proc.pid, lambda s: s.ppid == own)
        self.spawned[instance.id] = proc

        async def reap() -> None:
            code = await proc.wait()
            if not instance.exit_code.done():
                instance.exit_code.set_result(code)

        asyncio.get_running_loop().create_task(reap())

    async def _fork(
        self, zygote: Zygote, instance: Instance, config: dict[str, Any], sock_fd: int, out_fd: int
    ) -> None:
        claimed = await zygote.fork(config, sock_fd, out_fd)
        zygote_pid = zygote.proc.pid if zygote.proc is not None else 0
        process = find_child(zygote_pid, claimed, instance.uid) if zygote_pid else None
        exit_future = zygote.exit_future(claimed)
        # not found: a child reaped before it was looked for ended at once (its EXITED frame says how)
        if process is None and not await _ended_at_once(exit_future):
            zygote.stop()  # it runs the plugin's code and says what is not so: it forks nothing more
            self.log(
                "ERROR",
                f"the zygote named pid {claimed} as instance {instance.id}, which is not a process it "
                "forked (does the plugin's module code patch os.fork?); the zygote is stopped and new "
                "instances start by fresh spawn",
            )
            raise DeployFailed(f"the zygote named pid {claimed}, which is not a process it forked")
        instance.process = process

        def copy_exit(future: asyncio.Future[int | None]) -> None:
            _copy_exit(future, instance)
            zygote.forget(claimed)  # pids are reused: forget this one once it is known

        exit_future.add_done_callback(copy_exit)

    def forget(self, instance_id: str) -> None:
        self.spawned.pop(instance_id, None)

    async def close(self) -> None:
        if self.zygote is not None:
            await self.zygote.aclose()
        for proc in list(self.spawned.values()):
            await _reap(proc)


async def _ended_at_once(exit_future: asyncio.Future[int | None], within_s: float = 0.5) -> bool:
    """Whether the zygote reports the child's end (its EXITED frame follows FORKED at once)."""
    try:
        await asyncio.wait_for(asyncio.shield(exit_future), within_s)
    except asyncio.TimeoutError:
        return False
    return True


async def _reap(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        try:
            proc.kill()
        except ProcessLookupError:
            pass
    try:
        await asyncio.wait_for(proc.wait(), 2.0)
    except asyncio.TimeoutError:
        pass


def _copy_exit(future: asyncio.Future[int | None], instance: Instance) -> None:
    if not instance.exit_code.done() and not future.cancelled():
        instance.exit_code.set_result(future.result())
