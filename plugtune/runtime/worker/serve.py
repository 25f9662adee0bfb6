"""An instance: join its limits, run ``setup()``, then serve calls until the supervisor leaves.

Sync plugins with ``max_concurrency: 1``: every call runs on the instance's main thread, so
signal-based timeouts work (see :mod:`.mainthread`). With ``max_concurrency > 1``: every call runs
on a pool thread, never the main thread, at most ``max_concurrency`` at once (see :mod:`.threads`).
``async def`` plugins: calls are tasks on the instance's event loop, at most
``max_concurrency`` at once, watched by :class:`LoopWatchdog`.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import faulthandler
import gc
import inspect
import logging
import os
import random
import resource
import socket
import sys
import threading
import time
from typing import Any

from plugtune.runtime.protocol import (
    CALL,
    CANCEL,
    CANCELLED,
    ERR,
    FATAL,
    READY,
    STATS,
    STOP,
    Call,
    Cancel,
    FrameReader,
)
from plugtune.runtime.worker.calls import CallRunner
from plugtune.runtime.worker.channel import Channel, ChannelHandler, LineWriter
from plugtune.runtime.worker.eager import start_eagerly
from plugtune.runtime.worker.loader import Plugin, install_hint, user_line, user_traceback
from plugtune.runtime.worker.loops import new_event_loop
from plugtune.runtime.worker.mainthread import MainThreadServer
from plugtune.runtime.worker.network import guard, policy_router
from plugtune.runtime.worker.threads import SyncServer
from plugtune.runtime.worker.watch import LoopWatchdog, outbound_bytes

RECV_SIZE = 1 << 18


def enter_limits(config: dict[str, Any]) -> None:
    """Move this process into its cgroups and set its rlimits (first thing, before any work).
    ``cgroup_wait``: the supervisor moves it (cgroup v2 under a dropped uid); wait until it has."""
    pid = str(os.getpid())
    wait = config.get("cgroup_wait")
    if wait and os.geteuid() != 0:
        _wait_for_cgroup(str(wait))
    else:
        for procs in config.get("cgroup_procs", []):
            with open(procs, "w") as f:  # v1 `tasks` takes "0" (this thread); cgroup.procs takes the pid
                f.write("0" if procs.endswith("/tasks") else pid)
    data = config.get("rlimit_data")
    if data:
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)  # a zygote's: no instance gets more
        limit = int(data) if hard == resource.RLIM_INFINITY else min(int(data), hard)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def _wait_for_cgroup(path: str, limit_s: float = 10.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        with open("/proc/self/cgroup") as f:
            if any(line.rstrip("\n").endswith(path) for line in f):
                return
        time.sleep(0.0002)
    raise RuntimeError(f"the runtime did not move this instance into its cgroup {path} in {limit_s:g} s")


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
    runner.forwarder = policy_router(config)
    runner.declared = {
        (str(host), int(port)): str(name) for name, host, port in config.get("dependencies") or []
    }
    if runner.forwarder is not None:
        guard(runner.forwarder, lambda text: channel.log("WARNING", text, "runtime"))
        for problem in runner.forwarder.problems:
            channel.log("WARNING", problem, "runtime")
    concurrency = int(config["max_concurrency"])
    gc.freeze()  # what the zygote built stays shared (no copy-on-write from GC) and is never rescanned
    if plugin.spec.is_async:
        AsyncServer(runner, channel, concurrency, code_root).run(plugin)
    else:
        if not _run_setup(plugin, channel, code_root):
            os._exit(3)
        serve_sync(runner, channel, concurrency)
    os._exit(0)


def serve_sync(runner: CallRunner, channel: Channel, concurrency: int) -> None:
    """Serve a sync plugin; never returns (the serving threads end the process)."""
    if concurrency == 1:
        MainThreadServer(runner, channel).serve()
    server = SyncServer(runner, channel, concurrency)
    threading.Thread(target=server.serve, name="plugtune-reader", daemon=True).start()
    threading.Event().wait()  # the main thread only waits: no call runs here


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
        line = user_line(exc, code_root) or where
        message = f"{line}: setup() failed: {type(exc).__name__}: {exc}" + install_hint(exc)
        channel.send([FATAL, message, user_traceback(exc, code_root)])
        return False
    channel.send([READY, os.getpid(), (time.perf_counter() - started) * 1000])
    return True


class AsyncServer:
    """Calls run on the instance's event loop, each in its own task; a call that arrives while
    nothing else runs starts at once in the loop turn that read it, inside its task (see :mod:`.eager`).
    At most ``max_concurrency`` run at once; more wait in a backlog (a cancel removes them)."""

    def __init__(self, runner: CallRunner, channel: Channel, concurrency: int, code_root: str) -> None:
        self.runner = runner
        self.channel = channel
        self.concurrency = concurrency
        self.code_root = code_root
        self.tasks: dict[asyncio.Task[Any], tuple[str, str]] = {}
        self.by_id: dict[str, asyncio.Task[Any]] = {}
        self.running = 0
        self.backlog: collections.deque[Call] = collections.deque()
        self.queued: set[str] = set()
        self.draining = False
        self.eager: tuple[str, str] | None = None  # the call running before its first await
        self.reader = FrameReader()

    def run(self, plugin: Plugin) -> None:
        loop = new_event_loop()
        asyncio.set_event_loop(loop)
        self.loop = loop
        self.done = loop.create_future()
        if not _run_setup(plugin, self.channel, self.code_root, loop):
            os._exit(3)
        LoopWatchdog(self.channel, plugin.spec.name, self.code_root, self.current_call).start(loop)
        sock = self.channel.sock
        sock.setblocking(False)
        loop.add_reader(sock.fileno(), self._on_readable)
        loop.run_until_complete(self.done)

    def current_call(self, task: asyncio.Task[Any] | None) -> tuple[str, str]:
        """(call_id, trajectory_id) of what runs on the loop now (read from the watchdog's thread)."""
        eager = self.eager
        if eager is not None:
            return eager
        return self.tasks.get(task, ("", "")) if task is not None else ("", "")

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
            call = Call(*message[1:])
            if self.running < self.concurrency:
                self._start(call)
            else:
                self.backlog.append(call)
                self.queued.add(call[0])
        elif op == CANCEL:
            call_id = Cancel(*message[1:]).call_id
            task = self.by_id.get(call_id)
            if task is not None:
                task.cancel()
            elif call_id in self.queued:
                self.queued.remove(call_id)
                self.channel.send([ERR, call_id, CANCELLED, "cancelled before it started", "", {}])
        elif op == STATS:
            self.channel.send([STATS, outbound_bytes()])
        elif op == STOP and not self.done.done():
            self.done.set_result(None)

    def _start(self, call: Call) -> None:
        """Start a call: at once when nothing else runs (the latency of a lone call), else as a task
        (a burst of calls that all await is cheaper as plain tasks)."""
        call_id, ctx, args, fault = call
        coro = self.runner.run_async(call_id, ctx, args, fault, self._alone)
        self.running += 1
        if self.running > 1:
            task = self.loop.create_task(coro)
        else:
            self.eager = (call_id, ctx[6])
            try:
                task, finished = start_eagerly(self.loop, coro, contextvars.copy_context())
            finally:
                self.eager = None
            if finished:  # it has replied; its task only collects the result (a cancel comes too late)
                self.running -= 1
                return
        self.tasks[task] = (call_id, ctx[6])
        self.by_id[call_id] = task
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        call_id, _ = self.tasks.pop(task)
        self.by_id.pop(call_id, None)
        self.running -= 1
        self._drain()

    def _drain(self) -> None:
        if self.draining:
            return
        self.draining = True
        try:
            while self.backlog and self.running < self.concurrency:
                call = self.backlog.popleft()
                if call[0] in self.queued:
                    self.queued.remove(call[0])
                    self._start(call)
        finally:
            self.draining = False

    def _alone(self) -> bool:
        return self.running <= 1
