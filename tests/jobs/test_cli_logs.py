"""`plugtune logs` prints every stored line once and in order, or says what it left out: a
--limit above one store page pages, --follow keeps up with bursts far larger than a page."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.settings import Settings
from plugtune.store import Store
from plugtune.store.base import MAX_PAGE
from plugtune.types import LogLine

runner = CliRunner()


def _write(store: Store, job_id: int, start: int, count: int) -> None:
    lines = [
        LogLine(time=1000.0 + i, level="INFO", plugin="solve", message=f"line {i:05d}")
        for i in range(start, start + count)
    ]
    store.add_logs(job_id, lines)


def _printed(text: str) -> list[str]:
    return [line.rsplit(" ", 1)[-1] for line in text.splitlines() if " line " in line]


def test_a_limit_over_one_page_prints_every_line_and_counts_the_older_ones(
    home: Settings, store: Store
) -> None:
    job_id = store.create_job("logs", {})
    _write(store, job_id, 0, 3 * MAX_PAGE)
    everything = runner.invoke(app, ["logs", str(job_id), "--limit", "100000"])
    assert everything.exit_code == 0, everything.output
    assert _printed(everything.stdout) == [f"{i:05d}" for i in range(3 * MAX_PAGE)]  # it printed 1,000
    assert "not shown" not in everything.stderr
    newest = runner.invoke(app, ["logs", str(job_id), "--limit", "1500"])
    assert _printed(newest.stdout) == [f"{i:05d}" for i in range(3 * MAX_PAGE - 1500, 3 * MAX_PAGE)]
    assert f"({3 * MAX_PAGE - 1500} older lines not shown" in newest.stderr
    every = runner.invoke(app, ["logs", str(job_id), "--all"])
    assert _printed(every.stdout) == [f"{i:05d}" for i in range(3 * MAX_PAGE)]


def test_follow_prints_each_line_written_while_it_follows_once_and_in_order(
    tmp_path: Path, home: Settings, store: Store
) -> None:
    job_id = store.create_job("logs", {})
    _write(store, job_id, 0, 100)
    out = tmp_path / "follow.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "plugtune.cli", "logs", str(job_id), "--follow"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=dict(os.environ),
        )
    total = 5000
    try:
        deadline = time.monotonic() + 60
        while len(_printed(out.read_text())) < 100:  # it has started following
            assert proc.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.1)
        written = 100
        for burst in (2500, 1200, 1, 1199):  # most far over one page, each between two of its polls
            _write(store, job_id, written, burst)
            written += burst
            time.sleep(1.2)
        assert written == total
        while len(_printed(out.read_text())) < total and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert _printed(out.read_text()) == [f"{i:05d}" for i in range(total)]
