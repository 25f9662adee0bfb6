"""Hostile code run on the user's machine, and the home's files (issue 23, items 12, 13 and 14's
run-versus-serve race).

12: ``plugtune replay`` runs a job's recorded code (the submitter's) in the function runtime's
sandbox by default; an in-process replay as root is refused without ``--unsandboxed-as-root``;
``plugtune test`` in-process says it is unsandboxed.
13: a fresh home, after a real job, has no path another user can read, except what the runtime
opens on purpose (the state dir's traversal bits, snapshots granted to their own group).
14: ``plugtune run`` on a store that a ``plugtune serve`` serves is refused (a kernel lock the
server holds for its lifetime, so a crashed server blocks nothing); serve.json goes with SIGTERM.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.pretest.replay import UnsandboxedAsRootError, replay
from plugtune.runtime.snapshot import collect, content_hash
from plugtune.sdk import Runtime
from plugtune.store import Store
from plugtune.types import TrajectoryRecord

IS_ROOT = os.geteuid() == 0

ROLLOUT = """
import os
import socket
import stat
import subprocess
import sys
from plugtune import rollout

@rollout
def whoami(ctx, policy, sample):
    ctx.logger.info("uid=%d", os.getuid())
    return None
"""

GRADER = """
from plugtune import grader

@grader
def one(ctx, sample, trajectory):
    return 1.0
"""

QUESTION = {"role": "user", "content": "What is 1+2?"}


@pytest.fixture()
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    url = f"sqlite:///{tmp_path / 'home' / 'plugtune.db'}"
    monkeypatch.setenv("PLUGTUNE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PLUGTUNE_DATABASE_URL", url)
    s = Store.open(url)
    yield s
    s.close()


def recorded_job(store: Store, project: Path) -> int:
    """A job as an attempt records it (spec, plugins' code by hash, one successful trajectory)."""
    (project / "plugins").mkdir(parents=True)
    (project / "data").mkdir()
    (project / "plugins" / "rollout.py").write_text(textwrap.dedent(ROLLOUT))
    (project / "plugins" / "grader.py").write_text(textwrap.dedent(GRADER))
    (project / "data" / "train.jsonl").write_text(json.dumps({"messages": [QUESTION]}) + "\n")
    (project / "job.yaml").write_text("name: hostile\n")
    files = collect(project / "plugins")
    code_hash = content_hash(files)
    store.put_code(code_hash, files)
    spec = {"job_file": str(project / "job.yaml"), "data": {"train": "data/train.jsonl"}}
    job_id = store.create_job("hostile", spec)
    for name, role, file in (("whoami", "rollout", "rollout.py"), ("one", "grader", "grader.py")):
        entry = f"{project / 'plugins' / file}:{name}"
        store.upsert_plugin(job_id, name, role, entry, code_hash=code_hash, runtime=Runtime().to_dict())
    record = TrajectoryRecord(
        trajectory_id="s0-p0-r0",
        group_id="s0-p0",
        step=0,
        sample_index=0,
        rollout_index=0,
        attempt=1,
        policy_version=0,
        prompt_ids=[],
        response_ids=[],
        response_mask=[],
        response_logprobs=[],
        messages=[QUESTION],
        status="success",
        reward=1.0,
        reward_components={"one": 1.0},
    )
    store.upsert_trajectories(job_id, [record])
    return job_id


def _uids(doc: dict[str, object]) -> list[int]:
    trajectory = doc["trajectory"]
    assert isinstance(trajectory, dict)
    return [int(line["message"][4:]) for line in trajectory["logs"] if line["message"].startswith("uid=")]


def test_replay_runs_the_recorded_code_in_the_sandbox(store: Store, tmp_path: Path) -> None:
    """By default the recorded rollout runs in a sandboxed instance: as root, under a uid of its own."""
    job_id = recorded_job(store, tmp_path / "project")
    doc = replay(store, job_id, "s0-p0-r0")
    assert doc["reproduced"], doc
    assert not str(doc["sandbox"]).startswith("none"), doc["sandbox"]
    uids = _uids(doc)
    assert uids, doc["trajectory"]
    if IS_ROOT:
        assert "uid per function" in str(doc["sandbox"])
        assert all(uid != 0 for uid in uids), uids
    said = CliRunner().invoke(app, ["replay", str(job_id), "s0-p0-r0"])
    assert said.exit_code == 0, said.output
    assert "sandbox: " in said.output and "UNSANDBOXED" not in said.output


@pytest.mark.skipif(not IS_ROOT, reason="the refusal is for root; an ordinary user may replay in-process")
def test_in_process_replay_as_root_is_refused_without_the_flag(store: Store, tmp_path: Path) -> None:
    job_id = recorded_job(store, tmp_path / "project")
    with pytest.raises(UnsandboxedAsRootError, match="--unsandboxed-as-root"):
        replay(store, job_id, "s0-p0-r0", in_process=True)
    said = CliRunner().invoke(app, ["replay", str(job_id), "s0-p0-r0", "--in-process"])
    assert said.exit_code == 2, said.output
    text = " ".join(said.output.split())
    assert "refusing to run job" in text and "as root" in text and "Replay without --in-process" in text
    forced = CliRunner().invoke(
        app, ["replay", str(job_id), "s0-p0-r0", "--in-process", "--unsandboxed-as-root", "--json"]
    )
    assert forced.exit_code == 0, forced.output
    assert "UNSANDBOXED" in forced.stderr
    doc = json.loads(forced.stdout)
    assert str(doc["sandbox"]).startswith("none") and _uids(doc) == [0]


@pytest.mark.skipif(not IS_ROOT, reason="the warning is for root")
def test_plugtune_test_in_process_as_root_warns(tmp_path: Path) -> None:
    from tests.jobs.jobkit import make_job

    job = make_job(tmp_path / "own", hyper={"max_new_tokens": 2})
    said = CliRunner().invoke(app, ["test", str(job), "--samples", "1"])
    assert said.exit_code in (0, 1), said.output
    assert "as root, UNSANDBOXED" in " ".join(said.stderr.split())


# ---- 13: the home's files ------------------------------------------------------------------------


def _opened_on_purpose(path: Path, home: Path, mode: int, gid: int) -> bool:
    """What the runtime opens with explicit modes: the state dir's chain traversable (0711, not
    listable), and a snapshot granted to its own plugin group (no bits for others)."""
    from plugtune.runtime.sandbox import PLUGIN_GIDS

    rel = path.relative_to(home).parts
    if rel in ((), ("runtime",), ("runtime", "code")):
        return stat.S_IMODE(mode) == 0o711
    in_snapshot = rel[:2] == ("runtime", "code") and len(rel) >= 3
    return in_snapshot and gid in PLUGIN_GIDS and not mode & 0o007


@pytest.mark.slow
def test_a_fresh_home_after_a_real_job_is_owner_only(tmp_path: Path) -> None:
    """`plugtune run` of a short job (checkpoints, final/, TensorBoard) on a fresh home: no path in
    it is readable by another user (a plugin's uid), except what the runtime opens on purpose."""
    from tests.jobs.jobkit import make_job

    job = make_job(tmp_path / "project", hyper={"steps": 1, "batch_size": 1, "max_new_tokens": 2})
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in ("PLUGTUNE_DATABASE_URL", "PLUGTUNE_API_TOKEN")}
    env["PLUGTUNE_HOME"] = str(home)
    done = subprocess.run(
        [sys.executable, "-m", "plugtune.cli", "run", str(job)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (home / "jobs" / "1" / "final").is_dir() and any((home / "jobs" / "1" / "checkpoints").iterdir())
    opened = []
    for path in [home, *home.rglob("*")]:
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode) or not info.st_mode & 0o077:
            continue
        if not _opened_on_purpose(path, home, info.st_mode, info.st_gid):
            opened.append(f"{path.relative_to(home)} {stat.filemode(info.st_mode)}")
    assert not opened, opened


# ---- 14: plugtune run beside plugtune serve --------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_serve(home: Path, log: Path) -> subprocess.Popen[bytes]:
    """A real `plugtune serve` on 127.0.0.1 over ``home``, once it has written serve.json."""
    argv = [sys.executable, "-m", "plugtune.cli", "serve", "--host", "127.0.0.1", "--port", str(_free_port())]
    env = {k: v for k, v in os.environ.items() if k not in ("PLUGTUNE_DATABASE_URL", "PLUGTUNE_API_TOKEN")}
    with open(log, "wb") as out:
        server = subprocess.Popen(argv, env={**env, "PLUGTUNE_HOME": str(home)}, stdout=out, stderr=out)
    deadline = time.monotonic() + 60  # the CLI imports the platform first
    while not (home / "serve.json").is_file():
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise AssertionError(f"plugtune serve did not start: {log.read_text()}")
        time.sleep(0.1)
    return server


@pytest.fixture()
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A real `plugtune serve` over a fresh home (PLUGTUNE_HOME set for this test too)."""
    home = tmp_path / "home"
    monkeypatch.setenv("PLUGTUNE_HOME", str(home))
    monkeypatch.delenv("PLUGTUNE_DATABASE_URL", raising=False)
    monkeypatch.delenv("PLUGTUNE_API_TOKEN", raising=False)
    server = _start_serve(home, tmp_path / "serve.log")
    try:
        yield server, home
    finally:
        server.kill()
        server.wait(10)


def _invalid_job(root: Path) -> Path:
    """A job.yaml that fails validation at once: `run` gets past the lock and stops there (exit 1)."""
    root.mkdir()
    (root / "job.yaml").write_text("name: broken\n")
    return root / "job.yaml"


def test_run_on_a_served_store_is_refused_and_sigterm_removes_serve_json(
    served: tuple[subprocess.Popen[bytes], Path], tmp_path: Path
) -> None:
    server, home = served
    url = json.loads((home / "serve.json").read_text())["url"]
    said = CliRunner().invoke(app, ["run", str(_invalid_job(tmp_path / "project"))])
    assert said.exit_code == 2, said.output
    text = " ".join(said.output.split())
    assert f"a plugtune serve (pid {server.pid}, {url}) is serving this store" in text, text
    assert "plugtune submit" in text
    with Store.open(f"sqlite:///{home / 'plugtune.db'}") as store:
        assert store.list_jobs() == [], "the refused run queued nothing for the server"
    server.terminate()
    server.wait(30)
    assert not (home / "serve.json").exists(), "serve.json outlived a clean SIGTERM"
    after = CliRunner().invoke(app, ["run", str(tmp_path / "project" / "job.yaml")])
    assert after.exit_code == 1 and "failed validation" in after.output, after.output


def test_a_killed_server_blocks_no_run(served: tuple[subprocess.Popen[bytes], Path], tmp_path: Path) -> None:
    """The lock is the kernel's: it goes with the server's process, even when serve.json stays."""
    server, home = served
    server.kill()
    server.wait(10)
    assert (home / "serve.json").is_file()  # what kill -9 leaves; it decides nothing
    said = CliRunner().invoke(app, ["run", str(_invalid_job(tmp_path / "project"))])
    assert said.exit_code == 1 and "failed validation" in said.output, said.output


def test_a_serve_started_during_a_run_waits_for_it(tmp_path: Path) -> None:
    """While a run supervises a job of the home, a new server's scheduler starts nothing; it takes
    over the queue when the run ends."""
    from plugtune.jobs.supervisor_lock import running_alone

    home, log = tmp_path / "home", tmp_path / "serve.log"
    with Store.open(f"sqlite:///{home / 'plugtune.db'}") as store:
        job_id = store.create_job("queued", {"job_file": str(tmp_path / "none.yaml")})
        with running_alone(home):
            server = _start_serve(home, log)
            try:
                deadline = time.monotonic() + 60  # a busy machine's server is slow to get there
                while "supervises a job of this store" not in log.read_text():
                    assert time.monotonic() < deadline, log.read_text()
                    time.sleep(0.1)
                assert f"pid {os.getpid()}" in log.read_text()
                time.sleep(2.5)  # two of the scheduler's polls, had it started
                job = store.get_job(job_id)
                assert job is not None and job.status == "queued", job
            except BaseException:
                server.kill()
                raise
        try:
            deadline = time.monotonic() + 60  # a few scheduler polls, on a busy machine
            while (job := store.get_job(job_id)) is not None and job.status == "queued":
                assert time.monotonic() < deadline, f"the server never took the queue: {log.read_text()}"
                time.sleep(0.2)
        finally:
            server.kill()
            server.wait(10)


@pytest.mark.skipif(not IS_ROOT, reason="a mount namespace and another uid need root")
def test_the_plugin_view_keeps_its_modes_under_the_homes_umask(tmp_path: Path) -> None:
    """An attempt runs with umask 077 (its files are the home owner's alone), and its workers inherit
    it: the folders a plugin's file view recreates to bind a path back must still be 0755, or the
    plugin's uid cannot reach the interpreter's files behind a closed folder (e.g. a venv in /root)."""
    shown = tmp_path / "closed" / "lib" / "python"
    shown.mkdir(parents=True)
    (shown / "module.py").write_text("ok")
    for folder in (shown, shown.parent):
        folder.chmod(0o755)
    (shown / "module.py").chmod(0o644)
    (tmp_path / "closed").chmod(0o700)
    script = textwrap.dedent(
        f"""
        import os, sys
        from plugtune.runtime.worker.mounts import MountError, build_view
        os.umask(0o077)
        try:
            build_view([{str(shown)!r}], [], 1)
        except MountError as exc:
            sys.exit(f"skip: {{exc}}")
        os.setgid(65534)
        os.setuid(65534)
        print(open({str(shown / "module.py")!r}).read())
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    if done.stderr.startswith("skip:"):
        pytest.skip(f"no private mount namespace here: {done.stderr.strip()}")
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


@pytest.mark.skipif(not IS_ROOT, reason="a uid per function needs root")
def test_a_zygote_instance_starts_under_the_attempts_umask(tmp_path: Path) -> None:
    """An attempt's umask 077 made the instance cgroups 0700: a zygote's fork, already the function's
    uid, could not enter its cgroup and every real job failed to deploy ('exited with status 4')."""
    plugin = tmp_path / "grader.py"
    code = "from plugtune import grader\n\n\n@grader\ndef score(ctx, sample, trajectory):\n    return 1\n"
    plugin.write_text(code)
    plugin.chmod(0o644)
    tmp_path.chmod(0o755)
    script = textwrap.dedent(
        f"""
        import asyncio, os
        from plugtune.runtime import LocalRuntime
        os.umask(0o077)

        async def main():
            async with LocalRuntime() as rt:
                fn = await rt.deploy({str(plugin) + ":score"!r})
                print("deployed", fn is not None)

        asyncio.run(main())
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stdout + done.stderr
    # and an instance that cannot start says why in the fault itself (its stderr said it, unseen)
    plain_mkdir = "import plugtune.runtime.limits as L\nL._mkdir = lambda p: p.mkdir()"
    closed = script.replace("os.umask(0o077)", f"os.umask(0o077)\n{plain_mkdir}")
    done = subprocess.run([sys.executable, "-c", closed], capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode != 0
    assert "exited before it was ready (exited with status 4): PermissionError" in done.stderr, done.stderr


def test_a_submission_folder_is_owner_only_whatever_the_umask(tmp_path: Path) -> None:
    """An API submission (another team's code and data) is unpacked into a folder no other user reads,
    also in a process without the server's umask (the web app in a test, a library caller)."""
    from plugtune.jobs.submission import new_folder

    previous = os.umask(0o022)
    try:
        folder = new_folder(tmp_path / "home")
    finally:
        os.umask(previous)
    for made in (folder, folder.parent, folder.parent.parent):
        assert stat.S_IMODE(made.stat().st_mode) == 0o700, made
