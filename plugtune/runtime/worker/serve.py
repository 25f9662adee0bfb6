"""An instance: join its limits, run ``setup()``, then serve calls until the supervisor leaves.

Sync plugins: leader/follower threads, at most ``max_concurrency`` calls at once (see
:mod:`.threads`). ``async def`` plugins: calls are tasks on the instance's event loop, at most
``max_concurrency`` at once, watched by :class:`LoopWatchdog`.
"""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import inspect
import logging
import os
import random
import resource
import socket
import sys
import time
from typing import Any

from plugtune.runtime.protocol import (
    CALL,
    CANCEL,
    FATAL,
    READY,
    STATS,
    STOP,
    FrameReader,
)
from plugtune.runtime.worker.calls import CallRunner
from plugtune.runtime.worker.channel import Channel, ChannelHandler, LineWriter
from plugtune.runtime.worker.loader import Plugin, user_traceback
from plugtune.runtime.worker.threads import SyncServer
from plugtune.runtime.worker.watch import LoopWatchdog, outbound_bytes

RECV_SIZE = 1 << 18


def enter_limits(config: dict[str, Any]) -> None:
    """Move this process into its cgroups and set its rlimits (first thing, before any work)."""
    pid = str(os.getpid())
    for procs in config.get("cgroup_procs", []):
        with open(procs, "w") as f:
            f.write(pid)
    data = config.get("rlimit_data")
    if data:
        resource.setrlimit(resource.RLIMIT_DATA, (int(data), int(data)))


def reseed() -> None:
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(int.from_bytes(os.urandom(4), "little"))


def serve(plugin: Plugin, sock: socket.socket, config: dict[str, Any]) -> None:
    """Run the instance; never returns."""
    channel = Channel(sock)
    faulthandler.enable(2, all_threads=True)
    sys.stdout = LineWriter(channel, "stdout", "INFO")
    sys.stderr = LineWriter(channel, "stderr", "WARNING")
    handler = ChannelHandler(channel)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    code_root = config["code_root"]
    runner = CallRunner(plugin, channel, code_root, int(config["memory_mb"]))
    concurrency = int(config["max_concurrency"])
    gc.freeze()  # what the zygote built stays shared (no copy-on-write from GC) and is never rescanned
    if plugin.spec.is_async:
        AsyncServer(runner, channel, concurrency, code_root).run(plugin)
    else:
        if not _run_setup(plugin, channel, code_root):
            os._exit(3)
        SyncServer(runner, channel, concurrency).serve()
    os._exit(0)


def _run_setup(plugin: Plugin, channel: Channel, code_root: str, loop: Any = None) -> bool:
    where = os.path.relpath(plugin.module.__file__ or "", code_root)
    if plugin.setup is None:
        channel.send([READY, os.getpid(), 0.0])
        return True
    started = time.perf_counter()
    try:
        result = plugin.setup()
        if inspect.isawaitable(result):
            if loop is not None:
                loop.run_until_complete(result)
            else:
                asyncio.run(result)  # type: ignore[arg-type]
    except BaseException as exc:  # noqa: BLE001 - reported as a create fault
        message = f"{where}: setup() failed: {type(exc).__name__}: {exc}"
        channel.send([FATAL, message, user_traceback(exc, code_root)])
        return False
    channel.send([READY, os.getpid(), (time.perf_counter() - started) * 1000])
    return True


class AsyncServer:
    def __init__(self, runner: CallRunner, channel: Channel, concurrency: int, code_root: str) -> None:
        self.runner = runner
        self.channel = channel
        self.concurrency = concurrency
        self.code_root = code_root
        self.tasks: dict[asyncio.Task[Any], tuple[str, str]] = {}
        self.by_id: dict[str, asyncio.Task[Any]] = {}
        self.reader = FrameReader()

    def run(self, plugin: Plugin) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self.loop = loop
        self.semaphore = asyncio.Semaphore(self.concurrency)
        self.done = loop.create_future()
        if not _run_setup(plugin, self.channel, self.code_root, loop):
            os._exit(3)
        LoopWatchdog(self.channel, plugin.spec.name, self.code_root, self.tasks).start(loop)
        sock = self.channel.sock
        sock.setblocking(False)
        loop.add_reader(sock.fileno(), self._on_readable)
        loop.run_until_complete(self.done)

    def _on_readable(self) -> None:
        sock = self.channel.sock
        try:
            data = sock.recv(RECV_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            if not self.done.done():
                self.done.set_result(None)
            return
        for message in self.reader.feed(data):
            self.handle(message)

    def handle(self, message: list[Any]) -> None:
        op = message[0]
        if op == CALL:
            _, call_id, ctx, args, fault = message
            task = self.loop.create_task(self._guarded(call_id, ctx, args, fault))
            self.tasks[task] = (call_id, ctx[6])
            self.by_id[call_id] = task
        elif op == CANCEL:
            running = self.by_id.get(message[1])
            if running is not None:
                running.cancel()
        elif op == STATS:
            self.channel.send([STATS, outbound_bytes()])
        elif op == STOP and not self.done.done():
            self.done.set_result(None)

    def _alone(self) -> bool:
        return len(self.by_id) <= 1

    async def _guarded(self, call_id: str, ctx: list[Any], args: list[Any], fault: str | None) -> None:
        try:
            async with self.semaphore:
                await self.runner.run_async(call_id, ctx, args, fault, self._alone)
        finally:
            finished = self.by_id.pop(call_id, None)
            if finished is not None:
                self.tasks.pop(finished, None)
