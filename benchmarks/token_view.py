"""The console's Tokens view in Chromium: how long after navigation a trajectory's token view is drawn
for replies of 400, 4,000 and 40,000 tokens, against the same page's trajectory detail without it.

    .venv/bin/python benchmarks/token_view.py [--repeat 5]

Prints the median milliseconds from navigation to the drawn detail (baseline) and to the drawn token
view (``#token-view[data-ready]``: fetched, decoded, first block drawn), and their ratio to the
baseline. The view draws one block of 400 tokens up front and the rest as they near the viewport,
so the ratio grows with the reply's JSON, not with its DOM.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from playwright.sync_api import sync_playwright

from plugtune.demo import MODEL_DIR
from plugtune.gateway.serving import ThreadedServer
from plugtune.store import Store
from plugtune.types import TrajectoryRecord
from plugtune.web import create_app

CHROMIUM = "/usr/bin/chromium"
SIZES = (400, 4_000, 40_000)


def record(n: int) -> TrajectoryRecord:
    mask = [1 if (i // 50) % 5 else 0 for i in range(n)]
    return TrajectoryRecord(
        trajectory_id=f"t{n}",
        group_id="g",
        step=1,
        sample_index=0,
        rollout_index=0,
        attempt=1,
        policy_version=0,
        prompt_ids=[1, 2],
        response_ids=[40 + i % 200 for i in range(n)],
        response_mask=mask,
        response_logprobs=[-1.0 if m else 0.0 for m in mask],
        messages=[{"role": "user", "content": "hi"}],
        stop_reason="length",
        trainer_logprobs=[-1.0 - (i % 7) * 0.05 if m else 0.0 for i, m in enumerate(mask)],
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="plugtune-bench-tokens-"))
    store = Store.open(f"sqlite:///{root / 'plugtune.db'}")
    job = store.create_job(
        "bench", {"name": "bench", "model": str(MODEL_DIR), "job_file": str(root / "job.yaml")}
    )
    store.upsert_trajectories(job, [record(n) for n in SIZES])
    server = ThreadedServer("bench-console", "the benchmark's console")
    port = server.start(create_app(store), "127.0.0.1", 0, timeout_s=15)
    base = f"http://127.0.0.1:{port}/jobs/{job}/trajectories?t="
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, args=["--headless", "--no-sandbox"]
            )

            def timed(url: str, ready: str) -> float:
                page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
                page.goto(url)
                page.wait_for_selector(ready, timeout=60_000)
                ms = float(page.evaluate("performance.now()"))
                page.context.close()
                return ms

            for n in SIZES:
                timed(f"{base}t{n}&view=tokens", "#token-view[data-ready]")  # warm: tokenizer, caches
                detail = statistics.median(timed(f"{base}t{n}", "#detail-id") for _ in range(args.repeat))
                view = statistics.median(
                    timed(f"{base}t{n}&view=tokens", "#token-view[data-ready]") for _ in range(args.repeat)
                )
                ratio = view / detail
                print(
                    f"{n:>6} tokens: detail {detail:7.0f} ms, token view {view:7.0f} ms, ratio {ratio:5.2f}"
                )
            browser.close()
    finally:
        server.stop()
        store.close()


if __name__ == "__main__":
    main()
