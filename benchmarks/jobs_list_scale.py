"""Jobs list search and compare view render times: a store of many jobs against one of few, and a
compare of long jobs against one of short jobs (same machine, same run).

    .venv/bin/python benchmarks/jobs_list_scale.py [--jobs 10000] [--steps 2000] [--repeat 5]

Prints the median time of each request on both stores and the ratio big / small. The list is an
OFFSET page with a COUNT of what the search selects: a name search scans the jobs table (no index
serves a substring), so its time grows with the number of jobs; the compare view reads each job's
series bucketed to at most 400 points per chart, its step times in full.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from fastapi.testclient import TestClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from plugtune.store import Store
from plugtune.types import MetricPoint
from plugtune.web import create_app

NAMES = ("adder-grpo", "math-lr-sweep", "tool-use", "summarize", "code-repair")
CURVES = ("reward/mean", "loss", "kl", "response_length", "time/step_s", "plugin/failed_calls/Timeout")


def fill(store: Store, jobs: int, steps: int) -> list[int]:
    """``jobs`` jobs (every 7th failed with a cause), then 5 trained ones of ``steps`` steps: their ids."""
    for i in range(jobs):
        job = store.create_job(
            f"{NAMES[i % len(NAMES)]}-{i:06d}", {"model": "tiny", "hyperparameters": {"lr": i}}
        )
        if i % 7 == 0:
            store.transition(job, "validating")
            store.set_job_error(job, {"type": "Call plugin error", "owner": "plugin", "cause": "Timeout",
                                      "message": "m", "hint": "h"})  # fmt: skip
            store.transition(job, "failed")
    trained = []
    for k in range(5):
        job = store.create_job(
            f"compared-{k}", {"model": "tiny", "hyperparameters": {"lr": k, "steps": steps}}
        )
        points = [
            MetricPoint(1000.0 + s, "", name, (s % 17) / 17 + k, step=s)
            for s in range(1, steps + 1)
            for name in CURVES
        ]
        for start in range(0, len(points), 5_000):
            store.add_metrics(job, points[start : start + 5_000])
        trained.append(job)
    return trained


def median_ms(client: TestClient, path: str, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        answer = client.get(path)
        times.append((time.perf_counter() - began) * 1000)
        if answer.status_code != 200:
            raise SystemExit(f"{path}: {answer.status_code} {answer.text[:200]}")
    return statistics.median(times)


def requests(jobs: int, compared: list[int]) -> dict[str, str]:
    ids = ",".join(str(i) for i in compared)
    deep = max(1, jobs // 50 - 1)
    return {
        "page  jobs list": "/jobs",
        "page  jobs, name search": "/jobs?q=lr-sweep",
        "page  jobs, search no match": "/jobs?q=zzz-no-such-name",
        "page  jobs, status + cause": "/jobs?status=failed&cause=Timeout",
        f"page  jobs, deep page ({deep})": f"/jobs?page={deep}",
        "api   jobs, name search": "/api/jobs?q=lr-sweep&limit=50",
        "api   compare 5 jobs": f"/api/compare?ids={ids}",
        "page  compare 5 jobs": f"/compare?ids={ids}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--jobs", type=int, default=10_000, help="jobs in the big store (the small one has 1%%)"
    )
    parser.add_argument(
        "--steps", type=int, default=2_000, help="steps of each compared job in the big store"
    )
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        results: dict[str, list[float]] = {}
        for label, jobs, steps in (("small", max(50, args.jobs // 100), 20), ("big", args.jobs, args.steps)):
            store = Store.open(f"sqlite:///{Path(folder) / label}.db", retention_days=7)
            began = time.perf_counter()
            compared = fill(store, jobs, steps)
            filled = time.perf_counter() - began
            print(f"{label}: {jobs:,} jobs, 5 compared jobs of {steps:,} steps, filled in {filled:.1f} s")
            client = TestClient(create_app(store), base_url="http://127.0.0.1:8321")
            client.get("/jobs")  # templates compiled, connections opened: not part of any request below
            for name, path in requests(jobs, compared).items():
                key = name.split(" (")[0]
                results.setdefault(key, []).append(median_ms(client, path, args.repeat))
            store.close()
    print(f"\n{'request':36} {'small ms':>9} {'big ms':>9} {'big/small':>9}")
    for name, (small, big) in results.items():
        print(f"{name:36} {small:9.1f} {big:9.1f} {big / small:9.2f}")


if __name__ == "__main__":
    main()
