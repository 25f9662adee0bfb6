"""Instances spread over the cluster's two nodes; losing a node's raylet mid-calls is classified
(EOF naming the instance and node, never a raw Ray traceback) and, retried as a job retries a
failed call, every call ends in success on the node that is left."""

from __future__ import annotations

import asyncio
import ipaddress

import psutil
import pytest

from plugtune.errors import Cause, PluginCallError
from plugtune.runtime.function import Function
from plugtune.runtime.ray import LocalCluster, RayRuntime
from tests.runtime.helpers import ctx, entry, sample, trajectory

pytestmark = pytest.mark.slow

MAX_ATTEMPTS = 3  # the job's default max_attempts


def is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address.removeprefix("::ffff:")).is_loopback


def test_every_node_listens_and_dials_on_127_0_0_1_only(cluster: LocalCluster) -> None:
    import ray

    assert {node["NodeManagerAddress"] for node in ray.nodes()} == {"127.0.0.1"}
    seen = 0
    for proc in cluster.processes():
        try:
            connections = proc.net_connections(kind="inet")
        except psutil.Error:
            continue
        for conn in connections:
            seen += 1
            ends = [conn.laddr.ip] + ([conn.raddr.ip] if conn.raddr else [])
            assert all(is_loopback(ip) for ip in ends), (proc.name(), conn)
    assert seen, "the cluster's processes had no sockets to check"


async def call_with_retries(fn: Function, index: int, seconds: float) -> tuple[float, list[str]]:
    causes: list[str] = []
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            outcome = await fn.invoke(
                ctx(f"traj-{index}-{attempt}"), sample(do="sleep", seconds=seconds), trajectory()
            )
            return outcome.value, causes
        except PluginCallError as exc:
            assert "Traceback" not in exc.message, exc.message
            causes.append(exc.cause)
    return 0.0, causes


async def test_instances_spread_and_a_lost_node_is_eof_then_retried_with_nothing_lost(
    cluster: LocalCluster,
) -> None:
    async with RayRuntime(cluster.address, metrics_period_s=0.5, start_timeout_s=60) as rt:
        fn = await rt.deploy(
            entry("ray_faults.py", "misbehaves"), runtime={"min_instances": 2, "timeout_s": 30}
        )
        nodes = {i.node_id for i in fn.deployment.instances}  # type: ignore[attr-defined]
        assert len(nodes) == 2, "SPREAD placed both instances on one node"

        calls = [asyncio.create_task(call_with_retries(fn, i, 8.0)) for i in range(8)]
        await asyncio.sleep(1.5)  # every call is in flight, four on each instance
        raylet = cluster.raylet_of("node_1")
        assert raylet is not None
        raylet.kill()
        results = await asyncio.wait_for(asyncio.gather(*calls), 120)

        assert [value for value, _ in results] == [1.0] * 8  # nothing lost
        causes = [cause for _, c in results for cause in c]
        assert causes and set(causes) == {Cause.EOF.value}, causes
        lost = [line.message for line in fn.logs() if " lost: " in line.message]
        assert len(lost) == 1 and "Ray node" in lost[0], lost
