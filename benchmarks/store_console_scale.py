"""Console queries on a job with 100,000 trajectories and 1,000,000 log lines vs. a small job.

Fills one SQLite store (a temp dir, WAL, the real ``Store`` and its batched ``write_batch``) with
a small job (default 100 trajectories, 1,000 log lines, one hour of a metric) and a large job
(default 100,000 trajectories, 1,000,000 log lines, seven days of a metric at 5 s), then times the
console's typical reads on both: first page, filtered pages, deep pages, counts, a trajectory, a
group and a downsampled chart. Prints the fill rate and a table of median milliseconds with the
large/small ratio (1.0x = the page costs the same however big the job is).

On PostgreSQL the tables are VACUUM ANALYZEd after the fill, as autovacuum would.

Run: ``.venv/bin/python benchmarks/store_console_scale.py [--trajectories N --logs N] [--url
postgresql://postgres@127.0.0.1:5432/test]`` (PostgreSQL: in a throw-away schema, dropped after).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from plugtune.store import Store  # noqa: E402
from plugtune.types import ErrorRecord, LogLine, MetricPoint, TrajectoryRecord  # noqa: E402

PLUGINS = ["solve"] * 7 + ["exact"] * 2 + ["judge"]
LEVELS = ["INFO"] * 90 + ["WARNING"] * 8 + ["ERROR"] * 2
WORDS = "the agent called the calculator tool and parsed its answer before replying to the user".split()
BATCH_TRAJECTORIES = 1000


@dataclass(frozen=True)
class Size:
    name: str
    trajectories: int
    logs: int
    metric_points: int


def trajectory(i: int, rng: random.Random) -> TrajectoryRecord:
    roll = rng.random()
    status = "success" if roll < 0.85 else "failed" if roll < 0.95 else "discard"
    question = " ".join(rng.choices(WORDS, k=30))
    needle = " zebra-needle" if i % 1000 == 7 else ""
    return TrajectoryRecord(
        trajectory_id=f"t{i}",
        group_id=f"g{i // 8}",
        step=i // 256,
        sample_index=i // 8,
        rollout_index=i % 8,
        attempt=1,
        policy_version=i // 256,
        prompt_ids=[rng.randrange(150_000) for _ in range(64)],
        response_ids=[rng.randrange(150_000) for _ in range(128)],
        response_mask=[1] * 128,
        response_logprobs=[-rng.random() for _ in range(128)],
        messages=[
            {"role": "system", "content": "You are a careful assistant that uses tools."},
            {"role": "user", "content": question + needle},
            {"role": "assistant", "content": " ".join(rng.choices(WORDS, k=40))},
        ],
        reward=rng.random() if status == "success" else None,
        reward_components={"exact": 1.0} if status == "success" else {},
        advantage=rng.gauss(0, 1),
        status=status,
        stop_reason="stop",
        errors=[ErrorRecord("Call plugin error", "plugin", "Timeout", "took 60 s", plugin="judge")]
        if status == "failed"
        else [],
        code_hash={"solve": "r1", "exact": "g1"},
    )


def log_line(i: int, size: Size, rng: random.Random) -> LogLine:
    needle = " zebra-needle" if i % 100_000 == 5 else ""
    return LogLine(
        time=1_000_000.0 + i * 0.01,
        level=rng.choice(LEVELS),
        plugin=rng.choice(PLUGINS),
        message=" ".join(rng.choices(WORDS, k=12)) + needle,
        call_id=f"c{i // 3}",
        trajectory_id=f"t{i * size.trajectories // size.logs}",
        instance_id=f"i{i % 8}",
    )


def fill(store: Store, size: Size, seed: int) -> tuple[int, float]:
    rng = random.Random(seed)
    job_id = store.create_job(size.name, {"name": size.name})
    started = time.perf_counter()
    logs_per_batch = max(1, size.logs * BATCH_TRAJECTORIES // max(1, size.trajectories))
    written_logs = 0
    for start in range(0, size.trajectories, BATCH_TRAJECTORIES):
        end = min(size.trajectories, start + BATCH_TRAJECTORIES)
        n_logs = size.logs - written_logs if end == size.trajectories else logs_per_batch
        lines = [log_line(written_logs + k, size, rng) for k in range(n_logs)]
        store.write_batch(job_id, logs=lines, trajectories=[trajectory(i, rng) for i in range(start, end)])
        written_logs += n_logs
    points = [
        MetricPoint(time=1_000_000.0 + 5 * k, plugin="solve", name="latency_ms_p99", value=50 + rng.random())
        for k in range(size.metric_points)
    ]
    for start in range(0, len(points), 20_000):
        store.write_batch(job_id, metrics=points[start : start + 20_000])
    return job_id, time.perf_counter() - started


def queries(store: Store, job_id: int, size: Size) -> dict[str, Callable[[], Any]]:
    logs, trajectories = size.logs, size.trajectories
    mid_log = store.logs(job_id, limit=1)[0].id - logs // 2
    mid_traj = store.trajectories(job_id, limit=1)[0].id - trajectories // 2
    return {
        "logs: first page (100)": lambda: store.logs(job_id, limit=100),
        "logs: plugin=judge": lambda: store.logs(job_id, plugin="judge", limit=100),
        "logs: level=ERROR": lambda: store.logs(job_id, level="ERROR", limit=100),
        "logs: plugin=exact level=ERROR": lambda: store.logs(
            job_id, plugin="exact", level="ERROR", limit=100
        ),
        "logs: trajectory": lambda: store.logs(job_id, trajectory_id=f"t{trajectories // 3}", limit=100),
        "logs: deep page (keyset, middle)": lambda: store.logs(job_id, before_id=mid_log, limit=100),
        "logs: live tail (after newest)": lambda: store.logs(job_id, after_id=mid_log + logs // 2, limit=100),
        "logs: text (rare)": lambda: store.logs(job_id, text="zebra-needle", limit=100),
        "logs: count all": lambda: store.count_logs(job_id),
        "logs: count plugin=judge": lambda: store.count_logs(job_id, plugin="judge"),
        "logs: count, capped at 10,000": lambda: store.count_logs(job_id, cap=10_000),
        "traj: first page (50)": lambda: store.trajectories(job_id, limit=50),
        "traj: status=failed": lambda: store.trajectories(job_id, status="failed", limit=50),
        "traj: step=1": lambda: store.trajectories(job_id, step=1, limit=50),
        "traj: plugin=judge": lambda: store.trajectories(job_id, plugin="judge", limit=50),
        "traj: min_reward=0.99": lambda: store.trajectories(job_id, min_reward=0.99, limit=50),
        "traj: worst first (reward asc)": lambda: store.trajectories(job_id, order="reward_asc", limit=50),
        "traj: text (rare)": lambda: store.trajectories(job_id, text="zebra-needle", limit=50),
        "traj: deep page (offset, last)": lambda: store.trajectories(
            job_id, offset=trajectories - 50, limit=50
        ),
        "traj: deep page (keyset, middle)": lambda: store.trajectories(job_id, before_id=mid_traj, limit=50),
        "traj: count all": lambda: store.count_trajectories(job_id),
        "traj: count, capped at 10,000": lambda: store.count_trajectories(job_id, cap=10_000),
        "traj: count status=failed": lambda: store.count_trajectories(job_id, status="failed"),
        "traj: status counts": lambda: store.trajectory_status_counts(job_id),
        "traj: neighbors (filtered)": lambda: store.trajectory_neighbors(job_id, "t7", status="success"),
        "traj: get one (full)": lambda: store.get_trajectory(job_id, f"t{trajectories // 2}"),
        "traj: group of 8": lambda: store.group(job_id, f"g{trajectories // 16}"),
        "metrics: chart, 500 points": lambda: store.metrics(
            job_id, "solve", ["latency_ms_p99"], max_points=500
        ),
        "metrics: latest values (jobs list)": lambda: store.latest_metrics([job_id]),
    }


def median_ms(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm the page cache the way a second request would
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=100_000)
    parser.add_argument("--logs", type=int, default=1_000_000)
    parser.add_argument("--metric-points", type=int, default=7 * 86_400 // 5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--url", help="a PostgreSQL URL (a throw-away schema is used); default: SQLite in a temp dir"
    )
    args = parser.parse_args()
    small = Size("small", 100, 1_000, 720)
    large = Size("large", args.trajectories, args.logs, args.metric_points)
    with tempfile.TemporaryDirectory() as tmp:
        url = args.url or f"sqlite:///{Path(tmp) / 'plugtune.db'}"
        schema = f"bench_{uuid.uuid4().hex[:10]}" if args.url else None
        store = Store.open(url, schema=schema, retention_days=7)
        try:
            run(store, small, large, args.repeats, Path(tmp), schema)
        finally:
            if schema:
                store.drop_all()
            store.close()


def settle(store: Store, schema: str | None) -> None:
    """PostgreSQL: what autovacuum does to a table after a million inserts (statistics, visibility map)."""
    if store.is_sqlite or schema is None:
        return
    engine = store._db.engine.execution_options(isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        for table in ("jobs", "log_lines", "trajectories", "metric_points", "metric_series", "plugins"):
            conn.exec_driver_sql(f'VACUUM ANALYZE "{schema}".{table}')


def run(store: Store, small: Size, large: Size, repeats: int, tmp: Path, schema: str | None) -> None:
    small_id, _ = fill(store, small, seed=1)
    large_id, fill_s = fill(store, large, seed=2)
    settle(store, schema)
    size = (
        f"; database {sum(p.stat().st_size for p in tmp.iterdir()) / 2**20:,.0f} MiB"
        if store.is_sqlite
        else ""
    )
    print(
        f"{store.url}: filled {large.trajectories:,} trajectories + {large.logs:,} log lines + "
        f"{large.metric_points:,} metric points in {fill_s:.1f} s "
        f"({large.logs / fill_s:,.0f} lines/s with {large.trajectories / fill_s:,.0f} trajectories/s){size}"
    )
    small_q, large_q = queries(store, small_id, small), queries(store, large_id, large)
    print(f"\n{'query':36} {'small ms':>9} {'large ms':>9} {'ratio':>7}")
    for name, fn in small_q.items():
        s_ms = median_ms(fn, repeats)
        l_ms = median_ms(large_q[name], repeats)
        print(f"{name:36} {s_ms:9.2f} {l_ms:9.2f} {l_ms / max(s_ms, 1e-6):6.1f}x")


if __name__ == "__main__":
    main()
