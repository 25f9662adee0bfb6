"""A hostile plugin (or job) against the worker's start and its view of the host (issue 23 items 1,
3, 5, 11 and 14's bridge folders): real plugin folders deployed through the real LocalRuntime, as
root, probing what the function's uid can reach."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from plugtune.errors import PluginCallError
from plugtune.runtime import LocalRuntime
from plugtune.runtime.function import Function
from plugtune.runtime.sandbox import mount_view_problem, proc_view_problem
from plugtune.runtime.worker import mounts
from tests.runtime.helpers import ctx, sample, trajectory

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="a uid per function and a mount namespace need root"),
    pytest.mark.timeout(60),
]
VIEW = pytest.mark.skipif(
    os.geteuid() != 0 or mount_view_problem() is not None,
    reason=f"this host gives workers no private mount namespace ({mount_view_problem()})",
)
HIDDEN_PROC = pytest.mark.skipif(
    os.geteuid() != 0 or proc_view_problem() is not None,
    reason=f"this host cannot give workers a /proc that hides other uids ({proc_view_problem()})",
)
PG_SOCKET = Path("/run/postgresql/.s.PGSQL.5432")

PROBES = '''
import glob, json, os, socket
from plugtune import grader

CANDIDATES = ["/tmp", "/var/tmp", "/run", "/run/lock", "/var/lock", "/var/run", "/dev/shm", "/dev/mqueue",
              "/run/user", "/var/crash", "/var/mail", "/var/spool", "/var/cache", "/var/lib", "/var/log"]
TOPS = ["/", "/var", "/run", "/dev", "/etc", "/opt", "/srv", "/home", "/usr/local", "/var/lib", "/var/cache"]


def report(ctx, name, value):
    ctx.logger.info("%s %s", name, json.dumps(value))


@grader
def has_env(ctx, sample, trajectory):
    """1.0 when the job's variable reached the plugin."""
    return 1.0 if os.environ.get(sample.extra["name"]) == sample.extra["value"] else 0.0


@grader
def scan_proc(ctx, sample, trajectory):
    """Reads every /proc/*/cmdline and /proc/*/environ it can; reports the pids where the secret is,
    and the processes it sees of other uids."""
    secret = sample.extra["secret"].encode()
    found, others = [], []
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        try:
            if os.stat(f"/proc/{pid}").st_uid != os.getuid():
                others.append(int(pid))
        except OSError:
            pass
        for name in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as f:
                    if secret in f.read():
                        found.append([int(pid), name])
            except OSError:
                pass
    report(ctx, "found", found)
    report(ctx, "others", others)
    return 1.0


@grader
def host_sockets(ctx, sample, trajectory):
    """Tries the host's socket folders and sockets: listed folders, accepted connections."""
    out = {"listed": [], "connected": []}
    for folder in sample.extra["folders"]:
        try:
            os.listdir(folder)
            out["listed"].append(folder)
        except OSError:
            pass
    for path in sample.extra["paths"]:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2)
            try:
                s.connect(path.replace("@", "\\0", 1) if path.startswith("@") else path)
                out["connected"].append(path)
            except OSError:
                pass
    report(ctx, "sockets", out)
    return 1.0


def _writable_dirs():
    seen = list(CANDIDATES) + [os.environ["HOME"], os.environ["TMPDIR"]]
    for top in TOPS:
        try:
            seen += [os.path.join(top, e) for e in sorted(os.listdir(top))[:500]]
        except OSError:
            pass
    return [d for d in dict.fromkeys(seen) if os.path.isdir(d) and not os.path.islink(d)]


@grader
def write_everywhere(ctx, sample, trajectory):
    """Writes a file named after the token into every folder it can; reports where it succeeded, and
    whether writing past tmp_mb into /var/tmp is refused."""
    token, written = sample.extra["token"], []
    for folder in _writable_dirs():
        try:
            with open(os.path.join(folder, token), "w") as f:
                f.write("left behind")
            written.append(folder)
        except OSError:
            pass
    report(ctx, "written", written)
    try:
        with open("/var/tmp/fill", "wb") as f:
            for _ in range(sample.extra["fill_mb"]):
                f.write(b"x" * (1 << 20))
        report(ctx, "fill", "fitted")
    except OSError as exc:
        report(ctx, "fill", exc.errno)
    finally:
        if os.path.exists("/var/tmp/fill"):
            os.remove("/var/tmp/fill")
    return 1.0


@grader
def find_token(ctx, sample, trajectory):
    """Reports every folder where a file named after the token is (a later job's view)."""
    token = sample.extra["token"]
    report(ctx, "seen", [d for d in _writable_dirs() if os.path.exists(os.path.join(d, token))])
    return 1.0
'''

PRELOAD_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    char line[32];
    int n = snprintf(line, sizeof line, "%d\n", (int)geteuid());
    int fd = open(MARKER, O_WRONLY | O_CREAT | O_APPEND, 0666);
    if (fd >= 0) { write(fd, line, n); close(fd); }
}
"""


@pytest.fixture
def plugin(tmp_path: Path) -> Path:
    folder = tmp_path / "plugin"
    folder.mkdir()
    (folder / "probes.py").write_text(textwrap.dedent(PROBES))
    return folder


@pytest.fixture
async def rt() -> AsyncIterator[LocalRuntime]:
    async with LocalRuntime(spare_instances=False) as runtime:
        yield runtime


def reported(result: Any, name: str) -> Any:
    (line,) = [m.message for m in result.logs if m.message.startswith(name + " ")]
    return json.loads(line[len(name) + 1 :])


def worker_pids(fn: Function) -> list[int]:
    deployment: Any = fn.deployment  # the local backend's
    zygote = deployment.launcher.zygote
    pids = [zygote.proc.pid] if zygote is not None and zygote.proc is not None else []
    return pids + [i.pid for i in deployment.instances if i.pid]


def proc_text(pid: int) -> bytes:
    out = b""
    for name in ("cmdline", "environ"):
        try:
            out += Path(f"/proc/{pid}/{name}").read_bytes()
        except OSError:
            pass
    return out


# ---- 1: a job's env never reaches a privileged process ----------------------------------------


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build the LD_PRELOAD library")
async def test_job_env_ld_preload_never_runs_as_root(rt: LocalRuntime, plugin: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran-as"
    library = plugin / "evil.so"
    source = tmp_path / "evil.c"
    source.write_text(PRELOAD_C)
    subprocess.run(
        ["cc", "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(library), str(source)], check=True
    )
    tmp_path.chmod(0o777)  # where the library reports, whichever uid loads it
    try:
        fn = await rt.deploy(f"{plugin / 'probes.py'}:has_env", env={"LD_PRELOAD": str(library)})
        await fn.invoke(ctx(), sample(name="LD_PRELOAD", value=str(library)), trajectory())
    except PluginCallError as exc:  # refused: named, with what to do
        assert "LD_PRELOAD refused" in exc.message and "job.yaml env:" in exc.message, exc.message
    ran_as = marker.read_text().split() if marker.exists() else []
    assert "0" not in ran_as, f"the job's LD_PRELOAD library ran as root: {ran_as}"


async def test_modules_in_the_runtimes_working_folder_never_run_as_root(
    rt: LocalRuntime, plugin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``plugtune run`` started inside a job's folder: a ``select.py`` there (the worker imports
    select before any sandbox step) must not be what a root worker or probe imports."""
    marker = tmp_path / "imported-as"
    tmp_path.chmod(0o777)
    (plugin / "select.py").write_text(
        f"import os\nwith open({str(marker)!r}, 'a') as f:\n    f.write(f'{{os.geteuid()}}\\n')\n"
    )
    monkeypatch.chdir(plugin)
    served = []
    for network in ("policy-only", "none"):  # the network probe, then the worker
        try:
            fn = await rt.deploy(f"{plugin / 'probes.py'}:has_env", runtime={"network": network})
            served.append((await fn.invoke(ctx(), sample(name="X", value=""), trajectory())).value)
        except PluginCallError as exc:
            served.append(exc.message)
    imported_as = marker.read_text().split() if marker.exists() else []
    assert "0" not in imported_as, f"a module of the working folder ran as root: {imported_as}"
    assert all(isinstance(value, float) for value in served), served  # deployed and served


@pytest.mark.parametrize("use_zygote", [True, False], ids=["zygote", "fresh-spawn"])
async def test_job_env_reaches_the_plugin_but_not_the_workers_exec_or_argv(
    plugin: Path, use_zygote: bool
) -> None:
    secret = f"job-secret-{secrets.token_hex(8)}"
    async with LocalRuntime(spare_instances=False, use_zygote=use_zygote) as rt:
        fn = await rt.deploy(f"{plugin / 'probes.py'}:has_env", env={"JOB_TOKEN": secret})
        out = await fn.invoke(ctx(), sample(name="JOB_TOKEN", value=secret), trajectory())
        assert out.value == 1.0  # set in the plugin once it runs as its own uid
        pids = worker_pids(fn)
        assert len(pids) >= (2 if use_zygote else 1), pids  # the zygote and an instance
        leaks = [pid for pid in pids if secret.encode() in proc_text(pid)]
    assert not leaks, f"the job's variable is in the command line or exec environment of {leaks}"


# ---- 3: one job's plugin cannot read another job's secret in /proc ----------------------------


async def test_a_plugin_finds_no_other_functions_secret_in_proc(rt: LocalRuntime, plugin: Path) -> None:
    secret = f"team-a-key-{secrets.token_hex(8)}"
    victim = await rt.deploy(f"{plugin / 'probes.py'}:has_env", env={"TEAM_KEY": secret})
    assert (await victim.invoke(ctx(), sample(name="TEAM_KEY", value=secret), trajectory())).value == 1.0
    spy = await rt.deploy(f"{plugin / 'probes.py'}:scan_proc")  # runs while the victim's processes do
    result = await spy.invoke(ctx(), sample(secret=secret), trajectory())
    assert reported(result, "found") == [], "another function's secret is readable in /proc"


@HIDDEN_PROC
async def test_a_plugin_sees_no_process_of_another_uid(rt: LocalRuntime, plugin: Path) -> None:
    assert "/proc: its own uid's processes only" in rt.isolation.view, rt.isolation.view
    victim = await rt.deploy(f"{plugin / 'probes.py'}:has_env")
    await victim.invoke(ctx(), sample(name="X", value=""), trajectory())
    spy = await rt.deploy(f"{plugin / 'probes.py'}:scan_proc")
    result = await spy.invoke(ctx(), sample(secret="-"), trajectory())
    others = reported(result, "others")
    assert others == [], f"the plugin sees processes of other uids: {others}"
    assert os.path.exists(f"/proc/{worker_pids(victim)[0]}")  # they run: hidden, not gone
    host_proc = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if " /proc " in line]
    assert host_proc and not [
        line for line in host_proc if "hidepid" in line
    ]  # the host's /proc is as it was


# ---- 5: no host Unix socket, by path or abstract name -----------------------------------------


@pytest.fixture
def host_socket() -> Iterator[tuple[str, str]]:
    """A listening Unix socket in a world-readable folder under /run, and an abstract one."""
    folder = Path(tempfile.mkdtemp(prefix="plugtune-test-sock-", dir="/run"))
    folder.chmod(0o755)
    path = str(folder / "service.sock")
    abstract = f"@plugtune-test-{secrets.token_hex(6)}"
    listeners = [socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)]
    listeners[0].bind(path)
    os.chmod(path, 0o777)
    listeners[1].bind("\0" + abstract[1:])
    for s in listeners:
        s.listen(8)
    try:
        yield path, abstract
    finally:
        for s in listeners:
            s.close()
        shutil.rmtree(folder, ignore_errors=True)


@VIEW
@pytest.mark.parametrize("network", ["policy-only", "none"])
async def test_a_confined_network_reaches_no_host_unix_socket(
    rt: LocalRuntime, plugin: Path, host_socket: tuple[str, str], network: str
) -> None:
    path, abstract = host_socket
    folders, paths = [os.path.dirname(path), "/run", "/var/run"], [path, abstract]
    if PG_SOCKET.exists():  # the real PostgreSQL here (trust auth over this socket)
        folders.append(str(PG_SOCKET.parent))
        paths.append(str(PG_SOCKET))
    fn = await rt.deploy(f"{plugin / 'probes.py'}:host_sockets", runtime={"network": network})
    assert fn.runtime.network == network
    result = await fn.invoke(ctx(), sample(folders=folders, paths=paths), trajectory())
    seen = reported(result, "sockets")
    assert seen == {"listed": ["/run", "/var/run"], "connected": []}, seen  # /run: the empty cover


def test_a_file_the_host_links_below_run_is_bound_back_read_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``/etc/resolv.conf`` -> ``/run/systemd/resolve/stub-resolv.conf`` (systemd-resolved) keeps DNS
    working in ``network: any`` under the /run cover: the link's target is bound back."""
    folder = Path(tempfile.mkdtemp(prefix="plugtune-test-resolve-", dir="/run"))
    try:
        (folder / "stub-resolv.conf").write_text("nameserver 127.0.0.53\n")
        (tmp_path / "resolv.conf").symlink_to(folder / "stub-resolv.conf")
        monkeypatch.setattr(mounts, "REVEAL_FILES", (str(tmp_path / "resolv.conf"),))
        covers, binds = mounts.plan_view([], [])
        assert "/run" in covers and binds.get(str(folder / "stub-resolv.conf")) is True, (covers, binds)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_postgresql_socket_is_really_there_for_the_probe() -> None:
    """The socket test proves something only where PostgreSQL listens on its socket (as here)."""
    if not PG_SOCKET.exists():
        pytest.skip(f"no PostgreSQL socket at {PG_SOCKET}")
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(2)
        s.connect(str(PG_SOCKET))  # root on the host reaches it: the plugin's refusal is the view's


# ---- 11: every writable folder is the function's own, and gone with it ------------------------


@VIEW
async def test_what_a_plugin_writes_anywhere_stays_its_own(rt: LocalRuntime, plugin: Path) -> None:
    token = f"left-{secrets.token_hex(6)}"
    writer = await rt.deploy(f"{plugin / 'probes.py'}:write_everywhere", runtime={"tmp_mb": 4})
    result = await writer.invoke(ctx(), sample(token=token, fill_mb=8), trajectory())
    written = reported(result, "written")
    assert "/tmp" in written and "/var/tmp" in written and "/dev/shm" in written, written  # its own
    assert not {"/run/lock", "/var/lock", "/run", "/var/run"} & set(written), written
    assert reported(result, "fill") == 28  # ENOSPC: /var/tmp is bounded by tmp_mb
    on_host = [d for d in written if os.path.exists(os.path.join(d, token))]
    own = [d for d in on_host if d.startswith(str(rt.backend.sandbox.tmp_root))]  # type: ignore[union-attr]
    assert on_host == own, f"the host sees the plugin's files in {sorted(set(on_host) - set(own))}"
    await writer.close()
    later = await rt.deploy(f"{plugin / 'probes.py'}:find_token")
    seen = reported(await later.invoke(ctx(), sample(token=token), trajectory()), "seen")
    assert seen == [], f"a later function sees the files left in {seen}"
    left = [d for d in written if os.path.exists(os.path.join(d, token))]
    assert left == [], f"files left on the host in {left}"


# ---- 14 (part): the policy bridge's folders ---------------------------------------------------


async def test_policy_bridge_folders_go_with_their_function_and_their_runtime(plugin: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = Path(tempfile.gettempdir()) / f"plugtune-net-{dead.pid}-killed"
    stale.mkdir()
    (stale / "policy.sock").write_bytes(b"")
    async with LocalRuntime(spare_instances=False) as rt:
        assert not stale.exists(), "a dead runtime's bridge folder is left"
        fn = await rt.deploy(f"{plugin / 'probes.py'}:has_env")
        deployment: Any = fn.deployment
        folder = Path(deployment.bridge.folder)
        assert folder.name.startswith(f"plugtune-net-{os.getpid()}-") and folder.exists()
        await fn.close()
        assert not folder.exists()
