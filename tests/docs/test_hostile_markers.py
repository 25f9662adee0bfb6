"""`make docs` with a generated-reference marker written wrong: the build stops with one line naming
the page and line and what a marker looks like (mkdocs' PluginError), not a Python traceback; a
misspelt marker was left as a comment and blamed on no page at the end, a wrong name was a
traceback. Builds a copy of mkdocs.yml and docs/ with one marker changed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).with_name("mkdocs")
GOOD = "<!-- generated: taxonomy -->"


def _build(tmp_path: Path, marker: str) -> subprocess.CompletedProcess[str]:
    if not MKDOCS.exists():
        pytest.fail(f"{MKDOCS} is missing: install the docs extra (pip install -e '.[docs]'; make test does)")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    page = tmp_path / "docs" / "failures.md"
    text = page.read_text()
    assert text.count(GOOD) == 1
    page.write_text(text.replace(GOOD, marker))
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")],
        cwd=tmp_path,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("marker", "said"),
    [
        ("<!-- generated: taxonmy -->", "no generator named 'taxonmy' (known: cli, job-yaml, taxonomy)"),
        ("<!-- generatd: taxonomy -->", "'<!-- generatd: taxonomy -->' is not a marker"),
        ("<!-- Generated: taxonomy -->", "'<!-- Generated: taxonomy -->' is not a marker"),
        ("<!-- generated:taxonomy -->", "'<!-- generated:taxonomy -->' is not a marker"),
        ("  <!-- generated: taxonomy -->", "alone on its line from its first column"),
    ],
)
def test_a_marker_written_wrong_stops_the_build_naming_page_and_line(
    tmp_path: Path, marker: str, said: str
) -> None:
    line = (ROOT / "docs" / "failures.md").read_text().splitlines().index(GOOD) + 1
    done = _build(tmp_path, marker)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert f"failures.md:{line}: " in output and said in output, output[-3000:]
