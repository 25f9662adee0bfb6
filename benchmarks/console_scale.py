"""Console page and API render times: a big job (100,000 trajectories, 1,000,000 log lines, 7 days of
plugin metrics) against a small one (100 trajectories, 1,000 log lines, 1 hour), same SQLite store.

    .venv/bin/python benchmarks/console_scale.py [--trajectories 100000] [--logs 1000000] [--repeat 5]

Prints the median time of each request on both jobs and the ratio big / small. Keyset pages
(``before`` cursors) and bucketed metrics keep the ratio near 1; a free-text filter that matches
nothing must scan the job's rows and is the one request expected to grow with the job.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from fastapi.testclient import TestClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from plugtune.store import Store
from plugtune.types import ErrorRecord, LogLine, MetricPoint, TrajectoryRecord
from plugtune.web import create_app

CHUNK = 5_000
PLUGINS = ("solve", "exact")
LEVELS = ("INFO", "INFO", "INFO", "DEBUG", "WARNING", "ERROR")
METRICS = ("exec_qps", "latency_ms_avg", "latency_ms_p99", "error_qps/500", "cpu_percent", "memory_percent",
           "instances", "outbound_mib_s", "concurrency_per_instance")  # fmt: skip


def trajectory(i: int) -> TrajectoryRecord:
    failed = i % 50 == 0
    messages = [
        {"role": "user", "content": f"What is {i} + {i + 1}?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"c{i}",
                    "type": "function",
                    "function": {"name": "calc", "arguments": f'{{"e": "{i}+{i + 1}"}}'},
                }
            ],
        },  # fmt: skip
        {"role": "tool", "tool_call_id": f"c{i}", "content": str(2 * i + 1)},
        {"role": "assistant", "content": f"The answer is {2 * i + 1}."},
    ]
    errors = [ErrorRecord("Call plugin error", "plugin", "500", "boom", plugin="exact")] if failed else []
    return TrajectoryRecord(
        trajectory_id=f"t{i}",
        group_id=f"g{i // 8}",
        step=i // 512,
        sample_index=i // 8,
        rollout_index=i % 8,
        attempt=1,
        policy_version=i // 512,
        prompt_ids=list(range(40)),
        response_ids=list(range(60)),
        response_mask=[1] * 60,
        response_logprobs=[-0.5] * 60,
        messages=messages,
        reward=None if failed else float(i % 2),
        reward_components={} if failed else {"exact": float(i % 2)},
        advantage=None if failed else (i % 2) - 0.5,
        status="failed" if failed else "success",
        errors=errors,
        code_hash={"solve": "h1", "exact": "h2"},
    )


def fill(store: Store, name: str, n_trajectories: int, n_logs: int, metric_span_s: float, now: float) -> int:
    job = store.create_job(name, {"model": "bench"})
    store.transition(job, "running")
    for plugin in PLUGINS:
        store.upsert_plugin(
            job, plugin, "rollout" if plugin == "solve" else "grader", f"{plugin}.py:f", code_hash="h"
        )
        store.set_plugin_status(job, plugin, "running", at=now - metric_span_s)
    for start in range(0, n_trajectories, CHUNK):
        records = [trajectory(i) for i in range(start, min(start + CHUNK, n_trajectories))]
        store.write_batch(job, trajectories=records)
    for start in range(0, n_logs, CHUNK * 4):
        lines = [
            LogLine(
                now - n_logs + i,
                LEVELS[i % len(LEVELS)],
                PLUGINS[i % 2],
                f"line {i} of the {name} job",
                trajectory_id=f"t{(i // 10) % max(n_trajectories, 1)}",
            )  # fmt: skip
            for i in range(start, min(start + CHUNK * 4, n_logs))
        ]
        store.write_batch(job, logs=lines)
    points: list[MetricPoint] = []
    t = now - metric_span_s
    while t <= now:
        points.extend(MetricPoint(t, p, m, 1.0) for p in PLUGINS for m in METRICS)
        t += 60
        if len(points) >= CHUNK * 4:
            store.write_batch(job, metrics=points)
            points = []
    store.write_batch(job, metrics=points)
    return job


def requests(store: Store, job: int) -> dict[str, str]:
    newest_log = store.logs(job, limit=1)[0].id
    newest_traj = store.trajectories(job, limit=1)[0].id
    n_logs = store.count_logs(job)
    n_traj = store.count_trajectories(job)
    deep_log = newest_log - int(n_logs * 0.99)
    deep_traj = newest_traj - int(n_traj * 0.99)
    middle = f"t{n_traj // 2}"
    return {
        "page  jobs list": "/jobs",
        "page  job (banner, attempts)": f"/jobs/{job}",
        "api   training curves": f"/api/jobs/{job}/curves",
        "page  plugin tab (code view)": f"/jobs/{job}/plugins?plugin=exact",
        "api   plugin metrics 1h": f"/api/jobs/{job}/plugins/solve/metrics?range=1h",
        "api   plugin metrics 7d": f"/api/jobs/{job}/plugins/solve/metrics?range=7d",
        "page  logs first page": f"/jobs/{job}/logs",
        "page  logs plugin+level filter": f"/jobs/{job}/logs?plugin=exact&level=ERROR",
        "page  logs one trajectory": f"/jobs/{job}/logs?trajectory=t7",
        "page  logs deep page (99%)": f"/jobs/{job}/logs?before={deep_log}",
        "api   logs first page": f"/api/jobs/{job}/logs",
        "api   logs deep page (99%)": f"/api/jobs/{job}/logs?before={deep_log}",
        "api   logs live tail": f"/api/jobs/{job}/logs?after={newest_log - 5}",
        "api   logs text, common": f"/api/jobs/{job}/logs?q=line",
        "api   logs text, no match": f"/api/jobs/{job}/logs?q=zzz-no-such-text",
        "page  trajectories first page": f"/jobs/{job}/trajectories",
        "page  trajectories failed": f"/jobs/{job}/trajectories?status=failed",
        "page  trajectories deep page": f"/jobs/{job}/trajectories?before={deep_traj}",
        "api   trajectories step filter": f"/api/jobs/{job}/trajectories?step=1",
        "api   trajectories text, no match": f"/api/jobs/{job}/trajectories?q=zzz-no-such-text",
        "api   trajectory detail + logs": f"/api/jobs/{job}/trajectories/{middle}",
        "api   trajectory neighbors": f"/api/jobs/{job}/trajectories/{middle}/neighbors?status=success",
        "page  group view": f"/jobs/{job}/groups/g3",
        "metrics /metrics": "/metrics",
    }


def median_ms(call: Callable[[], object], repeat: int) -> float:
    call()  # warm caches once, as a user's second click would
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        call()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trajectories", type=int, default=100_000)
    parser.add_argument("--logs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    now = time.time()
    with tempfile.TemporaryDirectory() as folder:
        store = Store.open(f"sqlite:///{folder}/bench.db", retention_days=7)
        t0 = time.perf_counter()
        big = fill(store, "big", args.trajectories, args.logs, 7 * 86400, now)
        fill_s = time.perf_counter() - t0
        small = fill(store, "small", 100, 1_000, 3600, now)
        big_size = f"{args.trajectories:,} trajectories + {args.logs:,} log lines + 7 d of metrics"
        print(f"filled: big job {big_size} in {fill_s:.1f} s; small job 100 trajectories + 1,000 lines + 1 h")
        client = TestClient(create_app(store), base_url="http://127.0.0.1")  # a Host it answers to
        rows = []
        big_requests, small_requests = requests(store, big), requests(store, small)
        for name, big_url in big_requests.items():
            small_url = small_requests[name]
            for url in (big_url, small_url):
                status = client.get(url).status_code
                if status != 200:
                    raise SystemExit(f"{url} answered {status}")
            small_ms = median_ms(lambda u=small_url: client.get(u), args.repeat)  # type: ignore[misc]
            big_ms = median_ms(lambda u=big_url: client.get(u), args.repeat)  # type: ignore[misc]
            rows.append((name, small_ms, big_ms))
        store.close()
    print(f"\n{'request':34} {'small ms':>9} {'big ms':>9} {'big/small':>10}")
    for name, small_ms, big_ms in rows:
        print(f"{name:34} {small_ms:9.1f} {big_ms:9.1f} {big_ms / small_ms:9.2f}x")


if __name__ == "__main__":
    main()
