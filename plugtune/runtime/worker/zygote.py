"""The per-function zygote: imports the plugin once, then forks an instance per request.

It stays single-threaded and never starts an event loop, so a fork copies a clean process. The
supervisor sends ``[FORK, config]`` with two file descriptors attached (the instance's socket and
the write end of its stdout/stderr pipe); the zygote answers ``[FORKED, instance_id, pid]`` and,
when a child ends, ``[EXITED, pid, exit_code]`` (negative: killed by that signal).

It enters its own limits before the import and is sealed after it (see :mod:`.sandbox`). It runs
the plugin's module code, so the supervisor takes its FORKED pid as a claim, checked against the
kernel (``runtime/launcher.py``), never as a fact.
"""

from __future__ import annotations

import array
import os
import select
import signal
import socket
import sys
from typing import Any

from plugtune.runtime.protocol import (
    EXITED,
    FATAL,
    FORK,
    FORKED,
    LOADED,
    STOP,
    Exited,
    Fork,
    Forked,
    FrameReader,
    Loaded,
)
from plugtune.runtime.worker.channel import Channel
from plugtune.runtime.worker.loader import LoadError, Plugin, load
from plugtune.runtime.worker.mounts import MountError, enter_mounts
from plugtune.runtime.worker.sandbox import (
    SandboxError,
    drop_privileges,
    enter_instance,
    enter_network,
    refuse_namespaces,
    seal_zygote,
    set_rlimits,
)
from plugtune.runtime.worker.serve import enter_limits, reseed, serve
from plugtune.runtime.worker.watch import install_net_counter

LOADER_PREFIXES = ("LD_", "PYTHON", "MALLOC_")
LOADER_NAMES = frozenset(
    {
        "GCONV_PATH",
        "GETCONF_DIR",
        "GLIBC_TUNABLES",
        "HOSTALIASES",
        "LOCPATH",
        "NLSPATH",
        "RES_OPTIONS",
        "RESOLV_HOST_CONF",
        "TZDIR",
    }
)


def enter_sandbox(config: dict[str, Any], channel: Channel) -> None:
    """The environment is scrubbed already; then the network, the mount namespace (the files it
    sees), then the function's own user."""
    try:
        enter_network(config)
        enter_mounts(config)
        drop_privileges(config)
        refuse_namespaces()  # best effort: a host without seccomp filters keeps the kernel's rules
    except LoadError as exc:  # the network step's NetworkUnavailable says what to do itself
        channel.send([FATAL, exc.message, exc.traceback])
        os._exit(2)
    except (SandboxError, MountError) as exc:
        channel.send([FATAL, f"the plugin's sandbox could not be entered: {exc}", ""])
        os._exit(2)


def load_or_report(config: dict[str, Any], channel: Channel) -> Plugin:
    install_net_counter()
    try:
        os.chdir(config["code_root"])
    except OSError as exc:
        channel.send([FATAL, f"the plugin's code folder {config['code_root']} is not readable: {exc}", ""])
        os._exit(2)
    apply_env(config, channel)
    try:
        return load(
            config["code_root"], config["relpath"], config["function"], str(config.get("adapt") or "")
        )
    except LoadError as exc:
        channel.send([FATAL, exc.message, exc.traceback])
        os._exit(2)


def apply_env(config: dict[str, Any], channel: Channel) -> None:
    """Set the function's ``env`` (job.yaml ``env:``/``secrets:``, ``deploy(env=...)``): the only way
    it reaches a worker, once the worker is the function's uid. HOME/TMPDIR stay the sandbox's."""
    env = config.get("env") or {}
    if env and config.get("user") and os.geteuid() == 0:
        channel.send([FATAL, "internal error: the function's env would be set before the uid drop", ""])
        os._exit(2)
    refused = sorted(name for name in env if is_loader_variable(name))
    if refused:
        channel.send(
            [
                FATAL,
                f"env: {', '.join(refused)} refused: loader and interpreter variables (LD_*, PYTHON*, "
                "MALLOC_*, GCONV_PATH, GLIBC_TUNABLES, ...) change how the platform's own processes "
                "run; remove them from job.yaml env:/secrets: (or deploy(env=...)) and set what the "
                "plugin needs in its own code",
                "",
            ]
        )
        os._exit(2)
    os.environ.update(
        {k: str(v) for k, v in env.items() if k not in ("HOME", "TMPDIR") and not k.startswith("PLUGTUNE_")}
    )


def is_loader_variable(name: str) -> bool:
    """A variable the dynamic loader, libc or Python reads at start (glibc's unsecure-envvars list)."""
    return name.startswith(LOADER_PREFIXES) or name in LOADER_NAMES


def spec_message(plugin: Plugin) -> list[Any]:
    spec = plugin.spec
    loaded = Loaded(
        {
            "kind": spec.kind.value,
            "name": spec.name,
            "weight": spec.weight,
            "is_async": spec.is_async,
            "runtime": spec.runtime.to_dict(),
            "has_setup": plugin.setup is not None,
        }
    )
    return [LOADED, *loaded]


def zygote_main(config: dict[str, Any]) -> None:
    control = socket.socket(fileno=int(config["control_fd"]))
    channel = Channel(control)
    limits = config.get("zygote_limits") or {}
    enter_limits(limits)  # still root: its cgroup holds the import's memory and processes
    enter_sandbox(config, channel)
    set_rlimits(limits.get("rlimits") or {})
    plugin = load_or_report(config, channel)
    try:
        seal_zygote()
    except SandboxError as exc:
        channel.send([FATAL, str(exc), ""])
        os._exit(2)
    channel.send(spec_message(plugin))
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    reader = FrameReader()
    fds: list[int] = []
    while True:
        try:
            ready, _, _ = select.select([control.fileno(), wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap(channel)
        if control.fileno() not in ready:
            continue
        data, new_fds = _recv_with_fds(control)
        if not data:
            os._exit(0)
        fds.extend(new_fds)
        for message in reader.feed(data):
            if message[0] == FORK and len(fds) >= 2:
                fork = Fork(*message[1:])
                sock_fd, out_fd = fds.pop(0), fds.pop(0)
                pid = os.fork()
                if pid == 0:
                    _child(plugin, fork.config, sock_fd, out_fd, control, (wake_r, wake_w))
                os.close(sock_fd)
                os.close(out_fd)
                channel.send([FORKED, *Forked(fork.config["instance_id"], pid)])
            elif message[0] == STOP:
                os._exit(0)


def _recv_with_fds(sock: socket.socket) -> tuple[bytes, list[int]]:
    fds = array.array("i")
    data, ancdata, _flags, _addr = sock.recvmsg(1 << 16, socket.CMSG_LEN(16 * fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
    return data, list(fds)


def _reap(channel: Channel) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        channel.send([EXITED, *Exited(pid, os.waitstatus_to_exitcode(status))])


def _child(
    plugin: Plugin,
    config: dict[str, Any],
    sock_fd: int,
    out_fd: int,
    control: socket.socket,
    close: tuple[int, ...],
) -> None:
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        control.close()
        for fd in close:
            os.close(fd)
        os.dup2(out_fd, 1)  # first: a failure to enter the limits below is the instance's own output
        os.dup2(out_fd, 2)
        os.close(out_fd)
        enter_limits(config)
        enter_instance(config)
        os.setsid()
        _close_other_fds(keep={0, 1, 2, sock_fd})
        reseed()
        serve(plugin, socket.socket(fileno=sock_fd), config)
    except BaseException as exc:  # noqa: BLE001 - the child must never return into the zygote loop
        try:
            os.write(2, f"plugtune instance failed to start: {type(exc).__name__}: {exc}\n".encode())
        finally:
            os._exit(4)


def _close_other_fds(keep: set[int]) -> None:
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def spawn_main(config: dict[str, Any]) -> None:
    """Fresh-spawn fallback: this process loads the plugin itself and becomes the instance."""
    sock = socket.socket(fileno=int(config["sock_fd"]))
    channel = Channel(sock)
    enter_limits(config)  # still root here: the cgroup's files are the runtime's
    enter_sandbox(config, channel)
    enter_instance(config)
    plugin = load_or_report(config, channel)
    reseed()
    serve(plugin, sock, config)


def main(argv: list[str]) -> None:
    """``zygote|spawn FD``: the config is read from the inherited descriptor FD (never argv)."""
    mode, config = argv[1], read_config(int(argv[2]))
    if mode == "zygote":
        zygote_main(config)
    elif mode == "spawn":
        spawn_main(config)
    else:
        sys.exit(f"unknown worker mode {mode!r}")


def read_config(fd: int) -> dict[str, Any]:
    """The worker's config, read from the descriptor the supervisor passed, which is then closed."""
    import json

    with os.fdopen(fd, "rb") as f:
        data: dict[str, Any] = json.loads(f.read())
    return data
