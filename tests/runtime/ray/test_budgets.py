"""A declared dependency's budget holds across Ray actors: one keeper actor grants every slot, so
two instances on two nodes together keep ``concurrency: 1`` (each with a budget of its own, they
made 2 requests at once); and their meters reach the function's ``dependency/<name>/...`` series
(a Ray function had none: the Plugin tab's dependency panel stayed empty)."""

from __future__ import annotations

import asyncio

import pytest

from plugtune.runtime.ray import LocalCluster, RayRuntime
from tests.judge_server import judge
from tests.runtime.helpers import ctx, entry, sample, trajectory

pytestmark = pytest.mark.slow


async def test_two_actors_on_two_nodes_share_the_dependency_s_concurrency(cluster: LocalCluster) -> None:
    with judge() as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/wait/0.3"
        async with RayRuntime(cluster.address, start_timeout_s=60) as rt:
            fn = await rt.deploy(
                entry("judge.py", "asks_judge_urllib"),
                dependencies={"judge": {"url": url, "concurrency": 1}},
                runtime={"min_instances": 2, "max_instances": 2, "cpu": 0.5},
            )
            nodes = {i.node_id for i in fn.deployment.instances}  # type: ignore[attr-defined]
            assert len(nodes) == 2, "SPREAD placed both instances on one node"
            calls = [fn.invoke(ctx(f"traj-{i}"), sample(url=url), trajectory()) for i in range(4)]
            outcomes = await asyncio.wait_for(asyncio.gather(*calls), 60)
            assert [o.value for o in outcomes] == [0.75] * 4
            answered = {o.instance_id.split("-")[0] for o in outcomes}
            await asyncio.sleep(1.5)  # the actors' next reports carry their meters to the driver
            fn.flush_metrics()
            points = [p for p in fn.metrics() if p.name.startswith("dependency/judge/")]
        assert len(answered) == 2, answered  # both actors called the judge ...
        assert server.requests == 4 and server.peak == 1, (server.requests, server.peak)  # type: ignore[attr-defined]
    # ... and the Plugin tab's dependency series count both actors' requests, as one function's
    assert sum(p.value for p in points if p.name == "dependency/judge/requests") == 4, points
    assert max(p.value for p in points if p.name == "dependency/judge/latency_p50_ms") >= 300, points
    assert {p.name for p in points} >= {"dependency/judge/limit", "dependency/judge/errors/rate limited"}
