"""`plugtune submit` against servers: the console URL of the running `plugtune serve`, `--server URL`
to a real console over HTTP (queued, 422 problems, refused, 401, 413), and queue positions in
`plugtune jobs list/show`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.settings import Settings
from plugtune.store import Store
from plugtune.web import create_app, guard
from tests.jobs.jobkit import make_job
from tests.web.browsing import free_port, serving

runner = CliRunner()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    job_file = make_job(tmp_path / "remote-task")
    (job_file.parent / ".venv" / "lib").mkdir(parents=True)
    (job_file.parent / ".venv" / "lib" / "big.bin").write_bytes(b"\0" * 1000)
    (job_file.parent / "plugins" / "__pycache__").mkdir()
    (job_file.parent / "plugins" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    return job_file


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Store, Path]]:
    """A real console (uvicorn on a free 127.0.0.1 port) over its own store and home."""
    home = tmp_path / "server-home"
    store = Store.open(f"sqlite:///{home / 'plugtune.db'}", retention_days=7)
    with serving(create_app(store, home=home)) as base:
        yield base, store, home
    store.close()


def test_submit_server_packs_the_folder_and_queues_the_job(
    served: tuple[str, Store, Path], project: Path
) -> None:
    base, store, home = served
    result = runner.invoke(app, ["submit", "--server", base, str(project)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"job 1 queued on {base} (console: {base}/jobs/1)"
    job = store.get_job(1)
    assert job is not None and job.status == "queued" and job.name == "remote-task"
    folder = Path(job.spec["job_file"]).parent
    assert (folder / "plugins" / "grader.py").is_file() and (folder / "data" / "train.jsonl").is_file()
    assert not (folder / ".venv").exists() and not (folder / "plugins" / "__pycache__").exists()


def test_submit_server_prints_the_problems_like_local_submit(
    served: tuple[str, Store, Path], project: Path
) -> None:
    base, store, _ = served
    text = project.read_text().replace("learning_rate: 0.001", "learning_rate: -1")
    project.write_text(text)
    (project.parent / "data" / "train.jsonl").write_text("{not json\n")
    result = runner.invoke(app, ["submit", "--server", base, str(project)])
    assert result.exit_code == 1, result.output
    assert "job 1 failed validation before any compute:" in result.output
    line = text.splitlines().index("  learning_rate: -1") + 1
    assert f"  - job.yaml:{line} [hyperparameters.learning_rate]: " in result.output, result.output
    assert "  - data/train.jsonl:1" in result.output and "what to do: " in result.output
    job = store.get_job(1)
    assert job is not None and job.status == "failed"


def test_submit_server_says_in_one_line_when_nothing_listens(project: Path) -> None:
    port = free_port()
    result = runner.invoke(app, ["submit", "--server", f"http://127.0.0.1:{port}", str(project)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"plugtune submit: cannot reach http://127.0.0.1:{port} (connection refused); is `plugtune serve` "
        "running there? Check --server"
    ]
    bad = runner.invoke(app, ["submit", "--server", "ftp://example", str(project)])
    assert bad.exit_code == 2 and "not a usable URL" in bad.output and len(bad.output.splitlines()) == 1


def test_submit_server_401_and_413_are_one_clear_line(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'locked' / 'plugtune.db'}", retention_days=7)
    with serving(create_app(store, api_token="t0ken", home=tmp_path / "locked")) as base:
        monkeypatch.delenv("PLUGTUNE_API_TOKEN", raising=False)
        missing = runner.invoke(app, ["submit", "--server", base, str(project)])
        assert missing.exit_code == 2 and len(missing.output.strip().splitlines()) == 1
        assert "requires an API token (401): export PLUGTUNE_API_TOKEN=" in missing.output
        monkeypatch.setenv("PLUGTUNE_API_TOKEN", "wrong")
        wrong = runner.invoke(app, ["submit", "--server", base, str(project)])
        assert wrong.exit_code == 2 and "refused the API token in PLUGTUNE_API_TOKEN (401)" in wrong.output
        monkeypatch.setenv("PLUGTUNE_API_TOKEN", "t0ken")
        monkeypatch.setitem(
            guard.UPLOADS, ("POST", "/api/jobs"), (100, guard.UPLOADS[("POST", "/api/jobs")][1])
        )
        too_big = runner.invoke(app, ["submit", "--server", base, str(project)])
        assert too_big.exit_code == 2 and len(too_big.output.strip().splitlines()) == 1, too_big.output
        assert (
            "refused the upload as too large (413)" in too_big.output
            and "accepts at most 100:" in too_big.output
        )
        monkeypatch.undo()
        monkeypatch.setenv("PLUGTUNE_API_TOKEN", "t0ken")
        ok = runner.invoke(app, ["submit", "--server", base + "/", str(project)])
        assert ok.exit_code == 0 and "job 1 queued" in ok.output, ok.output
    store.close()


def test_jobs_list_and_show_give_a_queued_jobs_place(home: Settings, store: Store) -> None:
    first, second = store.create_job("first", {}), store.create_job("second", {})
    listed = runner.invoke(app, ["jobs", "list"])
    assert listed.exit_code == 0, listed.output
    rows = {line.split()[0]: line for line in listed.output.splitlines()}
    assert rows[str(first)].endswith("(#1 in the queue)") and rows[str(second)].endswith("(#2 in the queue)")
    shown = runner.invoke(app, ["jobs", "show", str(second)])
    assert "#2 in the queue (1 queued job(s) start before it)" in shown.output
    as_json = json.loads(runner.invoke(app, ["jobs", "show", str(second), "--json"]).stdout)
    assert as_json["queue_position"] == 2
    listed_json = json.loads(runner.invoke(app, ["jobs", "list", "--json"]).stdout)
    assert [j["queue_position"] for j in listed_json["jobs"]] == [2, 1]


def test_submit_prints_the_url_of_the_running_serve_or_says_none_runs(
    home: Settings, tmp_path: Path, project: Path
) -> None:
    port = free_port()
    env = dict(os.environ, PLUGTUNE_HOME=str(home.home), PLUGTUNE_DATABASE_URL=home.database_url)
    serve = subprocess.Popen(
        [sys.executable, "-m", "plugtune.cli", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        record = home.home / "serve.json"
        deadline = time.monotonic() + 60
        while not record.is_file():
            assert serve.poll() is None and time.monotonic() < deadline, "serve did not start"
            time.sleep(0.1)
        assert json.loads(record.read_text()) == {"url": f"http://127.0.0.1:{port}/", "pid": serve.pid}
        result = runner.invoke(app, ["submit", str(project)])
        assert result.exit_code == 0, result.output
        assert result.output.strip() == (
            f"job 1 queued; `plugtune serve` runs it (console: http://127.0.0.1:{port}/jobs/1)"
        )
    finally:
        serve.send_signal(signal.SIGINT)
        serve.wait(timeout=60)
    assert not (home.home / "serve.json").exists()  # removed on exit
    after = runner.invoke(app, ["submit", str(project)])
    assert after.exit_code == 0
    assert f"no `plugtune serve` is running on this store ({home.home})" in after.output
    assert "8321" not in after.output


def test_a_serve_json_left_by_a_killed_server_is_not_believed(home: Settings, project: Path) -> None:
    home.home.mkdir(parents=True, exist_ok=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (home.home / "serve.json").write_text(json.dumps({"url": "http://127.0.0.1:9/", "pid": dead.pid}))
    result = runner.invoke(app, ["submit", str(project)])
    assert "no `plugtune serve` is running" in result.output and "127.0.0.1:9" not in result.output
    (home.home / "serve.json").write_text(json.dumps({"url": "http://127.0.0.1:9/", "pid": os.getpid()}))
    reused = runner.invoke(app, ["submit", str(project)])  # a live pid, but not a server's
    assert "no `plugtune serve` is running" in reused.output, reused.output
