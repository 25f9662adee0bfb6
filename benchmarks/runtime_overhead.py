"""What the function runtime costs per call, against baselines measured in the same run.

Prints one table:
  * round trip (p50, p99) and throughput with 1 and ``--window`` (64) calls in flight of a no-op
    grader through ``LocalRuntime`` (async def and sync def);
  * the same for a raw Unix-socket echo (length-prefixed frames, no decoding: the transport floor);
  * the same for a FastAPI reward server over HTTP with a keep-alive aiohttp client;
  * instance cold start: zygote fork vs fresh spawn;
  * 2,000 concurrent calls of an async plugin that awaits 100 ms.

Every call row is a median over ``--rounds`` interleaved rounds (on a VM a pair of processes lands
either on one vCPU or on two, and a cross-vCPU wake-up costs tens of µs, so a round's p50 is bimodal
for every transport; 5 rounds keep one unlucky placement from deciding).

Run: ``python benchmarks/runtime_overhead.py [--calls N] [--rounds N] [--concurrent-calls N]
[--window N]`` (needs aiohttp, fastapi, uvicorn).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Knobs:
    """How much each row measures (the command line's options)."""

    calls: int = 2000  # sequential calls per row and round (the HTTP row makes a quarter of them)
    rounds: int = 5  # interleaved rounds; every call row is the median over them
    concurrent: int = 6400  # calls per row and round with `window` in flight (HTTP: a quarter)
    window: int = 64  # calls in flight for the throughput column


PLUGINS = """
import asyncio
from plugtune import Runtime, grader

WIDE = Runtime(memory_mb=512, timeout_s=30, max_concurrency=2000, max_instances=1)


@grader(runtime=WIDE)
async def noop_async(ctx, sample, trajectory):
    return 0.0


@grader(runtime=Runtime(memory_mb=512, timeout_s=30, max_concurrency=64, max_instances=1))
def noop_sync(ctx, sample, trajectory):
    return 0.0


@grader(runtime=Runtime(memory_mb=512, timeout_s=30, max_concurrency=1, max_instances=2))
async def hold(ctx, sample, trajectory):
    await asyncio.sleep(sample.extra.get("hold", 0.0))
    return 0.0


@grader(runtime=WIDE)
async def sleep_100ms(ctx, sample, trajectory):
    await asyncio.sleep(0.1)
    return 1.0
"""

ECHO_SERVER = """
import socket, struct, sys
srv = socket.socket(socket.AF_UNIX); srv.bind(sys.argv[1]); srv.listen(1)
print("ready", flush=True)
conn, _ = srv.accept()
buf = b""
while True:
    data = conn.recv(1 << 16)
    if not data:
        break
    buf += data
    out = []
    while len(buf) >= 4:
        n = struct.unpack(">I", buf[:4])[0]
        if len(buf) < 4 + n:
            break
        out.append(buf[: 4 + n]); buf = buf[4 + n :]
    if out:
        conn.sendall(b"".join(out))
"""

ASYNC_ECHO_SERVER = """
import asyncio, sys

class Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport
    def data_received(self, data):
        self.transport.write(data)

async def main():
    server = await asyncio.get_running_loop().create_unix_server(Echo, sys.argv[1])
    print("ready", flush=True)
    async with server:
        await server.serve_forever()

asyncio.run(main())
"""

HTTP_SERVER = """
import sys, uvicorn
from fastapi import FastAPI
app = FastAPI()

@app.post("/reward")
async def reward(body: dict) -> dict:
    return {"reward": 0.0}

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1)))]


# ---- raw echo ------------------------------------------------------------------------------


def bench_echo(tmp: Path, k: Knobs) -> dict[str, float]:
    path = str(tmp / f"echo-{time.monotonic_ns()}.sock")
    proc = subprocess.Popen([sys.executable, "-c", ECHO_SERVER, path], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.readline()
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(path)
    frame = struct.pack(">I", 24) + b"x" * 24
    size = len(frame)

    def read(n: int) -> None:
        got = 0
        while got < n:
            got += len(sock.recv(n - got))

    lat = []
    for _ in range(k.calls):
        t = time.perf_counter()
        sock.sendall(frame)
        read(size)
        lat.append(time.perf_counter() - t)
    seq_s = sum(lat)
    t = time.perf_counter()
    for _ in range(k.concurrent // k.window):
        sock.sendall(frame * k.window)
        read(size * k.window)
    conc_s = time.perf_counter() - t
    sock.close()
    proc.wait(5)
    return {
        "p50": pct(lat, 0.5),
        "p99": pct(lat, 0.99),
        "qps1": k.calls / seq_s,
        "qpsw": k.concurrent / conc_s,
    }


# ---- asyncio echo: what any asyncio design pays before protocol work ------------------------


async def bench_async_echo(tmp: Path, k: Knobs) -> dict[str, float]:
    path = str(tmp / f"aecho-{time.monotonic_ns()}.sock")
    proc = subprocess.Popen([sys.executable, "-c", ASYNC_ECHO_SERVER, path], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.readline()
    loop = asyncio.get_running_loop()
    frame = struct.pack(">I", 24) + b"x" * 24
    waiting: list[tuple[int, asyncio.Future[None]]] = []
    received = [0]

    class Client(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            received[0] += len(data)
            while waiting and received[0] >= waiting[0][0]:
                waiting.pop(0)[1].set_result(None)

    transport, _ = await loop.create_unix_connection(Client, path)
    sent = 0

    async def call(n: int) -> None:
        nonlocal sent
        sent += len(frame) * n
        done = loop.create_future()
        waiting.append((sent, done))
        transport.write(frame * n)
        await done

    for _ in range(200):
        await call(1)
    lat = []
    for _ in range(k.calls):
        t = time.perf_counter()
        await call(1)
        lat.append(time.perf_counter() - t)
    t = time.perf_counter()
    for _ in range(k.concurrent // k.window):
        await call(k.window)
    conc_s = time.perf_counter() - t
    transport.close()
    proc.terminate()
    proc.wait(5)
    return {
        "p50": pct(lat, 0.5),
        "p99": pct(lat, 0.99),
        "qps1": k.calls / sum(lat),
        "qpsw": k.concurrent / conc_s,
    }


# ---- FastAPI over HTTP ---------------------------------------------------------------------


async def bench_http(k: Knobs) -> dict[str, float]:
    import aiohttp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", HTTP_SERVER, str(port)])
    url = f"http://127.0.0.1:{port}/reward"
    body = {"sample": {"messages": [{"role": "user", "content": "6*7?"}]}, "completion": "42"}
    try:
        connector = aiohttp.TCPConnector(limit=k.window)
        async with aiohttp.ClientSession(connector=connector) as session:
            for _ in range(200):
                try:
                    async with session.post(url, json=body) as r:
                        await r.read()
                    break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.05)
            lat = []
            n_seq = k.calls // 4
            for _ in range(n_seq):
                t = time.perf_counter()
                async with session.post(url, json=body) as r:
                    await r.json()
                lat.append(time.perf_counter() - t)
            n_conc = k.concurrent // 4

            async def worker() -> None:
                for _ in range(n_conc // k.window):
                    async with session.post(url, json=body) as r:
                        await r.json()

            t = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(k.window)))
            conc_s = time.perf_counter() - t
    finally:
        proc.terminate()
        proc.wait(5)
    return {"p50": pct(lat, 0.5), "p99": pct(lat, 0.99), "qps1": n_seq / sum(lat), "qpsw": n_conc / conc_s}


# ---- the runtime ---------------------------------------------------------------------------


def write_plugins(tmp: Path) -> Path:
    plugin = tmp / "plugins" / "bench.py"
    plugin.parent.mkdir(exist_ok=True)
    plugin.write_text(textwrap.dedent(PLUGINS))
    return plugin


async def bench_runtime_calls(plugin: Path, k: Knobs) -> dict[str, dict[str, float]]:
    from plugtune.runtime import LocalRuntime
    from plugtune.sdk import Context, Sample, Trajectory

    sample = Sample(messages=[{"role": "user", "content": "6*7?"}], extra={"answer": "42"})
    traj = Trajectory(trajectory_id="t", messages=[{"role": "assistant", "content": "42"}])
    ctx = Context(trajectory_id="t")
    out: dict[str, dict[str, float]] = {}
    async with LocalRuntime(metrics_period_s=5.0) as rt:
        for name in ("noop_async", "noop_sync"):
            fn = await rt.deploy(f"{plugin}:{name}")
            for _ in range(200):
                await fn.invoke(ctx, sample, traj)
            lat = []
            for _ in range(k.calls):
                t = time.perf_counter()
                await fn.invoke(ctx, sample, traj)
                lat.append(time.perf_counter() - t)

            async def worker(fn: object = fn) -> None:
                for _ in range(k.concurrent // k.window):
                    await fn.invoke(ctx, sample, traj)  # type: ignore[attr-defined]

            t = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(k.window)))
            conc_s = time.perf_counter() - t
            out[name] = {
                "p50": pct(lat, 0.5),
                "p99": pct(lat, 0.99),
                "qps1": k.calls / sum(lat),
                "qpsw": k.concurrent / conc_s,
            }
    return out


async def bench_runtime_scaling(plugin: Path) -> dict[str, object]:
    from plugtune.runtime import LocalRuntime
    from plugtune.sdk import Context, Sample, Trajectory

    sample = Sample(messages=[{"role": "user", "content": "6*7?"}], extra={"answer": "42"})
    traj = Trajectory(trajectory_id="t", messages=[{"role": "assistant", "content": "42"}])
    ctx = Context(trajectory_id="t")
    out: dict[str, object] = {}
    async with LocalRuntime(metrics_period_s=5.0) as rt:
        out["limits"] = rt.limits_mechanism
        sleepy = await rt.deploy(f"{plugin}:sleep_100ms")
        await sleepy.invoke(ctx, sample, traj)
        runs = []
        for _ in range(3):
            t = time.perf_counter()
            await asyncio.gather(*(sleepy.invoke(ctx, sample, traj) for _ in range(2000)))
            runs.append(time.perf_counter() - t)
        out["2000x100ms"] = statistics.median(runs)

        fork = await rt.deploy(f"{plugin}:noop_sync")
        out["fork_ms"] = await cold_starts(fork)
        out["spare_ms"] = await scale_up_call(await rt.deploy(f"{plugin}:hold"), spare=True)
    async with LocalRuntime(spare_instances=False) as rt:
        out["on_demand_ms"] = await scale_up_call(await rt.deploy(f"{plugin}:hold"), spare=False)
    async with LocalRuntime(limits="rlimit") as rt:
        out["fork_rlimit_ms"] = await cold_starts(await rt.deploy(f"{plugin}:noop_sync"))
    async with LocalRuntime(use_zygote=False) as rt:
        spawn = await rt.deploy(f"{plugin}:noop_sync")
        out["spawn_ms"] = await cold_starts(spawn)
    return out


async def scale_up_call(fn: object, spare: bool) -> float:
    """Median ms of a no-op call that needs a new instance (the only one is busy)."""
    from plugtune.sdk import Context, Sample, Trajectory

    deployment = fn.deployment  # type: ignore[attr-defined]
    traj = Trajectory(trajectory_id="t", messages=[{"role": "assistant", "content": "42"}])
    busy = Sample(messages=[{"role": "user", "content": "x"}], extra={"hold": 0.3})
    free = Sample(messages=[{"role": "user", "content": "x"}])
    times = []
    for _ in range(10):
        for _ in range(200):
            if not spare or deployment.spare is not None:
                break
            await asyncio.sleep(0.01)
        blocker = asyncio.ensure_future(fn.invoke(Context(), busy, traj))  # type: ignore[attr-defined]
        await asyncio.sleep(0.02)
        t = time.perf_counter()
        await fn.invoke(Context(), free, traj)  # type: ignore[attr-defined]
        times.append((time.perf_counter() - t) * 1000)
        await blocker
        await deployment.scale(1)
        await asyncio.sleep(0.05)
    return statistics.median(times)


async def cold_starts(fn: object) -> float:
    """Median ms from asking for a new instance until it is ready to serve, starts 0.3 s apart."""
    deployment = fn.deployment  # type: ignore[attr-defined]
    times = []
    for _ in range(10):
        t = time.perf_counter()
        instance = await deployment.pool.add_instance()
        times.append((time.perf_counter() - t) * 1000)
        instance.kill("benchmark")
        await asyncio.sleep(0.3)  # isolated starts: back-to-back cgroup attaches would be cheaper
    return statistics.median(times)


def knobs(argv: list[str] | None = None) -> Knobs:
    """The command line's knobs; a bad value exits 2 with usage and the option that is wrong."""
    default = Knobs()
    parser = argparse.ArgumentParser(
        prog="benchmarks/runtime_overhead.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--calls",
        type=int,
        default=default.calls,
        help="sequential calls per row and round (default: %(default)s)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=default.rounds,
        help="interleaved rounds per call row (default: %(default)s)",
    )
    parser.add_argument(
        "--concurrent-calls",
        type=int,
        default=default.concurrent,
        help="calls per row and round with --window in flight (default: %(default)s)",
    )
    parser.add_argument(
        "--window",
        type=int,
        default=default.window,
        help="calls in flight for the throughput column (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    for option, value, least in (
        ("--calls", args.calls, 4),  # the HTTP row makes a quarter of them
        ("--rounds", args.rounds, 1),
        ("--window", args.window, 1),
        ("--concurrent-calls", args.concurrent_calls, 4 * args.window),
    ):
        if value < least:
            why = (
                " (4 × --window: the HTTP row runs a quarter of them)"
                if option == "--concurrent-calls"
                else ""
            )
            parser.error(f"{option} must be at least {least}{why}, got {value}")
    return Knobs(calls=args.calls, rounds=args.rounds, concurrent=args.concurrent_calls, window=args.window)


def main(argv: list[str] | None = None) -> None:
    k = knobs(argv)
    os.environ.setdefault("PYTHONHASHSEED", "0")
    rounds: list[dict[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        plugin = write_plugins(tmp)
        for _ in range(k.rounds):  # interleaved, so a noisy moment hits every row alike
            one = {"echo": bench_echo(tmp, k), "async_echo": asyncio.run(bench_async_echo(tmp, k))}
            one["http"] = asyncio.run(bench_http(k))
            one.update(asyncio.run(bench_runtime_calls(plugin, k)))
            rounds.append(one)
        rt: dict[str, Any] = asyncio.run(bench_runtime_scaling(plugin))
    med = {
        row: {k: statistics.median(r[row][k] for r in rounds) for k in rounds[0][row]} for row in rounds[0]
    }
    echo, async_echo, http = med["echo"], med["async_echo"], med["http"]
    rt.update(noop_async=med["noop_async"], noop_sync=med["noop_sync"])
    rows = [
        ("raw UDS echo (floor, no decoding)", echo),
        ("asyncio UDS echo (both ends asyncio, no decoding)", async_echo),
        ("plugtune runtime, no-op async grader", rt["noop_async"]),
        ("plugtune runtime, no-op sync grader", rt["noop_sync"]),
        ("FastAPI + uvicorn, aiohttp keep-alive", http),
    ]
    print(
        f"limits: {rt['limits']}; {os.cpu_count()} CPUs; Python {sys.version.split()[0]}; "
        f"call rows are medians over {k.rounds} interleaved rounds"
    )
    print()
    print(
        "| transport | p50 µs | p99 µs | calls/s, 1 in flight | "
        f"calls/s, {k.window} in flight | p50 ÷ echo |",
        end="",
    )
    print(f" {k.window} in flight ÷ HTTP |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, m in rows:
        print(
            f"| {name} | {m['p50'] * 1e6:,.0f} | {m['p99'] * 1e6:,.0f} | {m['qps1']:,.0f} "  # type: ignore[index]
            f"| {m['qpsw']:,.0f} | {m['p50'] / echo['p50']:.1f}x "  # type: ignore[index]
            f"| {m['qpsw'] / http['qpsw']:.1f}x |"  # type: ignore[index]
        )
    print()
    print("| instance cold start (median of 10) | ms |")
    print("|---|---:|")
    print(f"| zygote fork -> ready, in its own cgroup-v1 memory+cpu+pids child | {rt['fork_ms']:.1f} |")
    print(f"| zygote fork -> ready, rlimit+watchdog (no cgroup attach) | {rt['fork_rlimit_ms']:.1f} |")
    print(f"| fresh spawn -> ready (cgroup) | {rt['spawn_ms']:.1f} |")
    print(f"| a call that needs a new instance, forked on demand | {rt['on_demand_ms']:.1f} |")
    print(f"| a call that needs a new instance, served by the warm spare | {rt['spare_ms']:.1f} |")
    print()
    print(
        f"2,000 concurrent calls of an async plugin awaiting 100 ms: {rt['2000x100ms']:.3f} s (median of 3)"
    )
    best = min(rt["noop_async"]["p50"], rt["noop_sync"]["p50"])  # type: ignore[index]
    best_w = max(rt["noop_async"]["qpsw"], rt["noop_sync"]["qpsw"])  # type: ignore[index]
    print()
    print("targets:")
    print(f"  p50 round trip <= 5x raw echo: {best / echo['p50']:.1f}x")
    print(f"  >= 5x HTTP throughput at {k.window} in flight: {best_w / http['qpsw']:.1f}x")
    print(
        f"  new instance ready within 10 ms of a zygote fork: {rt['fork_ms']:.1f} ms with cgroups, ", end=""
    )
    print(f"{rt['fork_rlimit_ms']:.1f} ms without; a scale-up call with the spare: {rt['spare_ms']:.1f} ms")
    print(f"  2,000 concurrent 100 ms calls in <= 0.2 s: {rt['2000x100ms']:.3f} s")


if __name__ == "__main__":
    main()
