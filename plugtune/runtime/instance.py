"""The supervisor's side of one instance: its connection, in-flight calls, logs and death.

Calls are multiplexed on one Unix socket by call id. When the instance ends, every call still in
flight gets a :class:`Failed` fact (``DIED`` or ``OOM_KILLED``, decided from the cgroup's OOM-kill
counter or the memory watchdog, never from the exit code alone) with the last output the instance
wrote, so nothing it printed before dying is lost.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from plugtune.runtime import protocol as p
from plugtune.runtime.backend import DeployFailed, Failed, Happened, Returned
from plugtune.runtime.fate import Fate, Overrun
from plugtune.runtime.limits import InstanceLimits
from plugtune.runtime.loglimit import MARKER_CHARS, MAX_LINE_CHARS, LogBudget, clip_line
from plugtune.runtime.processes import Held, kill_tree
from plugtune.types import LogLine

log = logging.getLogger(__name__)

DRAIN_OUTPUT_S = 0.5
MAX_LINE_BYTES = 64 << 10
KINDS = {
    p.MEMORY: Happened.MEMORY_ERROR,
    p.BAD_RETURN: Happened.BAD_RETURN,
    p.PIDS: Happened.PIDS_LIMIT,
    p.DISK: Happened.DISK_FULL,
}
#: Causes after which the instance serves no other call (its stray processes or full temp space
#: would fail the next one too): the deployment recycles it.
RECYCLED = (Happened.PIDS_LIMIT, Happened.DISK_FULL)


@dataclass(slots=True)
class Pending:
    call_id: str
    trajectory_id: str
    future: asyncio.Future[Returned | Failed]
    started: float
    logs: list[LogLine] = field(default_factory=list)


class Instance:
    def __init__(
        self,
        instance_id: str,
        plugin: str,
        limits: InstanceLimits,
        on_log: Callable[[LogLine], None],
        on_end: Callable[[Instance], None],
        on_freed: Callable[[], None] = lambda: None,
    ) -> None:
        self.id = instance_id
        self.plugin = plugin
        self.limits = limits
        self.on_log = on_log
        self.on_end = on_end
        # Its process, as the launcher verified it from the kernel (never a pid the instance sent).
        self.process: Held | None = None
        self.uid: int | None = None  # the function's own uid, when it has one
        self.pending: dict[str, Pending] = {}
        # Calls whose caller stopped waiting (its task was cancelled): they hold their slot until
        # the instance answers, and ``on_freed`` tells the deployment when one does.
        self.abandoned: set[str] = set()
        self.on_freed = on_freed
        self.loop = asyncio.get_running_loop()
        self.ready: asyncio.Future[float] = self.loop.create_future()
        # An instance killed before anyone waited for it (a spare at shutdown) has nobody to read
        # its start failure; reading it here keeps asyncio from reporting it as lost at exit.
        self.ready.add_done_callback(_consume)
        self.exit_code: asyncio.Future[int | None] = self.loop.create_future()
        self.output_done: asyncio.Future[None] = self.loop.create_future()
        self.tail: collections.deque[str] = collections.deque(maxlen=60)
        self.fate = Fate()
        self.last_used = time.monotonic()
        self.started_at = time.perf_counter()  # when its creation began (its cold start's start)
        self.outbound_bytes = 0
        self.peak_rss_mb = 0.0
        self.cancel_timers: dict[str, asyncio.TimerHandle] = {}
        self.transport: asyncio.Transport | None = None
        self._outbox: list[bytes] = []
        self.fatal: tuple[str, str] | None = None
        self.startup_logs: list[LogLine] = []
        self.ledger_released = False
        self.end_task: asyncio.Task[None] | None = None
        self.tmp_dir: Path | None = None  # its private temp folder (removed after it ends)
        self.max_pids = 0
        self.log_budget = LogBudget()

    # ---- wiring -----------------------------------------------------------------------------

    async def attach(self, sock: socket.socket, output_fd: int) -> None:
        reader = p.FrameReader(p.MAX_FRAME)
        instance = self

        class Conn(asyncio.Protocol):
            def data_received(self, data: bytes) -> None:
                if instance.fate.killed:
                    return
                try:
                    for message in reader.feed(data):
                        instance.on_message(message)
                except Exception as exc:  # noqa: BLE001 - whatever the instance sent, it is the instance's fault
                    instance.on_bad_frame(str(exc) or type(exc).__name__)
                    return
                if reader.broken:
                    instance.on_bad_frame(reader.broken)

            def connection_lost(self, exc: Exception | None) -> None:
                instance.fate.drain()  # no call is routed to it while its end is being read
                instance.end_task = instance.loop.create_task(instance.on_connection_lost())

        class Output(asyncio.Protocol):
            partial = b""

            def data_received(self, data: bytes) -> None:
                lines = (self.partial + data).split(b"\n")
                self.partial = lines.pop()
                if len(self.partial) > MAX_LINE_BYTES:  # output without newlines: cut it into lines
                    lines.append(self.partial)
                    self.partial = b""
                for line in lines:
                    instance.on_output(line.decode(errors="replace"))

            def connection_lost(self, exc: Exception | None) -> None:
                if self.partial:
                    instance.on_output(self.partial.decode(errors="replace"))
                if not instance.output_done.done():
                    instance.output_done.set_result(None)

        transport, _ = await self.loop.create_unix_connection(Conn, sock=sock)
        self.transport = transport
        await self.loop.connect_read_pipe(Output, os.fdopen(output_fd, "rb", buffering=0))

    # ---- calls ------------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self.pending)

    @property
    def started(self) -> bool:
        """Its start-up is over (it is ready, or it failed)."""
        return self.ready.done()

    def is_usable(self) -> bool:
        """Ready, and no call that timed out still runs here (its event loop may be blocked)."""
        return self.ready.done() and not self.ready.exception() and not self.cancel_timers

    def start_call(self, call_id: str, trajectory_id: str, message: list[Any]) -> Pending:
        pending = Pending(call_id, trajectory_id, self.loop.create_future(), time.perf_counter())
        self.pending[call_id] = pending
        self.last_used = time.monotonic()
        self.send(message)
        return pending

    def send(self, message: list[Any]) -> None:
        """Send a frame; under load, frames queued in one loop turn go out in one write (one wake-up)."""
        if not self._outbox and len(self.pending) <= 1:  # nothing else in flight: no reason to wait
            if self.transport is not None and not self.transport.is_closing():
                self.transport.write(p.pack(message))
            return
        self._outbox.append(p.pack(message))
        if len(self._outbox) == 1:
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        data, self._outbox = b"".join(self._outbox), []
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def abandon(self, call_id: str) -> None:
        """The caller stopped waiting: ask the instance to cancel the call. A sync call's thread
        runs on, so the call keeps its slot until the instance answers (then ``on_freed``)."""
        if call_id in self.pending:
            self.abandoned.add(call_id)
            self.send([p.CANCEL, call_id])

    def expire(self, call_id: str, timeout_s: float) -> Pending | None:
        """The caller's deadline passed: stop waiting, ask the instance to cancel the call."""
        pending = self.pending.pop(call_id, None)
        if pending is None:
            return None
        self._log_dropped(call_id, pending)
        self.send([p.CANCEL, call_id])
        return pending

    # ---- messages from the instance ---------------------------------------------------------

    def on_message(self, message: list[Any]) -> None:
        op = message[0]
        if op == p.OK:
            ok = p.Ok(*message[1:])
            pending = self.pending.pop(ok.call_id, None)
            self._settled(ok.call_id, pending)
            if pending is not None and not pending.future.done():
                latency = (time.perf_counter() - pending.started) * 1000
                pending.future.set_result(Returned(ok.value, ok.metrics, pending.logs, self.id, latency))
        elif op == p.LOG:
            self._log(self._log_line(p.Log(*message[1:])))
        elif op == p.ERR:
            self._on_error(p.Err(*message[1:]))
        elif op == p.READY:  # its pid is ignored: the launcher knows it from the kernel
            ready = p.Ready(*message[1:])
            if not self.ready.done():
                self.ready.set_result(float(ready.setup_ms))
        elif op == p.FATAL:
            fatal = p.Fatal(*message[1:])
            self.fatal = (str(fatal.message), str(fatal.traceback))
        elif op == p.STATS:
            self.outbound_bytes = int(p.Stats(*message[1:]).outbound_bytes)

    def _log_line(self, frame: p.Log) -> LogLine:
        when, level, source = float(frame.time), str(frame.level)[:16], str(frame.source)[:16]
        return LogLine(
            when,
            level,
            self.plugin,
            str(frame.message),
            source,
            str(frame.call_id),
            str(frame.trajectory_id),
            self.id,
        )

    def on_bad_frame(self, why: str) -> None:
        """The instance sent bytes that are not a frame of the protocol (or one over the size limit):
        it is broken (or hostile); its calls fail with the reason and it is killed."""
        self.kill(
            f"it sent a frame the supervisor refuses ({why}; an instance's frames are at most "
            f"{p.MAX_FRAME >> 20} MiB: return smaller results and log less)"
        )

    def _on_error(self, err: p.Err) -> None:
        call_id, kind, text = err.call_id, err.kind, err.message
        pending = self.pending.pop(call_id, None)
        self._settled(call_id, pending)
        if pending is None or pending.future.done():
            if KINDS.get(kind) in RECYCLED or self.hit_pids():
                # A call already answered (its deadline passed) hit a limit afterwards: its stray
                # processes or full temp space stay here, so this instance serves no other call.
                self.retire_when_idle("a call past its deadline then hit its pids or disk limit")
            return
        happened, cause = KINDS.get(kind, Happened.RAISED), ""
        dependency = p.parse_dependency_kind(kind)
        if dependency is not None:
            happened, cause = Happened.DEPENDENCY, "/".join(dependency).rstrip("/")
        elif kind == p.POLICY_REFUSED:
            happened = Happened.POLICY_REFUSED
        if happened is Happened.RAISED and self.hit_pids():
            happened = Happened.PIDS_LIMIT  # it raised because a fork or thread was refused
            text = f"{text} ({self.pids_text()})"
        if happened in RECYCLED:
            # Route nothing here from now on: a call picked before the caller of this one resumes
            # and recycles the instance would die with it and be answered with this call's cause.
            self.fate.drain()
        latency = (time.perf_counter() - pending.started) * 1000
        peak = self.limits.peak_mb() or (self.peak_rss_mb or None)
        pending.future.set_result(
            Failed(happened, text, pending.logs, err.traceback, self.id, peak, latency, cause)
        )

    def _settled(self, call_id: str, pending: Pending | None) -> None:
        self.last_used = time.monotonic()
        self._log_dropped(call_id, pending)
        timer = self.cancel_timers.pop(call_id, None)
        if timer is not None:
            timer.cancel()
        if call_id in self.abandoned:
            self.abandoned.discard(call_id)
            self.on_freed()

    def _log(self, line: LogLine) -> None:
        """Keep a line (cut to its length limit) while its call's log budget lasts."""
        owner = line.call_id if line.call_id in self.pending else ""
        if not owner:
            self._log_dropped("", None, roll=True)
        if len(line.message) > MAX_LINE_CHARS + MARKER_CHARS:
            line = replace(line, message=clip_line(line.message))
        if self.log_budget.admit(owner, len(line.message)):
            self._keep(line)

    def _log_dropped(self, call_id: str, pending: Pending | None, roll: bool = False) -> None:
        """One line saying how many of a call's (or the window's) lines the log budget dropped."""
        marker = self.log_budget.roll_window() if roll else self.log_budget.settle(call_id)
        if marker is not None:
            trajectory_id = pending.trajectory_id if pending is not None else ""
            now = time.time()
            line = LogLine(now, "WARNING", self.plugin, marker, "runtime", call_id, trajectory_id, self.id)
            if pending is not None:
                pending.logs.append(line)
            self.on_log(line)

    def _keep(self, line: LogLine) -> None:
        if not self.ready.done():
            self.startup_logs.append(line)
        pending = self.pending.get(line.call_id) if line.call_id else None
        if pending is not None:
            pending.logs.append(line)
        self.on_log(line)

    def on_output(self, text: str) -> None:
        """A line the instance wrote to its file descriptors 1/2 (C code, faulthandler, children)."""
        self.tail.append(text)
        call_id = trajectory_id = ""
        if len(self.pending) == 1:
            only = next(iter(self.pending.values()))
            call_id, trajectory_id = only.call_id, only.trajectory_id
        self._log(
            LogLine(time.time(), "WARNING", self.plugin, text, "stderr", call_id, trajectory_id, self.id)
        )

    # ---- the end ----------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        """Its process's pid (0 before it started or once its handle was closed)."""
        return self.process.pid if self.process is not None else 0

    def let_go(self) -> None:
        """Close its process handle (after its end: nothing of it is signalled again)."""
        if self.process is not None:
            self.process.close()

    def kill(self, reason: str) -> None:
        """Kill the instance's processes: everything in its cgroup and, without one, its descendants
        and the rest of its session, each checked in /proc and signalled by pidfd."""
        self.fate.kill(reason)
        if self.process is not None:
            if self.limits.watchdog:  # no cgroup holds its children: found by parentage and session
                kill_tree(self.process, self.uid)
            else:
                self.process.signal(signal.SIGKILL)
        self.limits.kill_all()
        if self.transport is not None:
            self.transport.close()

    def kill_over(self, limit: Overrun, what: str, reason: str) -> None:
        """A watch found it over ``limit`` (``what``: what it saw): kill it, its calls fail with that."""
        self.fate.overran(limit, what)
        self.kill(reason)

    def retire_when_idle(self, reason: str) -> None:
        """Route no more calls here; kill it once the calls it still runs have been answered."""
        self.fate.drain()
        if self.fate.ended:
            return
        if self.in_flight == 0:
            self.kill(reason)
        else:
            self.loop.call_later(0.05, self.retire_when_idle, reason)

    async def on_connection_lost(self) -> None:
        if not self.fate.end():
            return
        for _ in range(2):  # the last output and the exit status arrive a moment after the socket closes
            await asyncio.wait([self.output_done, self.exit_code], timeout=DRAIN_OUTPUT_S)  # type: ignore[type-var]
        oom = self.limits.oom_kills() > 0 or bool(self.fate.over_memory)
        peak = self.limits.peak_mb() or (self.peak_rss_mb or None)
        code = self.exit_code.result() if self.exit_code.done() else None
        message = self._death_message(oom, code, peak)
        tb = "\n".join(self.tail)
        if not self.ready.done():
            if self.fatal is not None and not oom:
                fatal = DeployFailed(self.fatal[0], self.fatal[1], self.startup_logs)
            elif oom:
                fatal = DeployFailed(message, tb, self.startup_logs)
            else:
                text = f"the instance exited before it was ready ({_describe_exit(code)})"
                said = next((t for t in reversed(self.tail) if t.startswith("plugtune instance failed")), "")
                text += f": {said.removeprefix('plugtune instance failed to start: ')}" if said else ""
                fatal = DeployFailed(text, tb, self.startup_logs)
            self.ready.set_exception(fatal)
        happened = Happened.OOM_KILLED if oom else Happened.DIED
        if not oom and self.fate.over_disk:
            happened, message = Happened.DISK_FULL, self.fate.over_disk
        elif not oom and self.hit_pids():
            happened, message = Happened.PIDS_LIMIT, f"{message} ({self.pids_text()})"
        for pending in list(self.pending.values()):
            self._log_dropped(pending.call_id, pending)
            if not pending.future.done():
                latency = (time.perf_counter() - pending.started) * 1000
                pending.future.set_result(Failed(happened, message, pending.logs, tb, self.id, peak, latency))
        self.pending.clear()
        for timer in self.cancel_timers.values():
            timer.cancel()
        self.on_end(self)

    def hit_pids(self) -> bool:
        """Its pids limit refused it a process or thread (cgroup), or the process watch killed it."""
        return bool(self.fate.over_pids) or self.limits.pids_hits() > 0

    def pids_text(self) -> str:
        if self.fate.over_pids:
            return self.fate.over_pids
        hits = self.limits.pids_hits()
        return f"its cgroup refused {hits} new process(es) or thread(s) at pids.max, max_pids={self.max_pids}"

    def _death_message(self, oom: bool, code: int | None, peak: float | None) -> str:
        where = f"instance {self.id} (pid {self.pid})"
        if oom:
            how = (
                self.fate.over_memory
                or f"the kernel killed it (cgroup oom_kill counter went up, {_describe_exit(code)})"
            )
            peak_text = f"; peak {peak:.0f} MiB" if peak else ""
            return f"{where} went over memory_mb={self.limits.memory_mb}: {how}{peak_text}"
        if self.fate.killed:
            return f"{where} was killed by the runtime: {self.fate.killed}"
        return f"{where} ended during the call: {_describe_exit(code)}"


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    return f"exited with status {code}"


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
