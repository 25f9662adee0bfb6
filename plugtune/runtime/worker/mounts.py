"""A plugin's view of the file system: a private mount namespace, entered by its zygote (or a
fresh-spawned worker) while still root, after the network step and before the uid drop.

* Python stays importable by the function's uid: each folder the interpreter needs (its prefixes,
  ``sys.path``, plugtune) that lies below a directory other users cannot traverse (a Python under
  a 0700 ``/root``) is bound read-only into a small tmpfs mounted over that directory, so the rest
  of it (root's dotfiles, keys, caches) is hidden from plugins;
* ``/tmp``, ``/var/tmp`` and ``/dev/shm`` are the function's own tmpfs of ``tmp_mb`` each: the
  host's world-writable ones can neither be read nor filled; the runtime's folders under them that
  the worker needs (its temp root, its snapshot, the policy bridge's socket) are bound back in at
  the same paths;
* ``/run`` (so ``/var/run`` and ``/run/lock``) is an empty root-owned tmpfs: no host socket
  (PostgreSQL's, MariaDB's, D-Bus), pid or lock file is reachable by path; only what the worker
  needs below it is bound back (``/etc/resolv.conf``'s target, a kept folder);
* a private IPC namespace (System V and POSIX message queues of its own, a fresh ``/dev/mqueue``);
* ``/proc`` is a fresh procfs with ``hidepid=invisible`` where the kernel gives each mount its own
  options (5.8+): the function's uid sees its own processes only, not other jobs' command lines.

Mounts made here never reach the host (the namespace is a slave of it); the instances' tmpfs that
the supervisor mounts later in its shared temp root do reach here. Stdlib only: the supervisor runs
this file as a script (``probe``) to learn whether this host can do it at all.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import stat
import sys
from typing import Any

CLONE_NEWNS, CLONE_NEWIPC = 0x20000, 0x8000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_SLAVE, MS_SHARED = 4096, 16384, 1 << 19, 1 << 20
SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm")  # each the function's own tmpfs of tmp_mb
HOST_RUN = ("/run", "/var/run", "/var/lock")  # covered by an empty tmpfs: host sockets, pids, locks
REVEAL_FILES = ("/etc/resolv.conf",)  # bound back read-only where they point below a cover
HIDDEN_PROC = "hidepid=invisible"  # a string value only kernels with per-mount proc options accept
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PROBE_UID = 65534  # nobody: the probe only needs some uid that is not root


class MountError(Exception):
    """The mount namespace could not be made; the message says which step and why."""


def enter_mounts(config: dict[str, Any]) -> None:
    """Enter the view the config's ``mounts`` plan asks for (nothing when there is none)."""
    plan = config.get("mounts")
    if not plan:
        return
    keep = [*plan.get("keep", []), str(config.get("code_root") or ""), str(config.get("tmp_dir") or "")]
    bridge = (config.get("network") or {}).get("bridge")
    if bridge:
        keep.append(os.path.dirname(str(bridge)))  # a Unix socket is found by its path
    build_view(interpreter_paths(), [k for k in keep if k], int(plan["tmp_mb"]), bool(plan.get("hide_pids")))


def interpreter_paths() -> list[str]:
    """The folders this interpreter imports from (not ``sys.path[0]``: the start folder of ``-m``)."""
    wanted = {sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix, PACKAGE_ROOT, *sys.path[1:]}
    return sorted({os.path.realpath(p) for p in wanted if p and os.path.isabs(p) and os.path.exists(p)})


def closed_ancestor(path: str) -> str | None:
    """The topmost folder above ``path`` that other users cannot traverse (None: all open)."""
    parts = path.strip("/").split("/")
    for i in range(1, len(parts)):
        folder = "/" + "/".join(parts[:i])
        try:
            if not os.stat(folder).st_mode & stat.S_IXOTH:
                return folder
        except OSError:
            return None
    return None


def plan_view(reveal: list[str], keep: list[str]) -> tuple[list[str], dict[str, bool]]:
    """What to cover with a tmpfs, and which paths to bind back (path -> read-only)."""
    tops = own_tmp() + [r for r in _real_dirs(HOST_RUN) if not any(_below(r, t) for t in own_tmp())]
    tops = [t for t in tops if not any(o != t and _below(t, o) for o in tops)]
    covers = {c for c in map(closed_ancestor, reveal) if c}
    covers = {c for c in covers if not any(_below(c, t) for t in tops)}
    covers |= set(tops)
    binds: dict[str, bool] = {}
    kept = [os.path.realpath(k) for k in keep if os.path.exists(k)]
    shown = [os.path.realpath(f) for f in REVEAL_FILES if os.path.exists(f)]
    for path, read_only in [*((p, True) for p in [*reveal, *shown]), *((k, False) for k in kept)]:
        if path in covers or not any(_below(path, c) for c in covers):
            continue  # visible as it is (or it is the very folder being hidden)
        binds[path] = binds.get(path, True) and read_only
    outer = {p: ro for p, ro in binds.items() if not any(q != p and _below(p, q) for q in binds)}
    return sorted(covers), outer


def own_tmp() -> list[str]:
    """The host's shared temp folders as they resolve here (``/var/tmp`` may be ``/tmp``)."""
    return _real_dirs(SHARED_TMP)


def build_view(reveal: list[str], keep: list[str], tmp_mb: int, hide_pids: bool = False) -> None:
    """A new mount namespace (and IPC namespace): covers over closed folders, the shared temp
    folders and ``/run``, with the paths the worker needs bound back in; with ``hide_pids``, a
    ``/proc`` that shows only the processes of the uid looking."""
    covers, binds = plan_view(reveal, keep)
    own = own_tmp()
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.unshare(CLONE_NEWNS | CLONE_NEWIPC) != 0:
        raise MountError(f"unshare(CLONE_NEWNS | CLONE_NEWIPC) failed: {_errno_text()}")
    _mount(libc, b"none", "/", None, MS_REC | MS_SLAVE, None)  # nothing made here reaches the host
    sources = {path: os.open(path, os.O_PATH | os.O_CLOEXEC) for path in binds}  # before they are covered
    try:
        if hide_pids:
            _mount(libc, b"proc", "/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, HIDDEN_PROC)
        if os.path.isdir("/dev/mqueue"):  # this IPC namespace's queues, not the host's
            _mount(libc, b"mqueue", "/dev/mqueue", b"mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
        for cover in covers:
            size = f"size={tmp_mb}m,mode=1777,nr_inodes=65536" if cover in own else "size=1m,mode=0755"
            _mount(libc, b"plugtune-view", cover, b"tmpfs", MS_NOSUID | MS_NODEV, size)
        for path, read_only in binds.items():
            _recreate(path, sources[path])
            _mount(libc, f"/proc/self/fd/{sources[path]}".encode(), path, None, MS_BIND | MS_REC, None)
            if read_only:
                _mount(libc, b"none", path, None, MS_BIND | MS_REMOUNT | MS_RDONLY, None)
    finally:
        for fd in sources.values():
            os.close(fd)


def share(libc: Any, path: str) -> None:
    """Make ``path`` a shared mount point (bound onto itself) so mounts below it reach namespaces
    made later: the supervisor's temp root, where each instance's tmpfs is mounted."""
    _mount(libc, path.encode(), path, None, MS_BIND, None)
    _mount(libc, b"none", path, None, MS_SHARED, None)


def _recreate(path: str, fd: int) -> None:
    umask = os.umask(0o022)  # these modes, whatever umask the runtime has (an attempt's is 077)
    try:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            os.makedirs(path, mode=0o755, exist_ok=True)
        else:
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
    finally:
        os.umask(umask)


def _mount(libc: Any, source: bytes, target: str, fstype: bytes | None, flags: int, data: str | None) -> None:
    options = data.encode() if data is not None else None
    if libc.mount(source, target.encode(), fstype, flags, options) != 0:
        raise MountError(f"mount on {target} failed: {_errno_text()}")


def _errno_text() -> str:
    import errno

    code = ctypes.get_errno()
    return f"{errno.errorcode.get(code, code)}: {os.strerror(code)}"


def _real_dirs(paths: tuple[str, ...]) -> list[str]:
    return sorted({os.path.realpath(p) for p in paths if os.path.isdir(p)})


def _below(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def probe(hide_pids: bool) -> None:
    """Enter a view as a worker would, become an unprivileged uid, import lazily: exit 0 when it
    worked, else exit 1 with the reason on stderr. With ``hide_pids``, also check that the fresh
    ``/proc`` hides a process of another uid (this one's parent, the supervisor)."""
    try:
        build_view(interpreter_paths(), [], 1, hide_pids)
        os.setgroups([])
        os.setresgid(PROBE_UID, PROBE_UID, PROBE_UID)
        os.setresuid(PROBE_UID, PROBE_UID, PROBE_UID)
        import encodings.idna  # noqa: F401 - loaded lazily, like what plugins import
        import json.decoder  # noqa: F401

        if hide_pids and (os.path.exists(f"/proc/{os.getppid()}") or not os.path.exists("/proc/self/status")):
            raise MountError("the fresh /proc still shows other users' processes")
    except (MountError, OSError, ImportError) as exc:
        sys.exit(f"{type(exc).__name__}: {exc}")


if __name__ == "__main__" and sys.argv[1:2] == ["probe"]:
    probe(sys.argv[2:] == ["hide-pids"])
