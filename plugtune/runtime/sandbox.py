"""What a plugin instance may reach: its environment, its user, its files, its temp space.

The supervisor side of the isolation contract (the worker side is :mod:`.worker.sandbox`):

* environment: only :data:`PASSED_ENV` from the runtime's own environment, plus the function's
  ``env`` (``deploy(env=...)``, job.yaml ``env:`` and ``secrets:``), set by the worker only after
  its uid drop (never in a privileged exec, never in argv); ``PLUGTUNE_*`` never passes;
* user: when the runtime runs as root, each deployed function gets its own numeric uid (leased
  from :data:`PLUGIN_UIDS`, no /etc/passwd entry; given back only once no process of it runs: see
  :meth:`Sandbox.release_user`) and its snapshot's gid; not root, or root whose
  Python other users cannot read and no mount namespace to fix it: the runtime's own user (the
  rest still applies; ``rt.isolation`` says what is active);
* files: the state dir is traversable but not listable, each snapshot readable by its own group
  only, the rest of PLUGTUNE_HOME (store, checkpoints) private to the runtime's user;
* temp space: a private folder per instance (``$HOME``/``$TMPDIR``), a ``tmp_mb`` tmpfs owned by
  the instance's uid when the runtime may mount, else a plain folder capped per file by
  ``RLIMIT_FSIZE`` and in total by the supervisor's size watch; removed when the instance ends,
  however it ended;
* files seen: where a probe shows this host can make one, each function's workers enter a private
  mount namespace (:mod:`.worker.mounts`): their own /tmp, /var/tmp and /dev/shm, an empty /run, a
  /proc that lists only their own uid's processes (where the kernel allows), Python's folders bound
  read-only into a tmpfs over any folder other users cannot traverse (so the uid drop works with
  a Python under a 0700 /root). The temp root is a shared mount so instances' tmpfs reach it there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import logging
import os
import random
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plugtune.runtime.processes import SWEEP_S, of_uid, sweep
from plugtune.runtime.worker import mounts
from plugtune.runtime.worker.mounts import MountError, closed_ancestor, interpreter_paths, share
from plugtune.runtime.worker.sandbox import namespace_filter
from plugtune.sdk import Runtime
from plugtune.settings import Settings

log = logging.getLogger(__name__)

#: Variables of the runtime's environment a plugin gets (besides its own ``env``).
PASSED_ENV = ("PATH", "LANG", "LANGUAGE", "TZ", "PYTHONPATH")
#: The uids leased to functions and the gids derived from snapshots (halves of one high range).
PLUGIN_UIDS = range(1_000_000, 1_500_000)
PLUGIN_GIDS = range(1_500_000, 2_000_000)
LEASES = Path("/run/plugtune/uids")
MNT_DETACH, MS_RDONLY, MS_REMOUNT, MS_BIND = 2, 1, 32, 4096


@dataclass(frozen=True)
class Isolation:
    """What the runtime enforces on every instance (``rt.isolation``)."""

    user: str  # "uid per function" | "the runtime's own uid (...why)"
    tmp: str  # "tmpfs per instance" | "folder per instance"
    pids: str  # "cgroup pids.max" | "process watch per instance (...)"
    env: str = "scrubbed"
    view: str = "the host's"  # what files it sees: "private mount namespace (...)" | "the host's (why)"
    namespaces: str = ""  # "none can be created (seccomp)" | "not refused (why)"

    def __str__(self) -> str:
        text = f"user: {self.user}; tmp: {self.tmp}; pids: {self.pids}; env: {self.env}; files: {self.view}"
        return f"{text}; namespaces: {self.namespaces}" if self.namespaces else text


@dataclass(frozen=True)
class User:
    uid: int
    gid: int


def scrubbed_env(package_root: str) -> dict[str, str]:
    """The whole exec environment of a worker process: the allow-list and what Python needs. Never a
    function's ``env``: a worker starts privileged, so the job's variables (``LD_PRELOAD``...) wait
    until it is the function's uid (``plugtune.runtime.worker.zygote.apply_env``)."""
    source = os.environ
    out = {k: v for k, v in source.items() if k in PASSED_ENV or k.startswith("LC_")}
    out["PYTHONPATH"] = os.pathsep.join(x for x in (package_root, source.get("PYTHONPATH", "")) if x)
    out["PYTHONUNBUFFERED"] = "1"
    out.setdefault("PATH", os.defpath)
    return out


class Sandbox:
    """One per runtime: leases users, grants snapshots, makes and removes private temp folders."""

    def __init__(self, has_pids_cgroup: bool) -> None:
        root = os.geteuid() == 0
        remove_stale()
        self.tmp_root = Path(tempfile.mkdtemp(prefix=f"plugtune-tmp-{os.getpid()}-"))
        self.tmp_root.chmod(0o711)  # instances reach their own folder; nobody lists the others
        self.can_mount = root and _try_mount(self.tmp_root)
        view_problem = mount_view_problem() if self.can_mount else _why_no_mounts(root)
        if view_problem is None:
            try:
                share(_libc, str(self.tmp_root))  # instances' tmpfs, mounted later, reach every view
            except MountError as exc:
                view_problem = str(exc)
        self.has_view = view_problem is None
        self.proc_problem = proc_view_problem() if self.has_view else view_problem
        closed = closed_python_paths() if root and not self.has_view else []
        if closed:  # a plugin's uid could not import the rest of the stdlib
            log.warning(
                "plugins keep the runtime's uid: other users cannot read %s, and no private mount "
                "namespace can make it readable (%s)",
                closed[0],
                view_problem,
            )
        self.is_root = root and not closed
        self.leased: set[int] = set()
        self.isolation = _describe(self, has_pids_cgroup, root, closed, view_problem)

    def mount_plan(self, tmp_mb: int) -> dict[str, Any] | None:
        """What a worker's mount namespace keeps of the host's /tmp, the size of its own /tmp,
        /var/tmp and /dev/shm, whether its /proc hides other uids' processes (None: it has no
        namespace)."""
        if not self.has_view:
            return None
        return {"keep": [str(self.tmp_root)], "tmp_mb": tmp_mb, "hide_pids": self.proc_problem is None}

    def prepare(self, code_root: Path, name: str, tmp_mb: int) -> dict[str, Any]:
        """A function's worker config: its own user (when root), its snapshot granted to that user's
        group and exposed read-only, a private temp folder for its zygote, its mount plan. ``tmp_mb``:
        the deploy's (job.yaml's) setting, else the default: the decorator is read only later."""
        user = self.lease_user(code_root)
        if user is not None and code_root.parent.name == "code":  # a snapshot in a state dir
            protect_state(code_root.parent.parent, Settings.from_env().home)
        self.grant(code_root, user)
        exposed = self.expose(code_root, f"{name}-code", user)
        tmp = self.make_tmp(f"{name}-zygote", user, tmp_mb)
        return {
            "code_root": str(exposed),
            "user": [user.uid, user.gid] if user else None,
            "tmp_dir": str(tmp),
            "mounts": self.mount_plan(tmp_mb),
        }

    def release(self, config: dict[str, Any]) -> None:
        """Give back what :meth:`prepare` took (the function was closed or never started)."""
        user = config.get("user")
        self.release_user(User(*user) if user else None)
        self.remove_tmp(Path(config["tmp_dir"]))
        self.unexpose(Path(config["code_root"]))

    # ---- users ------------------------------------------------------------------------------

    def lease_user(self, code_root: Path) -> User | None:
        """A uid of the function's own (None when not root) with its snapshot's group."""
        if not self.is_root:
            return None
        uid = _lease(PLUGIN_UIDS)
        self.leased.add(uid)
        return User(uid, group_of(code_root))

    def release_user(self, user: User | None, within_s: float = SWEEP_S) -> list[int]:
        """End every process of the function's uid (its zygote, instances and whatever they started,
        daemons included), then give the uid back; returns the pids still running after
        ``within_s``: then the lease file stays (so no runtime hands the uid out while they run;
        the next runtime to find it stale ends them first) and a warning says so."""
        if user is None or user.uid not in self.leased:
            return []
        left = _release(user.uid, within_s)
        if not left:
            self.leased.discard(user.uid)
        return left

    def expose(self, code_root: Path, name: str, user: User | None) -> Path:
        """Where the function's worker finds its snapshot: a read-only bind mount of it in the temp
        root when it runs as its own user (the state dir's parents, e.g. /root, stay closed)."""
        if user is None or not self.can_mount:
            return code_root
        path = self.tmp_root / name
        path.mkdir(mode=0o700)
        _mount_bind(code_root, path)
        return path

    def unexpose(self, path: Path) -> None:
        if path.parent == self.tmp_root and os.path.ismount(path):
            _umount(path)
            path.rmdir()

    def grant(self, code_root: Path, user: User | None) -> None:
        """Make the snapshot readable by its group only (root:gid, 0750/0640)."""
        if user is None:
            return
        for path in [code_root, *code_root.rglob("*")]:
            if path.is_symlink():
                continue
            os.chown(path, 0, user.gid)
            path.chmod(0o750 if path.is_dir() else 0o640)

    # ---- temp folders -----------------------------------------------------------------------

    def make_tmp(self, name: str, user: User | None, tmp_mb: int) -> Path:
        """A private folder for one instance (or zygote): a tmpfs of ``tmp_mb`` where possible."""
        path = self.tmp_root / name
        path.mkdir(mode=0o700)
        if self.can_mount:
            uid, gid = (user.uid, user.gid) if user else (0, 0)
            _mount_tmpfs(path, f"size={tmp_mb}m,nr_inodes=65536,mode=0700,uid={uid},gid={gid}")
        elif user is not None:
            os.chown(path, user.uid, user.gid)
        return path

    def remove_tmp(self, path: Path) -> None:
        _remove(path)

    def close(self) -> None:
        _remove(self.tmp_root)
        for uid in list(self.leased):
            _release(uid, SWEEP_S)
        self.leased.clear()


def _describe(
    sandbox: Sandbox, has_pids_cgroup: bool, root: bool, closed: list[str], view_problem: str | None
) -> Isolation:
    if sandbox.is_root:
        user = "uid per function"
        watch = "process watch per instance, RLIMIT_NPROC per function uid as its backstop"
        pids = "cgroup pids.max" if has_pids_cgroup else watch
    else:
        user = f"the runtime's own uid ({closed[0]} is not readable by others)" if closed else ""
        user = user or "the runtime's own uid (not root)"
        alone = "process watch per instance (no backstop: no uid of its own)"
        pids = "cgroup pids.max" if has_pids_cgroup else alone
    hidden = sorted({c for c in map(closed_ancestor, interpreter_paths()) if c})
    view = "private mount namespace (/tmp, /var/tmp and /dev/shm its own; /run empty; IPC its own; "
    view += (
        "/proc: its own uid's processes only"
        if sandbox.proc_problem is None
        else (f"/proc: the host's, every process listed ({sandbox.proc_problem})")
    )
    view += f"; {', '.join(hidden)} hidden but Python)" if hidden else ")"
    return Isolation(
        user=user,
        tmp="tmpfs of tmp_mb per instance"
        if sandbox.can_mount
        else "folder per instance (RLIMIT_FSIZE, size watch)",
        pids=pids,
        view=view
        if sandbox.has_view
        else f"the host's (/tmp, /var/tmp, /dev/shm, /run and /proc shared: {view_problem})",
        namespaces=namespaces_rule(),
    )


def namespaces_rule() -> str:
    """Whether a plugin may create namespaces here (see ``worker.sandbox.refuse_namespaces``)."""
    machine = os.uname().machine
    if namespace_filter(machine) is None:
        return f"not refused (no seccomp filter is written for {machine})"
    try:
        has_seccomp = "Seccomp:" in Path("/proc/self/status").read_text()
    except OSError:
        has_seccomp = False
    return "none can be created (seccomp)" if has_seccomp else "not refused (this kernel has no seccomp)"


def requested_tmp_mb(runtime: Runtime | dict[str, Any] | None) -> int:
    """The deploy's ``tmp_mb`` (a Runtime, or job.yaml's overrides), else the default."""
    if isinstance(runtime, Runtime):
        return runtime.tmp_mb
    if runtime and "tmp_mb" in runtime:
        return int(runtime["tmp_mb"])
    return Runtime().tmp_mb


def _why_no_mounts(root: bool) -> str:
    return "the runtime may not mount (no CAP_SYS_ADMIN)" if root else "the runtime is not root"


def mount_view_problem() -> str | None:
    """Why a worker cannot get its own mount namespace here (None: it can). Tried once per process
    in a short-lived worker-like process, as the host does not change while the runtime runs."""
    return _view_problems()[0]


def proc_view_problem() -> str | None:
    """Why a worker's view cannot have a ``/proc`` that hides other users' processes (None: it can;
    kernels before 5.8 share one procfs's options per pid namespace, so it is not tried there)."""
    return _view_problems()[1]


@functools.cache
def _view_problems() -> tuple[str | None, str | None]:
    with_proc = _probe_view("hide-pids")  # one probe where the whole view works
    if with_proc is None:
        return None, None
    plain = _probe_view()
    return plain, plain or with_proc


def _probe_view(*args: str) -> str | None:
    try:
        done = subprocess.run(
            [sys.executable, mounts.__file__, "probe", *args],
            env=scrubbed_env(str(Path(__file__).resolve().parents[2])),
            cwd="/",
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the mount namespace probe did not run: {exc}"
    if done.returncode == 0:
        return None
    text = done.stderr.decode(errors="replace").strip().splitlines()
    return text[-1] if text else f"the mount namespace probe exited with {done.returncode}"


def _remove(path: Path) -> None:
    """Unmount whatever is mounted at or below ``path`` (deepest first), then delete it."""
    if not path.exists():
        return
    mounts = [m for m in _mounts() if m == path or path in m.parents]
    for mount in sorted(mounts, key=lambda m: len(m.parts), reverse=True):
        _umount(mount)
    if any(os.path.ismount(m) for m in mounts):
        log.warning("%s is still mounted; left in place", path)
        return
    shutil.rmtree(path, ignore_errors=True)


def _mounts() -> list[Path]:
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    return [Path(line.split()[1].replace("\\040", " ")) for line in lines if len(line.split()) > 1]


def remove_stale() -> None:
    """Remove temp roots and policy bridge folders (``plugtune-net-PID-*``) left by runtimes whose
    process is gone (they were killed before closing)."""
    top = Path(tempfile.gettempdir())
    for root in [*top.glob("plugtune-tmp-*-*"), *top.glob("plugtune-net-*-*")]:
        try:
            pid = int(root.name.split("-")[2])
        except (IndexError, ValueError):
            continue
        if not Path(f"/proc/{pid}").exists():
            _remove(root)
            log.info("removed the stale plugin temp folder %s", root)


def closed_python_paths() -> list[str]:
    """Python's own folders (stdlib, site-packages, plugtune) another user cannot read, e.g. under /root."""
    import sysconfig

    wanted = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    wanted.add(str(Path(__file__).resolve().parents[2]))
    closed = []
    for path in sorted(wanted):
        p = Path(path)
        chain = [p, *p.parents]
        if p.exists() and any(d.exists() and not d.stat().st_mode & stat.S_IXOTH for d in chain):
            closed.append(path)
        elif p.exists() and not p.stat().st_mode & stat.S_IROTH:
            closed.append(path)
    return closed


def group_of(code_root: Path) -> int:
    """The snapshot's gid: derived from where it is stored, so every runtime agrees on it."""
    digest = hashlib.sha256(str(code_root.resolve()).encode()).digest()
    return PLUGIN_GIDS[int.from_bytes(digest[:8], "big") % len(PLUGIN_GIDS)]


def protect_state(state_dir: Path, home: Path | None) -> None:
    """State dir (and PLUGTUNE_HOME above it) traversable, not listable; the rest of home private."""
    state_dir.mkdir(parents=True, exist_ok=True)
    code = state_dir / "code"
    code.mkdir(exist_ok=True)
    for d in (state_dir, code):
        d.chmod(0o711)
    if home is None or not _is_below(state_dir, home):
        return
    keep = {code.resolve(), state_dir.resolve(), *state_dir.resolve().parents}
    for d in [state_dir.resolve(), *state_dir.resolve().parents]:
        if d == home.resolve() or _is_below(d, home):
            d.chmod(0o711)
            for entry in d.iterdir():
                if entry.resolve() in keep or entry.is_symlink():
                    continue
                mode = entry.lstat().st_mode
                entry.chmod(stat.S_IMODE(mode) & 0o700)  # the store, jobs/, checkpoints: owner only


def _is_below(path: Path, top: Path) -> bool:
    try:
        path.resolve().relative_to(top.resolve())
    except ValueError:
        return False
    return True


# ---- uid leases: one file per uid, naming the runtime process that holds it -------------------


def _lease(pool: range) -> int:
    """A uid of ``pool`` that no lease holds and no process runs as (one left by a runtime that
    ended is ended first; a uid whose processes outlive that stays leased)."""
    LEASES.mkdir(parents=True, exist_ok=True, mode=0o700)
    rng = random.Random()
    for _ in range(256):
        uid = pool[rng.randrange(len(pool))]
        path = LEASES / str(uid)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            if not _holder_alive(path) and not sweep(of_uid(uid), 0.5):
                path.unlink(missing_ok=True)  # its runtime is gone, and so is every process of it
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        if sweep(of_uid(uid), 0.5):  # processes of no lease's (a runtime before leases were kept)
            log.warning("plugin uid %d has processes that outlived their runtime; left leased", uid)
            continue
        return uid
    raise OSError(f"no free plugin uid in {pool.start}..{pool.stop - 1} (leases in {LEASES})")


def _release(uid: int, within_s: float) -> list[int]:
    """Kill every process of ``uid``, then remove its lease; the pids left (lease kept) if any."""
    left = sweep(of_uid(uid), within_s)
    if left:
        log.warning(
            "plugin uid %d stays leased: %d process(es) of it still run after %.1f s (pids %s); the "
            "next runtime to find its lease stale ends them first",
            uid,
            len(left),
            within_s,
            " ".join(map(str, left[:10])),
        )
        return left
    (LEASES / str(uid)).unlink(missing_ok=True)
    return []


def _holder_alive(path: Path) -> bool:
    try:
        pid = int(path.read_text() or "0")
    except (OSError, ValueError):
        return True  # being written right now
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---- mounts -----------------------------------------------------------------------------------

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _mount_tmpfs(path: Path, options: str) -> None:
    if _libc.mount(b"plugtune-tmp", str(path).encode(), b"tmpfs", 0, options.encode()) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"could not mount the instance's tmpfs on {path}: {os.strerror(errno)}")


def _mount_bind(source: Path, target: Path) -> None:
    for flags in (MS_BIND, MS_BIND | MS_REMOUNT | MS_RDONLY):
        if _libc.mount(str(source).encode(), str(target).encode(), None, flags, None) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"could not bind {source} at {target}: {os.strerror(errno)}")


def _umount(path: Path) -> None:
    if _libc.umount2(str(path).encode(), MNT_DETACH) != 0:
        errno = ctypes.get_errno()
        log.warning("could not unmount %s: %s", path, os.strerror(errno))


def _try_mount(root: Path) -> bool:
    probe = root / ".probe"
    probe.mkdir()
    try:
        _mount_tmpfs(probe, "size=1m,mode=0700")
    except OSError as exc:
        log.info("private temp folders are plain folders (no tmpfs): %s", exc.strerror)
        probe.rmdir()
        return False
    _umount(probe)
    probe.rmdir()
    return True
