"""`plugtune serve` answers the names given by --allowed-host and PLUGTUNE_ALLOWED_HOSTS, and refuses
any other Host header (DNS rebinding) with a 400 that says how to allow it."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, host: str) -> tuple[int, dict[str, object]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", "/api/jobs", headers={"host": host})
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        connection.close()


def _wait_listening(port: int, server: subprocess.Popen[bytes], log: Path) -> None:
    for _ in range(600):  # 60 s at most: the CLI imports the platform first
        if server.poll() is not None:
            raise AssertionError(f"plugtune serve exited {server.returncode}: {log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"plugtune serve did not listen within 60 s: {log.read_text()}")


def test_serve_answers_allowed_hosts_and_refuses_others(tmp_path: Path) -> None:
    port, log = _free_port(), tmp_path / "serve.log"
    env = dict(os.environ, PLUGTUNE_HOME=str(tmp_path / "home"), PLUGTUNE_ALLOWED_HOSTS="env.example, ")
    env.pop("PLUGTUNE_DATABASE_URL", None)
    env.pop("PLUGTUNE_API_TOKEN", None)
    argv = [
        sys.executable,
        "-m",
        "plugtune.cli",
        "serve",
        "--port",
        str(port),
        "--allowed-host",
        "flag.example",
    ]
    with open(log, "wb") as out:
        server = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_listening(port, server, log)
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "flag.example", f"ENV.example:{port}"):
            assert _get(port, host)[0] == 200, host
        status, answer = _get(port, f"rebound.example:{port}")
        assert status == 400
        assert "--allowed-host rebound.example" in str(answer["detail"]) and "PLUGTUNE_ALLOWED_HOSTS" in str(
            answer["detail"]
        )
    finally:
        server.kill()
        server.wait(10)
