"""A hostile plugin chooses no pid the runtime signals, and what it starts at import is limited and
ends with its function (issue 23, items 2 and 4, and 14's user namespaces).

Each probe is a real plugin run through the real runtime. Where a probe could kill the process
that runs the runtime, that runtime runs in a child process of the test (``_supervise``), so a
regression fails the test instead of ending the test session.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from plugtune.errors import Cause, PluginCallError
from plugtune.runtime import LocalRuntime
from plugtune.runtime.processes import read_status
from plugtune.runtime.sandbox import LEASES, closed_python_paths, mount_view_problem, namespaces_rule
from tests.runtime.helpers import ctx, sample, trajectory

ROOT = Path(__file__).resolve().parents[2]
AS_ROOT = pytest.mark.skipif(
    os.geteuid() != 0 or (bool(closed_python_paths()) and mount_view_problem() is not None),
    reason="a uid per function needs the runtime to run as root, with a Python other users can read "
    "or a mount namespace that makes it readable",
)
pytestmark = pytest.mark.timeout(60)

HEADER = """\
import ctypes, gc, os, signal, sys, time
from plugtune import Runtime, grader

ONE = Runtime(memory_mb=256, timeout_s=10, max_concurrency=1, min_instances=1, max_instances=1)
"""

# The instance names another process's pid in READY frames on its own channel, in setup() and in
# a call: before the fix the supervisor took the last one as the instance's and killed its group.
CLAIMS_READY = """
def _claim(pids):
    import socket
    from plugtune.runtime.protocol import pack
    for fd in map(int, os.listdir("/proc/self/fd")):  # every Unix stream socket: its channel too
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        with sock:
            if sock.family == socket.AF_UNIX and sock.type == socket.SOCK_STREAM:
                for pid in pids:
                    sock.sendall(pack(["ready", pid, 0.0]))

def setup():
    _claim([int(p) for p in os.environ["VICTIMS"].split(",")])

@grader(runtime=ONE)
def claim(ctx, sample, trajectory):
    _claim(sample.extra["pids"])
    return 1.0
"""

# Module-level code runs in the zygote: it makes the zygote's fork() report another pid, so the
# zygote's FORKED frame names that process as the new instance.
LIES_IN_FORKED = """
_fork = os.fork
_victims = [int(p) for p in os.environ["VICTIMS"].split(",")]  # a bystander, then the runtime

def _lying_fork():
    pid = _fork()
    if pid == 0:
        return 0
    _victims.append(_victims.pop(0))
    return _victims[-1]

os.fork = _lying_fork

@grader(runtime=ONE)
def claim(ctx, sample, trajectory):
    return 1.0
"""

# A daemon forked at import (double fork + setsid: out of the zygote's session and parentage),
# named TOKEN (its /proc/PID/comm) so the test finds it whatever its uid.
IMPORT_DAEMON = """
def _name(text):
    ctypes.CDLL(None).prctl(15, text.encode()[:15], 0, 0, 0)  # PR_SET_NAME

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        _name(os.environ["TOKEN"])
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(0.2)
    os._exit(0)
os.wait()
if os.environ.get("IMPORT_SLEEP"):
    _name(os.environ["TOKEN"])
    time.sleep(float(os.environ["IMPORT_SLEEP"]))

@grader(runtime=ONE)
def score(ctx, sample, trajectory):
    return 1.0
"""

IMPORT_MEMORY = """
_hog = b"x" * (int(os.environ["HOG_MB"]) << 20)  # touched: every page is written

@grader(runtime=ONE)
def score(ctx, sample, trajectory):
    return 1.0
"""

# Forks sleeping children at import until a fork is refused (or 400), then ends them.
IMPORT_FORKS = """
_children = []
for _ in range(400):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    _children.append(pid)
STARTED = len(_children)
for pid in _children:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)

@grader(runtime=ONE)
def score(ctx, sample, trajectory):
    return float(STARTED)
"""

# ptrace-attach to the zygote (the instance's parent, same uid) and unshare a user namespace.
PROBES = """
PTRACE_ATTACH, PTRACE_DETACH, CLONE_NEWUSER = 16, 17, 0x10000000

@grader(runtime=ONE)
def probe(ctx, sample, trajectory):
    libc = ctypes.CDLL(None, use_errno=True)
    what = sample.extra["probe"]
    if what == "ptrace":
        target = os.getppid()
        result = libc.ptrace(PTRACE_ATTACH, target, None, None)
        err = ctypes.get_errno()
        if result == 0:
            libc.ptrace(PTRACE_DETACH, target, None, None)
        ctx.logger.info("ptrace %d: %d errno %d", target, result, err)
        return float(err)
    pid = os.fork()
    if pid == 0:  # in a child, so a success cannot change the instance itself
        os._exit(0 if libc.unshare(CLONE_NEWUSER) == 0 else min(ctypes.get_errno(), 255))
    _, status = os.waitpid(pid, 0)
    return float(os.waitstatus_to_exitcode(status))
"""


def _plugin(folder: Path, source: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "probe.py"
    path.write_text(HEADER + textwrap.dedent(source))
    return path


SUPERVISOR = """
import asyncio, json, os, sys
from plugtune.runtime import LocalRuntime
from tests.runtime.helpers import ctx, sample, trajectory

async def main():
    entry, victims = sys.argv[1], sys.argv[2]
    pids = [os.getpid() if p == "self" else int(p) for p in victims.split(",")]
    env = {"VICTIMS": ",".join(map(str, pids))}
    async with LocalRuntime(spare_instances=False) as rt:
        try:
            fn = await rt.deploy(entry, env=env)
        except Exception as exc:
            print("DEPLOY", type(exc).__name__, exc, flush=True)
        else:
            result = await fn.invoke(ctx(), sample(pids=pids), trajectory())
            print("RESULT", type(result).__name__, flush=True)
    print("SURVIVED", flush=True)

asyncio.run(main())
"""


def _supervise(entry: str, victims: list[int | str]) -> subprocess.CompletedProcess[str]:
    """Run a runtime in a child process (its own process group, as `plugtune serve` may be) that
    deploys ``entry`` and calls it once, naming ``victims`` ("self": that runtime) to the plugin."""
    return subprocess.run(
        [sys.executable, "-c", SUPERVISOR, entry, ",".join(map(str, victims))],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=45,
        start_new_session=True,
    )


def _bystander() -> subprocess.Popen[bytes]:
    """A root process that is nobody's instance: its own process group, as a job's attempt is."""
    return subprocess.Popen(["sleep", "60"], start_new_session=True)


@pytest.mark.parametrize("victim", ["bystander", "runtime"])
def test_pids_an_instance_names_in_ready_frames_are_never_signalled(tmp_path: Path, victim: str) -> None:
    bystander = _bystander()
    try:
        victims: list[int | str] = [bystander.pid] if victim == "bystander" else ["self"]
        done = _supervise(f"{_plugin(tmp_path / 'p', CLAIMS_READY)}:claim", victims)
        assert "SURVIVED" in done.stdout, (done.returncode, done.stdout, done.stderr[-2000:])
        assert "RESULT CallOutcome" in done.stdout  # it was deployed and called
        assert bystander.poll() is None, "the runtime killed a process a plugin named"
    finally:
        bystander.kill()
        bystander.wait()


def test_a_zygote_that_names_a_process_it_did_not_fork_gets_no_instance(tmp_path: Path) -> None:
    bystander = _bystander()
    try:
        done = _supervise(f"{_plugin(tmp_path / 'p', LIES_IN_FORKED)}:claim", [bystander.pid, "self"])
        assert "SURVIVED" in done.stdout, (done.returncode, done.stdout, done.stderr[-2000:])
        assert "is not a process it forked" in done.stdout, done.stdout
        assert bystander.poll() is None, "the runtime killed a process a plugin named"
    finally:
        bystander.kill()
        bystander.wait()


@AS_ROOT
async def test_an_instance_cannot_ptrace_its_zygote(tmp_path: Path) -> None:
    async with LocalRuntime(spare_instances=False) as rt:
        fn = await rt.deploy(f"{_plugin(tmp_path / 'p', PROBES)}:probe")
        result = await fn.invoke(ctx(), sample(probe="ptrace"), trajectory())
    assert result.value == 1.0, [line.message for line in result.logs]  # EPERM


def _processes_of(uid: int) -> list[int]:
    found = [read_status(int(n)) for n in os.listdir("/proc") if n.isdigit()]
    return [s.pid for s in found if s is not None and s.uid == uid and not s.zombie]


def _named(token: str) -> list[int]:
    """Running processes named ``token`` (their /proc/PID/comm, which any uid may set)."""
    found = []
    for name in os.listdir("/proc"):
        try:
            comm = Path(f"/proc/{name}/comm").read_text().strip() if name.isdigit() else ""
        except OSError:
            continue
        status = read_status(int(name)) if comm == token else None
        if status is not None and not status.zombie:
            found.append(status.pid)
    return found


def _token() -> str:
    return f"pt{os.getpid() % 10000}x{time.monotonic_ns() % 100000}"


@AS_ROOT
@pytest.mark.parametrize("limits", [None, "rlimit"])  # rlimit: no cgroup holds it, the uid sweep ends it
async def test_a_daemon_forked_at_import_ends_with_its_function_before_its_uid_is_released(
    tmp_path: Path, limits: str | None
) -> None:
    token = _token()
    async with LocalRuntime(spare_instances=False, limits=limits) as rt:
        fn = await rt.deploy(f"{_plugin(tmp_path / 'p', IMPORT_DAEMON)}:score", env={"TOKEN": token})
        assert fn.deployment.user is not None
        uid = fn.deployment.user.uid
        (daemon,) = _named(token)
        assert read_status(daemon).uid == uid  # type: ignore[union-attr]
        assert (LEASES / str(uid)).exists()
        await fn.close()
        assert _named(token) == [] and _processes_of(uid) == []
        assert not (LEASES / str(uid)).exists()


@AS_ROOT
async def test_an_import_past_the_start_timeout_is_a_create_fault_and_leaves_no_process(
    tmp_path: Path,
) -> None:
    token = _token()
    before = set(os.listdir(LEASES)) if LEASES.exists() else set()
    async with LocalRuntime(spare_instances=False, start_timeout_s=2.0) as rt:
        with pytest.raises(PluginCallError) as raised:
            await rt.deploy(
                f"{_plugin(tmp_path / 'p', IMPORT_DAEMON)}:score", env={"TOKEN": token, "IMPORT_SLEEP": "30"}
            )
        assert "longer than 2 s" in raised.value.message
        assert _named(token) == []  # the zygote still importing and the daemon it forked
        assert set(os.listdir(LEASES)) <= before  # its uid was given back once nothing of it ran


FREEZER = Path("/sys/fs/cgroup/freezer")


@AS_ROOT
@pytest.mark.skipif(not (FREEZER / "cgroup.procs").exists(), reason="needs the cgroup v1 freezer")
def test_a_uid_with_a_process_left_stays_leased_until_none_is(tmp_path: Path) -> None:
    """A frozen process (cgroup v1 freezer) takes its SIGKILL only when thawed: while frozen, the
    sweep cannot end it, so its uid must stay leased."""
    from plugtune.runtime.sandbox import Sandbox

    sandbox = Sandbox(has_pids_cgroup=False)
    frozen = FREEZER / f"plugtune-test-{os.getpid()}"
    frozen.mkdir()
    try:
        user = sandbox.lease_user(tmp_path)
        assert user is not None
        holder = subprocess.Popen(["sleep", "30"], user=user.uid, group=user.gid)
        try:
            (frozen / "cgroup.procs").write_text(str(holder.pid))
            (frozen / "freezer.state").write_text("FROZEN")
            left = sandbox.release_user(user, within_s=0.3)
            assert left == [holder.pid] and (LEASES / str(user.uid)).exists()
            (frozen / "freezer.state").write_text("THAWED")
            holder.wait(timeout=10)  # the sweep's SIGKILL lands
            assert sandbox.release_user(user) == []
            assert not (LEASES / str(user.uid)).exists()
        finally:
            (frozen / "freezer.state").write_text("THAWED")
            holder.kill()
            holder.wait()
    finally:
        frozen.rmdir()
        sandbox.close()


@pytest.mark.parametrize("limits", [None, "rlimit"])
async def test_module_level_memory_past_memory_mb_fails_the_deploy_as_a_create_fault(
    tmp_path: Path, limits: str | None
) -> None:
    async with LocalRuntime(spare_instances=False, limits=limits) as rt:
        with pytest.raises(PluginCallError) as raised:
            await rt.deploy(
                f"{_plugin(tmp_path / 'p', IMPORT_MEMORY)}:score",
                runtime={"memory_mb": 128},
                env={"HOG_MB": "400"},
            )
    error = raised.value
    assert error.cause_enum is Cause.CREATE_FAULT
    assert "importing the plugin went over memory_mb=128" in error.message, error.message


async def test_module_level_fork_loop_is_held_to_the_pids_limit(tmp_path: Path) -> None:
    async with LocalRuntime(spare_instances=False) as rt:
        fn = await rt.deploy(f"{_plugin(tmp_path / 'p', IMPORT_FORKS)}:score", runtime={"max_pids": 20})
        result = await fn.invoke(ctx(), sample(), trajectory())
    # max_pids plus the runtime's own share (pids_max), far below the 400 it tried
    assert 0 < result.value < 60, result.value


@pytest.mark.skipif(
    namespaces_rule() != "none can be created (seccomp)", reason=f"this host: {namespaces_rule()}"
)
async def test_a_plugin_cannot_create_a_user_namespace(tmp_path: Path) -> None:
    async with LocalRuntime(spare_instances=False) as rt:
        assert rt.isolation.namespaces == "none can be created (seccomp)"
        fn = await rt.deploy(f"{_plugin(tmp_path / 'p', PROBES)}:probe")
        result = await fn.invoke(ctx(), sample(probe="unshare"), trajectory())
    assert result.value == 1.0, result  # EPERM


# Every child the zygote forks ends at once (before the supervisor looks for it in /proc).
CHILD_ENDS_AT_ONCE = """
os.register_at_fork(after_in_child=lambda: os._exit(5))

@grader(runtime=ONE)
def score(ctx, sample, trajectory):
    return 1.0
"""


async def test_an_instance_that_ends_at_once_is_a_start_failure_not_a_lying_zygote(tmp_path: Path) -> None:
    async with LocalRuntime(spare_instances=False) as rt:
        with pytest.raises(PluginCallError) as raised:
            await rt.deploy(f"{_plugin(tmp_path / 'p', CHILD_ENDS_AT_ONCE)}:score")
    assert "exited with status 5" in raised.value.message, raised.value.message
    assert "not a process it forked" not in raised.value.message
