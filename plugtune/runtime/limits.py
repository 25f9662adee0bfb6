"""Resource limits per instance (and per zygote: the plugin's module code runs there, under its
instances' limits): a cgroup child of the runtime's own cgroup, or rlimits.

``detect()`` picks what this host allows: cgroup v2 (``memory.max``/``cpu.max``/``pids.max`` where a
unified hierarchy has the controllers), cgroup v1 (memory + cpu quota + pids), else
``RLIMIT_DATA`` plus the supervisor's RSS watchdog. Instances never leave the cgroup the runtime
was started in: their cgroups are created below it.
"""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from plugtune.runtime.processes import signal_verified
from plugtune.sdk import Runtime

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000
MIB = 1 << 20
#: Threads the runtime itself runs in an instance (reader, deputy, watchdogs), on top of max_pids.
RUNTIME_TASKS = 16

NOFILE = 4096  # open files per instance (RLIMIT_NOFILE); more with a large max_concurrency

CGROUP_V1, CGROUP_V2, RLIMIT = "cgroup-v1", "cgroup-v2", "rlimit+watchdog"


@dataclass
class InstanceLimits:
    """The limits of one instance; the child process enters them itself (``cgroup_procs``)."""

    memory_mb: int
    cgroup_procs: list[str] = field(default_factory=list)
    rlimit_data: int | None = None
    memory_dir: Path | None = None
    dirs: list[Path] = field(default_factory=list)
    version: int = 0
    pids_dir: Path | None = None  # where pids.max is set (None: no pids controller)

    @property
    def watchdog(self) -> bool:
        return self.memory_dir is None

    def oom_kills(self) -> int:
        if self.memory_dir is None:
            return 0
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        return _read_key(self.memory_dir / name, "oom_kill")

    def pids_hits(self) -> int:
        """How often the instance was refused a new process or thread by its pids.max."""
        return _read_key(self.pids_dir / "pids.events", "max") if self.pids_dir else 0

    def usage_mb(self) -> float | None:
        name = "memory.usage_in_bytes" if self.version == 1 else "memory.current"
        return _read_mb(self.memory_dir / name) if self.memory_dir else None

    def peak_mb(self) -> float | None:
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        return _read_mb(self.memory_dir / name) if self.memory_dir else None

    def pids(self) -> list[int]:
        if self.memory_dir is None:
            return []
        try:
            return [int(x) for x in (self.memory_dir / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def kill_all(self) -> None:
        """Kill every process in the instance's cgroup (children that left the session too): at
        once by ``cgroup.kill``, else each member held by pidfd and checked to be in it still."""
        if self.memory_dir is not None and self.version == 2 and (self.memory_dir / "cgroup.kill").exists():
            _write(self.memory_dir / "cgroup.kill", "1")
            return
        for pid in self.pids():
            signal_verified(pid, lambda s: self.holds(s.pid))

    def holds(self, pid: int) -> bool:
        """Whether process ``pid`` is in this cgroup (its memory controller's)."""
        if self.memory_dir is None:
            return False
        tail = f"/{self.memory_dir.parent.name}/{self.memory_dir.name}"
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                lines = f.read().splitlines()
        except OSError:
            return False
        for line in lines:
            _, controllers, path = line.split(":", 2)
            wanted = "memory" in controllers.split(",") if self.version == 1 else controllers == ""
            if wanted and path.endswith(tail):
                return True
        return False

    def set_limits(self, memory_mb: int, pids: int) -> None:
        """Change its memory and pids limits (a zygote's, once its function's own are known)."""
        if self.memory_dir is not None:
            name = "memory.limit_in_bytes" if self.version == 1 else "memory.max"
            _write(self.memory_dir / name, str(memory_mb * MIB))
            self.memory_mb = memory_mb
        if self.pids_dir is not None:
            _write(self.pids_dir / "pids.max", str(pids))

    def remove(self) -> bool:
        """Remove the cgroup folders; False while processes are still in them."""
        ok = True
        for d in self.dirs:
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                ok = False
        return ok


def pids_max(max_pids: int, concurrency: int) -> int:
    """The instance's pids.max: what the plugin may start plus the runtime's own threads."""
    return max_pids + min(concurrency, 10_000) + RUNTIME_TASKS


def rlimits(runtime: Runtime, own_uid: bool, has_pids: bool) -> dict[str, int]:
    """Rlimits of a function's instances and zygote: open files, file size (the temp space's backstop)
    and, for a function with its own uid but no pids cgroup, its processes: RLIMIT_NPROC counts the
    whole uid, so it is only the backstop of the process watch (which holds each instance to its own
    limit)."""
    out = {"nofile": max(NOFILE, 4 * runtime.max_concurrency), "fsize": runtime.tmp_mb << 20}
    if own_uid and not has_pids:
        per_instance = pids_max(runtime.max_pids, runtime.max_concurrency)
        # four times every instance's share (+ the zygote and the spare): room for what one
        # instance starts while a busy host delays the watch, so the others can still start
        # threads meanwhile (at twice, 2 of 2,500 storm calls at load 9 could not)
        out["nproc"] = 4 * per_instance * (runtime.max_instances + 2)
    return out


class Limits:
    """Creates :class:`InstanceLimits`; one per runtime. ``uid``: the instance's own user, which
    then owns the files it writes itself into (so it can enter its cgroup after dropping root)."""

    mechanism = RLIMIT
    has_pids = False

    def instance(
        self, instance_id: str, memory_mb: int, cpu: float, concurrency: int, max_pids: int, uid: int | None
    ) -> InstanceLimits:
        # Thread stacks count against RLIMIT_DATA: leave room for the pool, the watchdog does the rest.
        headroom = 128 + 8 * min(concurrency, 64)
        return InstanceLimits(memory_mb=memory_mb, rlimit_data=(memory_mb + headroom) * MIB)

    def close(self) -> None:
        return None


class CgroupV1Limits(Limits):
    mechanism = CGROUP_V1

    def __init__(self, roots: dict[str, Path]) -> None:
        self.roots = roots  # controller -> this runtime's folder in that hierarchy
        self.has_pids = "pids" in roots

    def instance(
        self, instance_id: str, memory_mb: int, cpu: float, concurrency: int, max_pids: int, uid: int | None
    ) -> InstanceLimits:
        dirs = {name: root / instance_id for name, root in self.roots.items()}
        for d in dirs.values():
            _mkdir(d)
        _write(dirs["memory"] / "memory.limit_in_bytes", str(memory_mb * MIB))
        if "cpu" in dirs:
            _write(dirs["cpu"] / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(dirs["cpu"] / "cpu.cfs_quota_us", str(max(1000, int(cpu * CPU_PERIOD_US))))
        if "pids" in dirs:
            _write(dirs["pids"] / "pids.max", str(pids_max(max_pids, concurrency)))
        if uid is not None:
            for d in dirs.values():
                os.chown(d / "tasks", uid, -1)
        return InstanceLimits(
            memory_mb=memory_mb,
            # The single-threaded child writes "0" to each `tasks` file: moving only the calling
            # thread skips the kernel's global threadgroup lock that a write to cgroup.procs
            # takes (0.4 ms instead of 12-18 ms here); its only thread is the whole process.
            cgroup_procs=[str(d / "tasks") for d in dirs.values()],
            memory_dir=dirs["memory"],
            dirs=list(dirs.values()),
            version=1,
            pids_dir=dirs.get("pids"),
        )

    def close(self) -> None:
        for root in self.roots.values():
            for child in root.iterdir() if root.exists() else []:
                if child.is_dir():
                    try:
                        child.rmdir()
                    except OSError:
                        pass
            try:
                root.rmdir()
            except OSError as exc:
                log.warning("could not remove cgroup %s: %s", root, exc)


class CgroupV2Limits(Limits):
    mechanism = CGROUP_V2

    def __init__(self, root: Path, controllers: set[str]) -> None:
        self.root = root
        self.controllers = controllers
        self.has_pids = "pids" in controllers

    def instance(
        self, instance_id: str, memory_mb: int, cpu: float, concurrency: int, max_pids: int, uid: int | None
    ) -> InstanceLimits:
        d = self.root / instance_id
        _mkdir(d)
        _write(d / "memory.max", str(memory_mb * MIB))
        _write(d / "memory.swap.max", "0") if (d / "memory.swap.max").exists() else None
        if "cpu" in self.controllers:
            _write(d / "cpu.max", f"{max(1000, int(cpu * CPU_PERIOD_US))} {CPU_PERIOD_US}")
        if "pids" in self.controllers:
            _write(d / "pids.max", str(pids_max(max_pids, concurrency)))
        return InstanceLimits(
            memory_mb=memory_mb,
            cgroup_procs=[str(d / "cgroup.procs")],
            memory_dir=d,
            dirs=[d],
            version=2,
            pids_dir=d if self.has_pids else None,
        )

    def close(self) -> None:
        CgroupV1Limits({"memory": self.root}).close()


def detect(prefer: str | None = None) -> Limits:
    """The strongest limits this host lets the runtime set (``prefer``: "cgroup", "rlimit" or None)."""
    if prefer not in (None, "cgroup", "rlimit"):
        raise ValueError(f"limits={prefer!r}: use 'cgroup', 'rlimit' or None (auto)")
    chosen: Limits = Limits()
    if prefer != "rlimit":
        name = f"plugtune-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        for attempt in (_try_v2, _try_v1):
            try:
                found = attempt(name)
            except OSError as exc:
                log.debug("cgroup setup failed: %s", exc)
                found = None
            if found is not None:
                chosen = found
                break
        if prefer == "cgroup" and chosen.mechanism == RLIMIT:
            raise RuntimeError("limits='cgroup' was asked for, but no writable cgroup hierarchy was found")
    log.info("function runtime limits: %s", chosen.mechanism)
    return chosen


def _own_paths() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
    return out


def _try_v1(name: str) -> Limits | None:
    own = _own_paths()
    roots: dict[str, Path] = {}
    for controller in ("memory", "cpu", "pids"):
        mount = _v1_mount(controller)
        if mount is None or controller not in own:
            continue
        parent = mount / own[controller].lstrip("/")
        _remove_stale(parent)
        root = parent / name
        try:
            _mkdir(root)
        except OSError:
            if controller == "memory":
                raise
            continue
        roots[controller] = root
    if "memory" not in roots:
        return None
    return CgroupV1Limits(roots)


def _remove_stale(parent: Path) -> None:
    """Remove empty cgroups left by a runtime whose process is gone (it crashed before closing)."""
    for d in parent.glob("plugtune-*"):
        try:
            pid = int(d.name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if Path(f"/proc/{pid}").exists():
            continue
        for child in [c for c in d.iterdir() if c.is_dir()]:
            try:
                child.rmdir()
            except OSError:
                pass
        try:
            d.rmdir()
            log.info("removed the stale cgroup %s", d)
        except OSError:
            pass


def _v1_mount(controller: str) -> Path | None:
    for d in CGROUP_ROOT.iterdir() if CGROUP_ROOT.exists() else []:
        if controller in d.name.split(",") and (d / "cgroup.procs").exists() and not d.name == "unified":
            return d
    return None


def _try_v2(name: str) -> Limits | None:
    mount = CGROUP_ROOT if (CGROUP_ROOT / "cgroup.controllers").exists() else CGROUP_ROOT / "unified"
    own = _own_paths().get("")
    if own is None or not (mount / "cgroup.controllers").exists():
        return None
    base = mount / own.lstrip("/")
    available = set((base / "cgroup.controllers").read_text().split())
    if "memory" not in available:
        return None
    wanted = available & {"memory", "cpu", "pids"}
    _write(base / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(wanted)))
    root = base / name
    _mkdir(root)
    try:
        _write(root / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(wanted)))
    except OSError:
        root.rmdir()
        raise
    return CgroupV2Limits(root, wanted)


def _mkdir(path: Path) -> None:
    """A cgroup folder traversable by an instance's uid whatever the runtime's umask: a zygote's
    fork has already dropped to that uid when it writes its ``tasks`` (an attempt runs with umask
    077, which made these folders 0700 and every zygote instance exit at start)."""
    path.mkdir()
    os.chmod(path, 0o755)


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read_key(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
    except (OSError, ValueError):
        pass
    return 0


def _read_mb(path: Path) -> float | None:
    try:
        return int(path.read_text()) / MIB
    except (OSError, ValueError):
        return None
