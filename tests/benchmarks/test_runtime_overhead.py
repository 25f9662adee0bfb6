"""benchmarks/runtime_overhead.py's command line: --help and bad knobs answer at once, running nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "runtime_overhead.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_help_prints_usage_and_the_knobs() -> None:
    done = _run("--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: benchmarks/runtime_overhead.py")
    for knob in ("--calls", "--rounds", "--concurrent-calls", "--window"):
        assert knob in done.stdout
    assert "What the function runtime costs per call" in done.stdout and "| transport |" not in done.stdout


def test_a_bad_knob_is_exit_2_naming_it() -> None:
    done = _run("--window", "64", "--concurrent-calls", "100")
    assert done.returncode == 2 and done.stdout == ""
    assert "--concurrent-calls must be at least 256 (4 × --window" in done.stderr and "got 100" in done.stderr
    assert "--rounds must be at least 1, got 0" in _run("--rounds", "0").stderr
    assert "invalid int value: 'many'" in _run("--calls", "many").stderr
