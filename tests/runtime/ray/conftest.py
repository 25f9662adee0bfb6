"""A real two-node Ray cluster on this machine (one CPU each), started and stopped by the tests."""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")

from plugtune.runtime.ray import LocalCluster  # noqa: E402
from plugtune.runtime.ray.loopback import keep_loopback  # noqa: E402


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """Head (``node_head``) + one worker node (``node_1``), joined by this test process as driver.

    Its HOME holds a Ray auth token, as any home does once a local ``ray.init()`` head has run
    there (a job without PLUGTUNE_RAY_ADDRESS): the cluster must start the same either way."""
    home = Path(tempfile.mkdtemp(prefix="ptray-home-"))
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    cluster = LocalCluster()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HOME", str(home))
        try:
            cluster.start_head()
            cluster.add_node()
            keep_loopback()  # this driver too dials 127.0.0.1, not the host's external address
            ray.init(address=cluster.address, namespace="plugtune-tests", log_to_driver=False)
            yield cluster
        finally:
            ray.shutdown()
            cluster.stop()
            shutil.rmtree(home, ignore_errors=True)
    assert not cluster.processes(), "a Ray or plugin process of the test cluster outlived it"
