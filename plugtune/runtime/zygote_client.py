"""The supervisor's handle on a function's zygote, and the fresh-spawn fallback.

``start()`` launches ``python -m plugtune.runtime.worker zygote FD`` which imports the plugin and
answers with its spec (or the import error). ``fork()`` hands the zygote an instance's socket and
output pipe and gets the child's pid back in a few milliseconds.

A worker starts as root (it enters its sandbox, then drops to the function's uid), so nothing of
the job reaches its exec: its environment is the allow-list alone (:func:`worker_env`), and its
config (with the job's ``env``/``secrets``) arrives through an inherited file descriptor
(:func:`config_file`), never in argv, which ``/proc/PID/cmdline`` shows every user; it starts in
``/``, as ``python -m`` imports from its working folder first. The job's variables are set by the
worker after the uid drop.
"""

from __future__ import annotations

import array
import asyncio
import json
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

from plugtune.runtime import protocol as p
from plugtune.runtime.backend import DeployFailed
from plugtune.runtime.limits import InstanceLimits
from plugtune.runtime.sandbox import scrubbed_env
from plugtune.types import LogLine

PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def worker_env(config: dict[str, Any]) -> dict[str, str]:
    """A worker's whole exec environment: the allow-list (see :mod:`..sandbox`), HOME/TMPDIR its own
    folder; never the config's ``env`` (the worker applies that once it is the function's uid)."""
    out = scrubbed_env(PACKAGE_ROOT)
    if config.get("tmp_dir"):
        out["HOME"] = out["TMPDIR"] = str(config["tmp_dir"])
    return out


def config_file(config: dict[str, Any]) -> int:
    """A file descriptor (at offset 0) holding ``config`` as JSON, reachable only through the fd:
    a memfd, else an unlinked temp file. The caller passes it to the worker and closes it."""
    data = json.dumps(config).encode()
    try:
        fd = os.memfd_create("plugtune-worker-config", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        fd = os.dup(tempfile.TemporaryFile().fileno())  # noqa: SIM115 - the fd outlives the file object
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


async def start_worker(
    mode: str, config: dict[str, Any], keep_fds: tuple[int, ...], out: int
) -> asyncio.subprocess.Process:
    """``python -m plugtune.runtime.worker MODE FD``: FD carries ``config``; ``keep_fds`` are passed on."""
    fd = config_file(config)
    try:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "plugtune.runtime.worker",
            mode,
            str(fd),
            pass_fds=(fd, *keep_fds),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT if out == asyncio.subprocess.PIPE else out,
            env=worker_env(config),
            cwd="/",  # `-m` imports from the working folder first: never one a submitter filled
            start_new_session=True,
        )
    finally:
        os.close(fd)


class Zygote:
    """``limits``: the zygote's own cgroup (its instances' limits: the module's code runs here); what
    is left in it (a daemon the import forked) is killed with the zygote."""

    def __init__(self, config: dict[str, Any], plugin: str, limits: InstanceLimits | None = None) -> None:
        self.config = config
        self.plugin = plugin
        self.limits = limits
        self.loop = asyncio.get_running_loop()
        self.spec: asyncio.Future[dict[str, Any]] = self.loop.create_future()
        self.forks: dict[str, asyncio.Future[int]] = {}
        self.exits: dict[int, asyncio.Future[int | None]] = {}
        self.alive = False
        self.output: list[str] = []
        self.proc: asyncio.subprocess.Process | None = None
        self.sock: socket.socket | None = None
        self._reader: asyncio.Task[None] | None = None
        self.transport: asyncio.BaseTransport | None = None

    async def start(self, timeout_s: float) -> dict[str, Any]:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        config = {**self.config, "control_fd": child.fileno()}
        try:
            self.proc = await start_worker("zygote", config, (child.fileno(),), asyncio.subprocess.PIPE)
        finally:
            child.close()
        self.sock = parent
        self.alive = True
        reader = p.FrameReader(p.MAX_FRAME)  # the zygote ran the plugin's import: trust no length
        zygote = self

        class Conn(asyncio.Protocol):
            def data_received(self, data: bytes) -> None:
                try:
                    for message in reader.feed(data):
                        zygote.on_message(message)
                except p.ProtocolError:
                    pass
                if reader.broken:
                    zygote.output.append(f"it sent a frame the runtime refuses: {reader.broken}")
                    zygote.stop()

            def connection_lost(self, exc: Exception | None) -> None:
                zygote.on_lost()

        self.transport, _ = await self.loop.create_unix_connection(Conn, sock=parent)
        self._reader = self.loop.create_task(self._read_output())
        try:
            return await asyncio.wait_for(asyncio.shield(self.spec), timeout_s)
        except asyncio.TimeoutError:
            self.stop()
            raise DeployFailed(
                f"{self.config['relpath']}: importing the plugin took longer than {timeout_s:g} s "
                "(does it do slow work at import time? move it into setup())"
            ) from None

    async def _read_output(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for raw in self.proc.stdout:
            self.output.append(raw.decode(errors="replace").rstrip("\n"))
            del self.output[:-200]

    def output_logs(self) -> list[LogLine]:
        import time

        return [
            LogLine(time.time(), "WARNING", self.plugin, t, "stderr", instance_id="zygote")
            for t in self.output
        ]

    def on_message(self, message: list[Any]) -> None:
        op = message[0]
        if op == p.LOADED and not self.spec.done():
            self.spec.set_result(p.Loaded(*message[1:]).spec)
        elif op == p.FATAL and not self.spec.done():
            fatal = p.Fatal(*message[1:])
            self.spec.set_exception(DeployFailed(fatal.message, fatal.traceback))
        elif op == p.FORKED:
            forked = p.Forked(*message[1:])
            future = self.forks.pop(forked.instance_id, None)
            if future is not None and not future.done():
                future.set_result(int(forked.pid))
        elif op == p.EXITED:
            exited = p.Exited(*message[1:])
            status = self.exit_future(int(exited.pid))
            if not status.done():
                status.set_result(int(exited.exit_code))

    def exit_future(self, pid: int) -> asyncio.Future[int | None]:
        """The exit status of child ``pid`` (it may already be known: a child can die at once)."""
        future = self.exits.get(pid)
        if future is None:
            future = self.exits[pid] = self.loop.create_future()
        return future

    def forget(self, pid: int) -> None:
        self.exits.pop(pid, None)

    def on_lost(self) -> None:
        self.alive = False
        for future in self.forks.values():
            if not future.done():
                future.set_exception(ConnectionError("the zygote ended"))
        if not self.spec.done():
            self.loop.create_task(self._fail_start())

    async def _fail_start(self) -> None:
        if self.proc is not None:
            await asyncio.wait([self.loop.create_task(self.proc.wait())], timeout=1.0)
        await asyncio.sleep(0.05)
        text = "\n".join(self.output[-30:])
        if not self.spec.done():
            self.spec.set_exception(
                DeployFailed(f"the plugin's process ended while importing it:\n{text}", text)
            )

    async def fork(self, instance: dict[str, Any], sock_fd: int, out_fd: int, timeout_s: float = 10.0) -> int:
        """Fork an instance; returns its pid."""
        if not self.alive or self.sock is None:
            raise ConnectionError("the zygote is not running")
        future = self.forks[instance["instance_id"]] = self.loop.create_future()
        fds = array.array("i", [sock_fd, out_fd])
        self.sock.sendmsg(
            [p.pack([p.FORK, *p.Fork(instance)])], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())]
        )
        return await asyncio.wait_for(future, timeout_s)

    async def aclose(self) -> None:
        self.stop()
        if self.proc is not None:
            try:
                await asyncio.wait_for(self.proc.wait(), 2.0)
            except asyncio.TimeoutError:
                pass
        if self._reader is not None:
            self._reader.cancel()
        for _ in range(100):
            if self.limits is None or self.limits.remove():
                break
            self.limits.kill_all()
            await asyncio.sleep(0.02)

    def stop(self) -> None:
        self.alive = False
        if self.transport is not None:
            self.transport.close()  # closes the socket too, and unregisters it from the loop
        if self.proc is not None and self.proc.returncode is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass
        if self.limits is not None:
            self.limits.kill_all()


async def spawn(config: dict[str, Any], sock_fd: int, out_fd: int) -> asyncio.subprocess.Process:
    """Start an instance as a fresh interpreter (the fallback when the zygote is gone)."""
    return await start_worker("spawn", {**config, "sock_fd": sock_fd}, (sock_fd,), out_fd)
