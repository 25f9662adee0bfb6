"""`pip install` works: the wheel built from this tree, installed into a fresh virtual environment with
the CPU torch pin, runs the packaged demo job, `init` + `lint` + `test` + `run`, and serves the console
(package data complete: demo model, data and plugins, the project template, templates, static files)."""

from __future__ import annotations

import http.client
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 900) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{output[-4000:]}"
    return output


def _short(job_yaml: Path, steps: int = 2) -> None:
    text = re.sub(r"(?m)^(\s*steps:\s*)\d+", rf"\g<1>{steps}", job_yaml.read_text())
    text = re.sub(r"(?m)^\s*eval_every_n_steps:.*\n", "", text)
    text = re.sub(r"(?m)^eval:.*\n", "", text)
    job_yaml.write_text(text)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path, headers={"host": f"127.0.0.1:{port}"})
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding torch==2.13.0 (CPU) and the wheel built from this tree; its bin folder."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    source.mkdir()
    shutil.copytree(ROOT / "plugtune", source / "plugtune", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PLUGTUNE_", "PYTHON", "VIRTUAL_ENV"))}
    build = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(work / "dist")]
    _run(build, source, env)
    (wheel,) = (work / "dist").glob("plugtune-*.whl")
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], work, env)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run([*pip, "torch==2.13.0"], work, env, timeout=1500)  # first: the CPU build, never a CUDA one
    _run([*pip, str(wheel)], work, env, timeout=1500)
    return venv / "bin"


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PLUGTUNE_", "PYTHON", "VIRTUAL_ENV"))}
    env["PLUGTUNE_HOME"] = str(tmp / "home")
    return env


def test_the_wheel_runs_the_packaged_demo_job(installed: Path, tmp_path: Path) -> None:
    env = _env(tmp_path)
    code = "from plugtune.jobs.demo import demo_job_file; print(demo_job_file())"
    where = _run([str(installed / "python"), "-c", code], tmp_path, env).strip()
    assert str(installed.parent) in where  # the installed copy, not this checkout
    demo = tmp_path / "demo"
    shutil.copytree(Path(where).parent, demo, ignore=shutil.ignore_patterns("__pycache__"))
    _short(demo / "job.yaml")
    output = _run([str(installed / "plugtune"), "run", str(demo / "job.yaml")], tmp_path, env)
    assert "succeeded" in output, output[-2000:]
    assert "Usage" in _run([str(installed / "plugtune"), "demo", "--help"], tmp_path, env)


def test_the_wheel_inits_tests_and_runs_a_project_and_serves_the_console(
    installed: Path, tmp_path: Path
) -> None:
    env = _env(tmp_path)
    cli = str(installed / "plugtune")
    _run([cli, "init", "proj"], tmp_path, env)
    project = tmp_path / "proj"
    _short(project / "job.yaml")
    _run([cli, "lint"], project, env)
    tested = _run([cli, "test", "--samples", "2"], project, env)
    assert "reward" in tested.lower(), tested[-2000:]
    ran = _run([cli, "run", "job.yaml"], project, env)
    assert "succeeded" in ran, ran[-2000:]
    port = _free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        server = subprocess.Popen([cli, "serve", "--port", str(port)], env=env, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert server.poll() is None, log.read_text()
            try:
                status, page = _get(port, "/jobs/1")
                break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        assert status == 200 and b"proj" in page
        for asset in ("/static/style.css", "/static/job.js", "/static/chart.js"):
            assert _get(port, asset)[0] == 200, asset
    finally:
        server.terminate()
        server.wait(20)
