"""Plugin instances reach nothing that is not theirs: environment, files, users, temp space, limits."""

from __future__ import annotations

import ast
import asyncio
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from plugtune.errors import Cause, PluginCallError
from plugtune.runtime import LocalRuntime
from plugtune.runtime.sandbox import closed_python_paths, mount_view_problem
from plugtune.runtime.worker.mounts import closed_ancestor, interpreter_paths
from tests.runtime.helpers import ctx, entry, eventually, sample, trajectory, turns_until

AS_ROOT = pytest.mark.skipif(
    os.geteuid() != 0 or (bool(closed_python_paths()) and mount_view_problem() is not None),
    reason="a uid per function needs the runtime to run as root, with a Python other users can read "
    "or a mount namespace that makes it readable",
)


def _messages(result: object) -> list[str]:
    return [line.message for line in result.logs]  # type: ignore[attr-defined]


async def test_plugin_environment_holds_only_the_allow_list_and_its_own_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PLUGTUNE_API_TOKEN", "console-token")
    monkeypatch.setenv("PLUGTUNE_DATABASE_URL", "postgresql://admin:pw@db/plugtune")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "the-shell's-secret")
    async with LocalRuntime() as rt:
        assert rt.isolation.env == "scrubbed"
        fn = await rt.deploy(entry("isolation.py", "environment"), env={"JUDGE_URL": "http://judge"})
        result = await fn.invoke(ctx(), sample(), trajectory())
    (line,) = [m for m in _messages(result) if m.startswith("env ")]
    env = dict(item.split("=", 1) for item in line[4:].split(" "))
    assert not [k for k in env if k.startswith("PLUGTUNE_")], env
    assert "AWS_SECRET_ACCESS_KEY" not in env and env["JUDGE_URL"] == "http://judge"
    allowed = {"PATH", "LANG", "LANGUAGE", "TZ", "PYTHONPATH", "PYTHONUNBUFFERED", "HOME", "TMPDIR"}
    assert set(env) <= allowed | {"JUDGE_URL"} | {k for k in env if k.startswith("LC_")}
    assert env["HOME"] == env["TMPDIR"] and env["HOME"] != os.environ.get("HOME")


@AS_ROOT
async def test_plugin_cannot_read_the_store_home_checkpoints_other_snapshots_or_signal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    (home / "jobs" / "1").mkdir(parents=True)
    sqlite3.connect(home / "plugtune.db").execute("create table secrets (token text)").connection.commit()
    (home / "jobs" / "1" / "checkpoint.pt").write_bytes(b"weights")
    monkeypatch.setenv("PLUGTUNE_HOME", str(home))
    other = tmp_path / "other"
    other.mkdir()
    (other / "grader.py").write_text(
        "from plugtune import grader\n\n\n@grader\ndef score(ctx, sample, trajectory):\n    return 0.5\n"
    )
    async with LocalRuntime(state_dir=home / "runtime") as rt:
        assert rt.isolation.user == "uid per function"
        neighbour = await rt.deploy(f"{other / 'grader.py'}:score")
        fn = await rt.deploy(entry("isolation.py", "reach"))
        own = await rt.deploy(entry("isolation.py", "own_snapshot"))
        assert (await own.invoke(ctx(), sample(), trajectory())).value == 1.0  # its own code it reads
        neighbour_pid = neighbour.deployment.instances[0].pid
        neighbour_code = neighbour.deployment.config["code_root"]  # where its own worker reads it
        reaches = {
            "read": [
                str(home / "plugtune.db"),
                str(home / "jobs" / "1" / "checkpoint.pt"),
                str(neighbour.snapshot.root / "grader.py"),
                f"{neighbour_code}/grader.py",
                "/etc/shadow",
            ],
            "list": [str(home), str(home / "runtime" / "code")],
            "signal": [os.getpid(), neighbour_pid],
        }
        result = await fn.invoke(ctx(), sample(**reaches), trajectory())
        assert (await neighbour.invoke(ctx(), sample(), trajectory())).value == 0.5  # still serving
        private_view = rt.isolation.view.startswith("private mount namespace")
    messages = _messages(result)
    for kind, targets in reaches.items():
        for target in targets:
            # the host's /tmp is not in a private view at all; what it sees but is not its own is refused
            hidden = private_view and str(target).startswith("/tmp/") and "plugtune-tmp-" not in str(target)
            refusal = "FileNotFoundError" if hidden else "PermissionError"
            assert f"{kind} {target}: {refusal}" in messages, messages
    assert result.value == 0.0


async def test_private_tmp_is_per_instance_and_removed_even_when_killed() -> None:
    async with LocalRuntime() as rt:
        fn = await rt.deploy(entry("isolation.py", "write_tmp"))
        result = await fn.invoke(ctx(), sample(), trajectory())
        (wrote,) = [m for m in _messages(result) if m.startswith("wrote ")]
        scratch = Path(wrote.split(" ", 1)[1])
        assert scratch.exists() and scratch.parent.stat().st_mode & 0o077 == 0
        if rt.isolation.tmp.startswith("tmpfs"):
            assert os.path.ismount(scratch.parent)  # a tmpfs of tmp_mb, owned by the function's uid
        await fn.deployment.kill()  # SIGKILL: nothing of its own runs to clean up
        assert await eventually(lambda: not scratch.parent.exists())
        assert (await fn.invoke(ctx(), sample(), trajectory())).value == 1.0
        tmp_root = rt.backend.sandbox.tmp_root  # type: ignore[union-attr]
    assert not tmp_root.exists()


async def test_filling_the_temp_space_is_faas_disk_limit_and_the_function_keeps_serving() -> None:
    async with LocalRuntime() as rt:
        fn = await rt.deploy(entry("isolation.py", "fill_tmp"))
        with pytest.raises(PluginCallError) as info:
            await fn.invoke(ctx(), sample(fill=True), trajectory())
        assert info.value.cause == Cause.DISK.value == "FaaS disk limit"
        assert "tmp_mb" in info.value.hint
        assert (await fn.invoke(ctx(), sample(), trajectory())).value == 1.0


@AS_ROOT
async def test_fork_bomb_is_faas_pids_limit_recycled_and_leaves_no_process() -> None:
    async with LocalRuntime() as rt:
        fn = await rt.deploy(entry("isolation.py", "fork_bomb"))
        uid = fn.deployment.user.uid
        with pytest.raises(PluginCallError) as info:
            await fn.invoke(ctx(), sample(bomb=True), trajectory())
        assert info.value.cause == Cause.PIDS.value == "FaaS pids limit", info.value
        assert "max_pids" in info.value.hint
        assert (await fn.invoke(ctx(), sample(), trajectory())).value == 1.0
    assert _processes_of(uid) == []


async def test_without_a_pids_cgroup_a_fork_bomb_is_faas_pids_limit_and_its_siblings_keep_serving() -> None:
    """The rlimit fallback (forced): RLIMIT_NPROC counts the function's whole uid (and does not bind
    root), so a bomb that holds its children starved the function's other instances (new ones could
    not start a thread). The process watch holds each instance to its own max_pids: the bomb is
    `FaaS pids limit` and the other calls, on instances started meanwhile too, are served."""
    async with LocalRuntime(limits="rlimit") as rt:
        assert not rt.backend.limits.has_pids  # type: ignore[union-attr]
        fn = await rt.deploy(entry("isolation.py", "fork_and_hold"))
        bomb = asyncio.create_task(
            fn.invoke(ctx("bomb"), sample(bomb=True, hold_s=5), trajectory(tid="bomb"))
        )
        await asyncio.sleep(0.5)  # it has forked what it could
        during = await asyncio.gather(
            *(fn.invoke(ctx(f"t{i}"), sample(), trajectory(tid=f"t{i}")) for i in range(3)),
            return_exceptions=True,
        )
        (bombed,) = await asyncio.gather(bomb, return_exceptions=True)
        after = [(await fn.invoke(ctx(f"a{i}"), sample(), trajectory(tid=f"a{i}"))).value for i in range(4)]
    assert [getattr(d, "value", d) for d in during] == [1.0] * 3
    assert isinstance(bombed, PluginCallError) and bombed.cause == Cause.PIDS.value, bombed
    assert "max_pids" in bombed.hint and "process watch" in bombed.message
    assert after == [1.0] * 4


@pytest.mark.parametrize(
    ("function", "fault", "cause"),
    [
        pytest.param("fork_bomb", {"bomb": True}, Cause.PIDS.value, marks=AS_ROOT, id="fork bomb"),
        pytest.param("fill_tmp", {"fill": True}, Cause.DISK.value, id="disk fill"),
    ],
)
async def test_a_call_arriving_just_as_a_limit_is_answered_is_not_sent_to_that_instance(
    function: str, fault: dict[str, object], cause: str
) -> None:
    """A fault-free call that arrives after the limit's answer came in but before its caller resumed
    (and recycled the instance) went to that instance, died with it and was answered with the
    other call's cause (the chaos storm's fault-free 'FaaS pids limit')."""
    async with LocalRuntime() as rt:
        fn = await rt.deploy(entry("isolation.py", function))
        (hit,) = fn.deployment.instances  # type: ignore[attr-defined]
        faulty = asyncio.create_task(fn.invoke(ctx("faulty"), sample(**fault), trajectory(tid="faulty")))
        assert await turns_until(lambda: hit.in_flight == 1), "the faulty call was not sent"
        assert await turns_until(lambda: hit.in_flight == 0), "the faulty call was not answered"
        assert not faulty.done()  # its answer is in, its caller has not resumed: the window
        after = await fn.invoke(ctx("after"), sample(), trajectory(tid="after"))
        with pytest.raises(PluginCallError) as info:
            await faulty
    assert info.value.cause == cause, info.value
    assert after.value == 1.0 and after.instance_id != hit.id


@AS_ROOT
async def test_a_limit_hit_after_the_deadline_retires_the_instance() -> None:
    """An async call blocked past its deadline (Timeout), then forked until refused: the late answer
    cancelled the recycle, so the instance went on serving with its pids cgroup full."""
    async with LocalRuntime() as rt:
        fn = await rt.deploy(entry("isolation.py", "late_fork_bomb"))
        (bombed,) = fn.deployment.instances  # type: ignore[attr-defined]
        with pytest.raises(PluginCallError) as info:
            await fn.invoke(ctx("bomb"), sample(bomb=True), trajectory(tid="bomb"))
        assert info.value.cause == Cause.TIMEOUT.value, info.value
        assert await turns_until(lambda: bombed.fate.draining or bombed.fate.ended, within_s=30)
        assert await turns_until(lambda: bombed.fate.ended, within_s=30), "the bombed instance still runs"
        after = await fn.invoke(ctx("after"), sample(), trajectory(tid="after"))
    assert after.value == 1.0 and after.instance_id != bombed.id


async def test_an_instance_cgroup_left_busy_is_removed_once_its_last_process_ends() -> None:
    """A process that outlives the instance's kill (here: one only the pids hierarchy holds, as a
    busy host's slow-dying process does) kept the cgroup until the runtime closed."""
    async with LocalRuntime() as rt:
        limits = rt.backend.limits  # type: ignore[union-attr]
        if limits.mechanism != "cgroup-v1" or "pids" not in getattr(limits, "roots", {}):
            pytest.skip("needs a cgroup v1 pids hierarchy of its own")
        fn = await rt.deploy(entry("isolation.py", "environment"), runtime={"min_instances": 1})
        (instance,) = fn.deployment.instances  # type: ignore[attr-defined]
        held = instance.limits.pids_dir
        stray = await asyncio.create_subprocess_exec("sleep", "2")
        (held / "cgroup.procs").write_text(str(stray.pid))
        await fn.deployment.kill()  # type: ignore[attr-defined]
        await stray.wait()  # the stray ends 2 s later, long after the instance's cleanup gave up
        assert await turns_until(lambda: not held.exists(), within_s=30), f"{held} is still there"


def _processes_of(uid: int) -> list[psutil.Process]:
    """The uid's live processes, once its killed ones have been reaped (bounded wait: 30 s of wall
    time, not a count of sleeps, which a loaded machine stretches)."""
    deadline = time.monotonic() + 30
    while True:
        procs = [
            p for p in psutil.process_iter(["uids", "status"]) if p.info["uids"] and p.info["uids"][0] == uid
        ]
        if not procs or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    return [p for p in procs if p.info["status"] != psutil.STATUS_ZOMBIE]


async def test_running_out_of_file_descriptors_is_500_naming_the_limit() -> None:
    async with LocalRuntime() as rt:
        fn = await rt.deploy(entry("isolation.py", "open_files"))
        with pytest.raises(PluginCallError) as info:
            await fn.invoke(ctx(), sample(), trajectory())
    assert info.value.cause == "500" and "RLIMIT_NOFILE" in info.value.message


@AS_ROOT
async def test_plugin_has_its_own_tmp_and_dev_shm_and_sees_only_python_in_closed_folders() -> None:
    host_tmp = Path(tempfile.gettempdir()) / f"plugtune-test-host-{os.getpid()}.txt"
    host_shm = Path("/dev/shm") / f"plugtune-test-host-{os.getpid()}"
    for path in (host_tmp, host_shm):
        path.write_text("the host's")
    closed = sorted({c for c in map(closed_ancestor, interpreter_paths()) if c and not c.startswith("/tmp")})
    try:
        async with LocalRuntime() as rt:
            assert rt.isolation.user == "uid per function"
            assert rt.isolation.view.startswith("private mount namespace"), rt.isolation
            fn = await rt.deploy(entry("isolation.py", "view"), runtime={"tmp_mb": 8})
            result = await fn.invoke(ctx(), sample(list=["/tmp", "/dev/shm", *closed]), trajectory())
            with pytest.raises(PluginCallError) as info:
                await fn.invoke(ctx(), sample(fill="/tmp"), trajectory())
            assert info.value.cause == Cause.DISK.value, info.value
            with pytest.raises(PluginCallError) as info:
                await fn.invoke(ctx(), sample(fill="/dev/shm"), trajectory())
            assert info.value.cause == Cause.DISK.value, info.value
            assert (await fn.invoke(ctx(), sample(), trajectory())).value == 1.0  # still serving
    finally:
        for path in (host_tmp, host_shm):
            path.unlink()
    listed = dict(m[len("list ") :].split(": ", 1) for m in _messages(result) if m.startswith("list "))
    tmp_entries = ast.literal_eval(listed["/tmp"])
    # Python's own folders are bound back in where they live (a checkout under /tmp shows its top folder).
    prefixes = [Path(p).resolve().parts for p in (sys.prefix, sys.base_prefix)]
    python_tops = {parts[2] for parts in prefixes if parts[1:2] == ("tmp",)}
    assert host_tmp.name not in tmp_entries
    assert all(e.startswith("plugtune-") or e in python_tops for e in tmp_entries), tmp_entries
    assert ast.literal_eval(listed["/dev/shm"]) == []
    for folder in closed:  # e.g. /root: only the way to Python is left, root's own files are not
        shown = set(ast.literal_eval(listed[folder]))
        assert shown and shown < set(os.listdir(folder)), (folder, shown)
    assert not list(Path(tempfile.gettempdir()).glob("fill-*")) and not list(Path("/dev/shm").glob("fill-*"))
    assert f"uid {os.getuid()}" not in _messages(result)


ROOT_REFUSING = """
import os
from plugtune import grader

if os.getuid() == 0 or not os.access(os.environ["TMPDIR"], os.W_OK):
    raise RuntimeError(f"imported as uid {os.getuid()}, TMPDIR {os.environ['TMPDIR']}")


@grader
def score(ctx, sample, trajectory):
    return 1.0
"""


@AS_ROOT
async def test_ray_spec_probe_imports_the_plugin_in_its_sandbox_not_as_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from plugtune.runtime.ray.host import read_spec

    (tmp_path / "probe.py").write_text(ROOT_REFUSING)
    monkeypatch.chdir(tmp_path)  # where Ray unpacks the snapshot (runtime_env working_dir)
    config = {"entry": f"{tmp_path}/probe.py:score", "relpath": "probe.py", "function": "score", "env": {}}
    out = await read_spec(config, 30.0)
    assert out.get("spec", {}).get("name") == "score", out
    assert not list(Path(tempfile.gettempdir()).glob(f"plugtune-tmp-{os.getpid()}-*"))  # its sandbox is gone
