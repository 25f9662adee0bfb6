"""The Ray backend against a bare Ray actor and the local backend, measured in the same run.

Starts a two-node Ray cluster on this machine (one CPU each, as the tests do) and prints:
  * a no-op call's p50/p99 and throughput with 64 calls in flight: a bare async Ray actor
    (the floor), the ray backend (a no-op async grader) and the local backend (same grader);
    the bare actor's and the ray backend's latencies are taken in alternating rounds (same load);
  * 2,000 concurrent calls of an async plugin that awaits 100 ms, through the ray backend;
  * time to a new instance (actor placed, snapshot unpacked, worker forked and ready).

Run: ``python benchmarks/ray_backend.py`` (needs the ray extra: pip install -e '.[ray]').
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

N_SEQ = 1000
ROUNDS = 5
N_CONC = 2000
WINDOW = 64

PLUGINS = """
import asyncio
from plugtune import Runtime, grader

@grader(runtime=Runtime(memory_mb=512, timeout_s=30, cpu=0.2, max_concurrency=1000, max_instances=2))
async def noop(ctx, sample, trajectory):
    return 0.0

@grader(runtime=Runtime(memory_mb=512, timeout_s=30, cpu=0.2, max_concurrency=1000,
                        min_instances=2, max_instances=2))
async def sleep_100ms(ctx, sample, trajectory):
    await asyncio.sleep(0.1)
    return 1.0
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1)))]


async def sequential(call: Callable[[], Awaitable[Any]], n: int = N_SEQ) -> list[float]:
    """The latency of ``n`` calls one after another (ms), after a warm-up."""
    for _ in range(20):
        await call()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        await call()
        times.append((time.perf_counter() - t) * 1000)
    return times


async def interleaved(
    a: Callable[[], Awaitable[Any]], b: Callable[[], Awaitable[Any]], rounds: int = ROUNDS
) -> tuple[list[float], list[float]]:
    """Sequential latencies of ``a`` and ``b`` in alternating rounds, so both see the same load."""
    times_a: list[float] = []
    times_b: list[float] = []
    for _ in range(rounds):
        times_a += await sequential(a, N_SEQ // rounds)
        times_b += await sequential(b, N_SEQ // rounds)
    return times_a, times_b


async def throughput(call: Callable[[], Awaitable[Any]], total: int = 3000) -> float:
    left = total

    async def lane() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await call()

    t = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(WINDOW)))
    return total / (time.perf_counter() - t)


def bare_actor_class(ray: Any) -> Any:
    @ray.remote(num_cpus=0.2, max_concurrency=1000)
    class Bare:
        async def noop(self, payload: Any) -> float:
            return 0.0

    return Bare


async def run(address: str, folder: Path) -> list[tuple[str, str]]:
    import ray

    from plugtune.runtime import LocalRuntime
    from plugtune.runtime.ray import RayRuntime
    from tests.runtime.helpers import ctx, sample, trajectory

    rows: list[tuple[str, str]] = []
    plugin = f"{folder / 'plugins.py'}"
    bare = bare_actor_class(ray).remote()
    await bare.noop.remote(None)
    payload = (ctx(), sample(), trajectory())  # the same arguments the plugin gets

    def bare_call() -> Awaitable[Any]:
        return bare.noop.remote(payload)  # type: ignore[no-any-return]

    async with RayRuntime(address, metrics_period_s=5) as rt:
        fn = await rt.deploy(f"{plugin}:noop")

        def ray_call() -> Awaitable[Any]:
            return fn.invoke(ctx(), sample(), trajectory())

        bare_times, ray_times = await interleaved(bare_call, ray_call)
        bare_p50, bare_p99 = pct(bare_times, 0.5), pct(bare_times, 0.99)
        p50, p99 = pct(ray_times, 0.5), pct(ray_times, 0.99)
        bare_qps = await throughput(bare_call)
        qps = await throughput(ray_call)
        rows.append(
            ("bare Ray actor, no-op", f"p50 {bare_p50:.2f} ms  p99 {bare_p99:.2f} ms  {bare_qps:.0f}/s @64")
        )
        rows.append(
            (
                "ray backend, no-op",
                f"p50 {p50:.2f} ms  p99 {p99:.2f} ms  {qps:.0f}/s @64  "
                f"(p50 {p50 / bare_p50:.2f}x bare, throughput {qps / bare_qps:.2f}x bare)",
            )
        )
        t = time.perf_counter()
        slow = await rt.deploy(f"{plugin}:sleep_100ms")
        deploy_s = time.perf_counter() - t
        for _ in range(3):
            await asyncio.gather(*(slow.invoke(ctx(), sample(), trajectory()) for _ in range(200)))
        t = time.perf_counter()
        await asyncio.gather(*(slow.invoke(ctx(), sample(), trajectory()) for _ in range(N_CONC)))
        rows.append(
            (f"ray backend, {N_CONC} × async 100 ms", f"{time.perf_counter() - t:.2f} s (target ≤ 1 s)")
        )
        starts = slow.deployment.cold_starts_ms  # type: ignore[attr-defined]
        rows.append(
            (
                "ray backend, time to a new instance",
                f"{statistics.median(starts):.0f} ms median of {len(starts)} "
                f"(deploy with import: {deploy_s:.1f} s)",
            )
        )

    async with LocalRuntime(metrics_period_s=5) as rt:
        fn = await rt.deploy(f"{plugin}:noop")

        def local_call() -> Awaitable[Any]:
            return fn.invoke(ctx(), sample(), trajectory())

        local_times = await sequential(local_call)
        p50, p99 = pct(local_times, 0.5), pct(local_times, 0.99)
        qps = await throughput(local_call)
        rows.append(("local backend, no-op", f"p50 {p50:.2f} ms  p99 {p99:.2f} ms  {qps:.0f}/s @64"))
    return rows


def main() -> None:
    import ray

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from plugtune.runtime.ray import LocalCluster
    from plugtune.runtime.ray.loopback import keep_loopback

    folder = Path(tempfile.mkdtemp(prefix="ptbench-"))
    (folder / "plugins.py").write_text(textwrap.dedent(PLUGINS))
    cluster = LocalCluster()
    try:
        cluster.start_head()
        cluster.add_node()
        keep_loopback()
        ray.init(address=cluster.address, log_to_driver=False, namespace="plugtune-bench")
        rows = asyncio.run(run(cluster.address, folder))
    finally:
        ray.shutdown()
        cluster.stop()
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


if __name__ == "__main__":
    main()
