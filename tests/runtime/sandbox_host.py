"""Run a runtime on a host that lacks something, for tests/runtime/test_isolation_hosts.py.

``python -m tests.runtime.sandbox_host MODE`` (started as root) first takes away:

* ``no-cap-sys-admin``: CAP_SYS_ADMIN (as in Docker's default): still root, but no mounts and no
  mount namespace;
* ``not-root``: root itself: it becomes ``nobody`` (inside a view that keeps Python readable, as a
  plugin's would, since this host's Python is under a 0700 /root);

then deploys ``isolation.py:view`` with tmp_mb=4, fills its temp folder slowly with 1 MiB files,
and prints one JSON line: ``rt.isolation``, the uid the plugin saw, the fill call's cause/message.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import json
import os
import sys

from plugtune.errors import PluginCallError
from plugtune.runtime import LocalRuntime
from plugtune.runtime.worker.mounts import build_view, interpreter_paths
from tests.runtime.helpers import ctx, entry, sample, trajectory

CAP_SYS_ADMIN, PR_CAPBSET_DROP, LINUX_CAPABILITY_VERSION_3 = 21, 24, 0x20080522
NOBODY = 65534


def drop_cap_sys_admin() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0) != 0:  # exec'd children cannot regain it
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    if libc.capget(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    for i in (0, 1):  # effective, permitted (low 32 bits: CAP_SYS_ADMIN is bit 21)
        data[i * 3] &= ~(1 << CAP_SYS_ADMIN)
        data[i * 3 + 1] &= ~(1 << CAP_SYS_ADMIN)
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def become_nobody() -> None:
    build_view(interpreter_paths(), [os.getcwd()], 256)
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)
    os.environ["HOME"] = "/tmp"


async def main() -> dict[str, object]:
    out: dict[str, object] = {}
    async with LocalRuntime(spare_instances=False) as rt:
        out["isolation"] = dataclasses.asdict(rt.isolation)
        fn = await rt.deploy(entry("isolation.py", "view"), runtime={"tmp_mb": 4})
        result = await fn.invoke(ctx(), sample(), trajectory())
        out["uid"] = [line.message for line in result.logs if line.message.startswith("uid ")]
        try:
            await fn.invoke(ctx(), sample(fill="$TMPDIR", pause_s=0.05), trajectory())
        except PluginCallError as exc:
            out["fill"] = [exc.cause, exc.message]
        out["after"] = (await fn.invoke(ctx(), sample(), trajectory())).value
    return out


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "no-cap-sys-admin":
        drop_cap_sys_admin()
    elif mode == "not-root":
        become_nobody()
    else:
        sys.exit(f"unknown mode {mode!r}")
    print(json.dumps(asyncio.run(main())))
