"""Starting instance processes: forked by the function's zygote, or freshly spawned as a fallback."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from plugtune.runtime.instance import Instance
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
                zygote = self.zygote
                instance.pid = await zygote.fork(config, sock_fd, out_fd)
                exit_future = zygote.exit_future(instance.pid)

                def copy_exit(future: asyncio.Future[int | None]) -> None:
                    _copy_exit(future, instance)
                    zygote.forget(instance.pid)  # pids are reused: forget this one once it is known

                exit_future.add_done_callback(copy_exit)
                return
            except (ConnectionError, OSError, asyncio.TimeoutError) as exc:
                self.log("WARNING", f"zygote unavailable ({exc}); starting instances by fresh spawn")
        elif self.zygote is not None and not self._told_zygote_gone:
            self._told_zygote_gone = True
            self.log("WARNING", "the zygote has ended; new instances start by fresh spawn")
        proc = await spawn(config, sock_fd, out_fd)
        instance.pid = proc.pid
        self.spawned[instance.id] = proc

        async def reap() -> None:
            code = await proc.wait()
            if not instance.exit_code.done():
                instance.exit_code.set_result(code)

        asyncio.get_running_loop().create_task(reap())

    def forget(self, instance_id: str) -> None:
        self.spawned.pop(instance_id, None)

    async def close(self) -> None:
        if self.zygote is not None:
            await self.zygote.aclose()
        for proc in list(self.spawned.values()):
            await _reap(proc)


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
