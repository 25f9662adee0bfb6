"""What function runtimes that ended without closing (a killed attempt) left on this machine.

A runtime gives back what its functions hold when it closes; a runtime that was killed cannot. Two
things outlive it, and both name the runtime's process, so they are found from the kernel and the
file system, in any process (the console's, the CLI's), not from the runtime's memory:

* uid leases: ``/run/plugtune/uids/UID`` holds the pid of the runtime that leased UID to a function
  (root only; see :mod:`.sandbox`). A lease whose holder is gone is stale; a process of its uid
  (a daemon the plugin started, an instance that did not notice) is a leftover of that function.
  The next runtime that happens to draw the same uid would end them; nothing else does.
* cgroups: a runtime's instances live in ``plugtune-PID-*`` below the cgroup the runtime was
  started in (see :mod:`.limits`). Empty ones are removed when a runtime starts there; one of a
  gone PID that still holds processes is left. Only the hierarchies' places below this process's
  own cgroup are looked at (the place a runtime started by the same server uses), and the root.

:func:`find` lists them; :func:`end` ends their processes and removes the lease files and cgroups.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from plugtune.runtime.limits import CGROUP_ROOT, InstanceLimits, _own_paths, _v1_mount
from plugtune.runtime.processes import SWEEP_S, of_uid, pids, read_status, sweep
from plugtune.runtime.sandbox import LEASES


@dataclass(frozen=True)
class Lease:
    """A plugin uid leased by runtime process ``holder``; ``processes``: pids of the uid now."""

    uid: int
    holder: int
    holder_alive: bool
    processes: tuple[int, ...]
    leased_at_ns: int = 0  # when its file was written: a runtime leases its functions' uids in deploy order

    @property
    def is_stale(self) -> bool:
        return not self.holder_alive


@dataclass(frozen=True)
class StaleCgroup:
    """A cgroup of runtime process ``holder`` (gone) that still holds ``processes``."""

    path: Path
    holder: int
    processes: tuple[int, ...]


@dataclass(frozen=True)
class Leftovers:
    leases: tuple[Lease, ...]
    cgroups: tuple[StaleCgroup, ...]

    @property
    def stale_leases(self) -> tuple[Lease, ...]:
        return tuple(lease for lease in self.leases if lease.is_stale)


@dataclass(frozen=True)
class Ended:
    """What :func:`end` did: uids given back, processes ended, cgroups removed, and what it could not."""

    uids: tuple[int, ...]
    processes: tuple[int, ...]
    cgroups: tuple[str, ...]
    problems: tuple[str, ...]


def is_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (a pid reused by another process counts: leave it be)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def leases(root: Path = LEASES) -> list[Lease]:
    """Every uid lease on this machine, with its holder and the processes of its uid (sorted by uid)."""
    if not root.is_dir():
        return []
    by_uid: dict[int, list[int]] = {}
    for pid in pids():
        status = read_status(pid)
        if status is not None and not status.zombie:
            by_uid.setdefault(status.uid, []).append(pid)
    try:
        files = sorted(root.iterdir())
    except OSError:  # not root: the leases are root's (and no uid was leased by this user's runtimes)
        return []
    out = []
    for path in files:
        if not path.name.isdigit():
            continue
        try:
            holder = int(path.read_text() or "0")
            written = path.stat().st_mtime_ns
        except (OSError, ValueError):
            continue  # being written by a runtime right now
        uid = int(path.name)
        procs = tuple(sorted(by_uid.get(uid, [])))
        out.append(Lease(uid, holder, is_alive(holder), procs, written))
    return sorted(out, key=lambda lease: lease.uid)


def cgroups() -> list[StaleCgroup]:
    """Instance cgroups of runtimes whose process is gone that still hold processes."""
    out = []
    for parent in _parents():
        for runtime_dir in sorted(parent.glob("plugtune-*")):
            holder = _holder_of(runtime_dir.name)
            if holder is None or is_alive(holder) or not runtime_dir.is_dir():
                continue
            for child in sorted(c for c in runtime_dir.iterdir() if c.is_dir()):
                procs = _members(child)
                if procs:
                    out.append(StaleCgroup(child, holder, tuple(procs)))
    return out


def find() -> Leftovers:
    return Leftovers(tuple(leases()), tuple(cgroups()))


def end(found: Leftovers, within_s: float = SWEEP_S) -> Ended:
    """End every process of each stale lease's uid and of each stale cgroup, then remove the lease
    files and the (now empty) cgroups. A lease or cgroup whose processes outlive ``within_s`` is
    kept and named in ``problems``. Live runtimes' leases are never touched."""
    uids: list[int] = []
    killed: list[int] = []
    removed: list[str] = []
    problems: list[str] = []
    for cg in found.cgroups:
        version = 2 if (cg.path / "cgroup.kill").exists() or (cg.path / "memory.max").exists() else 1
        limits = InstanceLimits(memory_mb=0, memory_dir=cg.path, dirs=[cg.path], version=version)
        limits.kill_all()
        killed.extend(cg.processes)
    for lease in found.stale_leases:
        if is_alive(lease.holder):  # its runtime came back to life under that pid: not ours to end
            continue
        left = sweep(of_uid(lease.uid), within_s)
        killed.extend(p for p in lease.processes if p not in left)
        if left:
            problems.append(
                f"uid {lease.uid}: {len(left)} process(es) still run after {within_s:.1f} s "
                f"(pids {' '.join(map(str, left[:10]))}); its lease is kept"
            )
            continue
        (LEASES / str(lease.uid)).unlink(missing_ok=True)
        uids.append(lease.uid)
    for cg in found.cgroups:
        removed_here = _remove_when_empty(cg.path, within_s)
        if removed_here:
            removed.append(str(cg.path))
        else:
            problems.append(f"cgroup {cg.path}: processes are still in it; it is kept")
    return Ended(tuple(uids), tuple(sorted(set(killed))), tuple(removed), tuple(problems))


def _remove_when_empty(path: Path, within_s: float) -> bool:
    import time

    deadline = time.monotonic() + max(within_s, 0.1)
    while True:  # ends: by the deadline
        if not _members(path):
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                return False
            try:
                path.parent.rmdir()  # the runtime's own folder, once its last instance's is gone
            except OSError:
                pass
            _remove_v1_twins(path)
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def _remove_v1_twins(memory_path: Path) -> None:
    """On cgroup v1 an instance also has folders of the same name in the cpu and pids hierarchies
    (empty once its processes ended): remove them with it."""
    own = _own_paths()
    relative = Path(memory_path.parent.name) / memory_path.name
    for controller in ("cpu", "pids"):
        mount = _v1_mount(controller)
        if mount is None or controller not in own:
            continue
        twin = mount / own[controller].lstrip("/") / relative
        for folder in (twin, twin.parent):
            try:
                folder.rmdir()
            except OSError:
                pass


def _holder_of(name: str) -> int | None:
    parts = name.split("-")
    return int(parts[1]) if len(parts) >= 3 and parts[1].isdigit() else None


def _members(path: Path) -> list[int]:
    try:
        return [int(x) for x in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _parents() -> list[Path]:
    """Where runtimes make their cgroups: below this process's own cgroup (the memory controller's
    on cgroup v1, the unified one on v2), and the hierarchy's root."""
    own = _own_paths()
    out: list[Path] = []
    v1 = _v1_mount("memory")
    if v1 is not None:
        out += [v1 / own.get("memory", "/").lstrip("/"), v1]
    unified = CGROUP_ROOT / "unified" if (CGROUP_ROOT / "unified" / "cgroup.procs").exists() else CGROUP_ROOT
    if (unified / "cgroup.controllers").exists():
        out += [unified / own.get("", "/").lstrip("/"), unified]
    return list(dict.fromkeys(p for p in out if p.is_dir()))


@dataclass(frozen=True)
class FunctionProcess:
    """A process of a plugin uid (a zygote, an instance, or what one started), with its gid (its
    snapshot's: :func:`plugtune.runtime.sandbox.group_of`) and resident memory."""

    pid: int
    ppid: int
    uid: int
    gid: int
    rss_mb: float


def processes_of(uids: set[int]) -> list[FunctionProcess]:
    """The running processes (not zombies) whose real uid is one of ``uids``, by pid."""
    import psutil

    out = []
    for proc in psutil.process_iter(["pid", "ppid", "uids", "gids", "memory_info", "status"]):
        info = proc.info
        uids_, gids, memory = info.get("uids"), info.get("gids"), info.get("memory_info")
        if uids_ is None or gids is None or uids_.real not in uids or info.get("status") == "zombie":
            continue
        rss = memory.rss / (1 << 20) if memory is not None else 0.0
        out.append(FunctionProcess(info["pid"], info["ppid"], uids_.real, gids.real, round(rss, 1)))
    return sorted(out, key=lambda p: p.pid)
