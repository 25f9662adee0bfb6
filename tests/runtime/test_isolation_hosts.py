"""What a runtime enforces on hosts that lack root or CAP_SYS_ADMIN, each simulated in a child
process (tests/runtime/sandbox_host.py) that gives up what such a host does not have."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plugtune.errors import Cause
from plugtune.runtime.sandbox import closed_python_paths

ROOT = Path(__file__).resolve().parents[2]
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="simulating a smaller host starts from root")


def _run_host(mode: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.runtime.sandbox_host", mode],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@AS_ROOT
def test_root_without_cap_sys_admin_keeps_its_uid_says_so_and_watches_the_temp_folder() -> None:
    out = _run_host("no-cap-sys-admin")
    isolation = out["isolation"]
    assert isinstance(isolation, dict)
    closed = closed_python_paths()
    if closed:  # this host's Python is under a 0700 folder: no namespace to make it readable
        assert isolation["user"] == f"the runtime's own uid ({closed[0]} is not readable by others)"
        assert out["uid"] == ["uid 0"]
    assert isolation["view"] == (
        "the host's (/tmp, /var/tmp, /dev/shm, /run and /proc shared: "
        "the runtime may not mount (no CAP_SYS_ADMIN))"
    )
    assert isolation["tmp"] == "folder per instance (RLIMIT_FSIZE, size watch)"
    fill = out["fill"]
    assert isinstance(fill, list)
    cause, message = fill
    assert cause == Cause.DISK.value and "size watch" in message and "tmp_mb=4" in message
    assert out["after"] == 1.0  # a fresh instance serves the next call


@AS_ROOT
def test_not_root_a_temp_folder_filled_past_tmp_mb_is_faas_disk_limit() -> None:
    out = _run_host("not-root")
    isolation = out["isolation"]
    assert isinstance(isolation, dict)
    assert isolation["user"] == "the runtime's own uid (not root)" and out["uid"] == ["uid 65534"]
    assert isolation["view"] == (
        "the host's (/tmp, /var/tmp, /dev/shm, /run and /proc shared: the runtime is not root)"
    )
    fill = out["fill"]
    assert isinstance(fill, list)
    cause, message = fill
    assert cause == Cause.DISK.value and "size watch" in message and "tmp_mb=4" in message
    assert out["after"] == 1.0
