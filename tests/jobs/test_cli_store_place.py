"""Commands that read jobs never make a new, empty store; `serve` checks its port before it says
where it listens."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.settings import Settings
from tests.jobs.jobkit import make_job

runner = CliRunner()


@pytest.fixture()
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with no project and no store, and no store settings in the environment."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.delenv("PLUGTUNE_HOME", raising=False)
    monkeypatch.delenv("PLUGTUNE_DATABASE_URL", raising=False)
    return folder


@pytest.mark.parametrize(
    "args", [["jobs", "list"], ["jobs", "show", "1"], ["jobs", "cancel", "1"], ["logs", "1"], ["doctor", "1"]]
)
def test_reading_commands_say_where_they_looked_instead_of_making_a_store(
    elsewhere: Path, args: list[str]
) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert f"no plugtune store at {elsewhere / '.plugtune' / 'plugtune.db'}" in result.output
    assert "PLUGTUNE_HOME is not set" in result.output and "export PLUGTUNE_HOME=" in result.output
    assert "Traceback" not in result.output
    assert list(elsewhere.iterdir()) == []


def test_the_message_names_the_plugtune_home_that_was_set(
    elsewhere: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLUGTUNE_HOME", str(elsewhere / "wrong"))
    result = runner.invoke(app, ["jobs", "list"])
    assert result.exit_code == 2
    assert f"PLUGTUNE_HOME={elsewhere / 'wrong'}" in result.output
    assert not (elsewhere / "wrong").exists()


def test_commands_that_start_work_make_the_store_and_readers_then_find_it(
    tmp_path: Path, elsewhere: Path
) -> None:
    submitted = runner.invoke(app, ["submit", str(make_job(tmp_path / "job"))])
    assert submitted.exit_code == 0, submitted.output
    listed = runner.invoke(app, ["jobs", "list"])
    assert listed.exit_code == 0 and "queued" in listed.output


@pytest.fixture()
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_serve_on_a_port_in_use_fails_before_printing_its_url(home: Settings, taken_port: int) -> None:
    result = runner.invoke(app, ["serve", "--port", str(taken_port)])
    assert result.exit_code == 1
    assert f"port {taken_port} on 127.0.0.1 is already in use" in result.output
    assert "--port" in result.output
    assert "plugtune console" not in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
