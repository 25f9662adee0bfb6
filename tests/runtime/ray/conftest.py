"""A real two-node Ray cluster on this machine (one CPU each), started and stopped by the tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")

from plugtune.runtime.ray import LocalCluster  # noqa: E402
from plugtune.runtime.ray.loopback import keep_loopback  # noqa: E402


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """Head (``node_head``) + one worker node (``node_1``), joined by this test process as driver."""
    cluster = LocalCluster()
    try:
        cluster.start_head()
        cluster.add_node()
        keep_loopback()  # this driver too dials 127.0.0.1, not the host's external address
        ray.init(address=cluster.address, namespace="plugtune-tests", log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.stop()
    assert not cluster.processes(), "a Ray or plugin process of the test cluster outlived it"
