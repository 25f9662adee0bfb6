"""A rate-limited LLM judge: a declared ``rpm`` budget against a plain ``asyncio.gather`` over the
openai client with its own retries, measured side by side in the same run.

The judge (an OpenAI-compatible ``/chat/completions`` on 127.0.0.1) accepts at most R requests in
any 60 s and answers 429 above that, with ``Retry-After`` = the seconds until a slot frees (as a
careful server does; each accepted request takes 50 ms). Each side has its own judge and makes N
grader-like calls at once (N = 4 R by default: a step's worth of judge calls larger than a minute
of budget):

- **plugtune**: a real grader (a fresh ``openai.OpenAI`` per call, as the README's dependency
  section shows, no client retries) deployed on ``LocalRuntime`` under ``network: policy-only``
  with ``dependencies: {judge: {url, rpm: R}}``, each call made through the job's ``PolicyCaller``
  (``failure_policy`` defaults): the bridge holds connections over the budget until the window
  frees a slot, so the judge never has to refuse one.
- **baseline**: ``asyncio.gather`` of N ``AsyncOpenAI.chat.completions.create`` calls with the
  client's default retries (2, honouring ``Retry-After``).

Printed per side: calls that succeeded and failed (after all retries), 429s the judge sent, the
sustained rate (successes per minute of the judge's capacity used: successes / the number of 60 s
windows the run spanned) as a share of R, and the wall time. Both sides run at once, so the run
takes about (N/R - 1) minutes.

Run: ``python benchmarks/judge_budget.py [--rpm R] [--calls N]``
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import openai

from plugtune.errors import PluginCallError
from plugtune.jobs.caller import PolicyCaller
from plugtune.runtime import LocalRuntime
from plugtune.sdk import Context, Sample, Trajectory
from plugtune.spec.models import FailurePolicy

WINDOW_S = 60.0
SERVICE_S = 0.05
GRADER = textwrap.dedent(
    """
    import openai
    from plugtune import grader

    @grader
    def judged(ctx, sample, trajectory):
        client = openai.OpenAI(base_url=sample.extra["url"], api_key="k", max_retries=0, timeout=600)
        with client:
            reply = client.chat.completions.create(model="judge", messages=trajectory.messages)
        return float(reply.choices[0].message.content)
    """
)
REPLY = json.dumps(
    {
        "id": "c1",
        "object": "chat.completion",
        "created": 0,
        "model": "judge",
        "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "0.75"}}
        ],
    }
).encode()


@dataclass
class Limiter:
    """At most ``rpm`` accepted requests in any 60 s (a sliding window)."""

    rpm: int
    accepted: collections.deque[float] = field(default_factory=collections.deque)
    refused: int = 0
    dropped: int = 0  # accepted, but the client had gone before the reply
    lock: threading.Lock = field(default_factory=threading.Lock)

    def admit(self) -> float | None:
        """None when the request is accepted, else the seconds until a slot frees."""
        with self.lock:
            now = time.monotonic()
            while self.accepted and self.accepted[0] <= now - WINDOW_S:
                self.accepted.popleft()
            if len(self.accepted) < self.rpm:
                self.accepted.append(now)
                return None
            self.refused += 1
            return self.accepted[0] + WINDOW_S - now


class _Judge(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # http.server's name
        self.rfile.read(min(int(self.headers.get("Content-Length") or 0), 1 << 20))
        limiter: Limiter = self.server.limiter  # type: ignore[attr-defined]
        wait = limiter.admit()
        if wait is None:
            time.sleep(SERVICE_S)
            try:
                self._send(200, REPLY, {})
            except OSError:
                with limiter.lock:
                    limiter.dropped += 1
        else:
            body = b'{"error": {"message": "rate limit reached", "type": "requests"}}'
            try:
                self._send(429, body, {"Retry-After": str(max(1, math.ceil(wait)))})
            except OSError:
                pass

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # http.server's name: the counts, for the benchmark
        limiter: Limiter = self.server.limiter  # type: ignore[attr-defined]
        with limiter.lock:
            counts = {"refused": limiter.refused, "dropped": limiter.dropped}
        self._send(200, json.dumps(counts).encode(), {})

    def log_message(self, *args: Any) -> None:
        pass


def serve_judge(rpm: int) -> None:
    """The judge process: prints its port, answers until killed; GET /stats gives its counts."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Judge)
    server.daemon_threads = True
    server.limiter = Limiter(rpm)  # type: ignore[attr-defined]
    print(server.server_address[1], flush=True)
    server.serve_forever()


@contextmanager
def judge(rpm: int) -> Iterator[tuple[str, Callable[[], dict[str, int]]]]:
    """A judge in a process of its own (in this one its threads would wait for the event loop's
    GIL, and a request's arrival time would lag behind the connection the bridge let open)."""
    process = subprocess.Popen(
        [sys.executable, __file__, "--serve-judge", str(rpm)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        base = f"http://127.0.0.1:{int(process.stdout.readline())}"

        def stats() -> dict[str, int]:
            with urllib.request.urlopen(f"{base}/stats", timeout=10) as reply:
                counts: dict[str, int] = json.loads(reply.read())
            return counts

        yield f"{base}/v1", stats
    finally:
        process.kill()
        process.wait(10)


@dataclass
class Result:
    name: str
    succeeded: int = 0
    failed: int = 0
    refused: int = 0
    dropped: int = 0
    wall_s: float = 0.0
    last_success_s: float = 0.0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)

    def sustained_share(self, rpm: int) -> float:
        """Successes per minute of the judge's capacity the run spanned, as a share of ``rpm``."""
        windows = max(1, math.ceil(self.last_success_s / WINDOW_S - 1e-9))
        return self.succeeded / windows / rpm


async def plugtune_side(rpm: int, calls: int, folder: Path) -> Result:
    plugin = folder / "judged.py"
    plugin.write_text(GRADER)
    result = Result("plugtune (declared rpm, PolicyCaller)")
    with judge(rpm) as (url, stats):
        async with LocalRuntime() as rt:
            fn = await rt.deploy(
                f"{plugin}:judged",
                runtime={"max_concurrency": 64, "max_instances": 2, "timeout_s": 900},
                dependencies={"judge": {"url": url, "rpm": rpm}},
            )
            caller = PolicyCaller(FailurePolicy())
            sample = Sample(messages=[{"role": "user", "content": "6*7?"}], extra={"url": url})
            started = time.monotonic()

            async def one(i: int) -> None:
                traj = Trajectory(trajectory_id=f"t{i}", messages=[{"role": "assistant", "content": "42"}])
                try:
                    outcome = await caller(fn, Context(job_id="bench", trajectory_id=f"t{i}"), sample, traj)
                except PluginCallError as exc:  # the policy gave up on it (JobStop wraps one too)
                    result.failed += 1
                    result.errors[f"{exc.type}: {exc.cause}"] += 1
                    return
                except Exception as exc:  # noqa: BLE001 - counted and named, the run goes on
                    result.failed += 1
                    result.errors[type(exc).__name__] += 1
                    return
                if outcome.status != "success" or outcome.value != 0.75:
                    result.failed += 1
                    result.errors[f"{outcome.status}: {outcome.value!r}"] += 1
                    return
                result.succeeded += 1
                result.last_success_s = time.monotonic() - started

            await asyncio.gather(*(one(i) for i in range(calls)))
            result.wall_s = time.monotonic() - started
        counts = stats()
        result.refused, result.dropped = counts["refused"], counts["dropped"]
    return result


async def baseline_side(rpm: int, calls: int) -> Result:
    result = Result("asyncio.gather + openai (max_retries=2)")
    with judge(rpm) as (url, stats):
        client = openai.AsyncOpenAI(base_url=url, api_key="k", timeout=600)
        started = time.monotonic()

        async def one() -> None:
            try:
                reply = await client.chat.completions.create(
                    model="judge", messages=[{"role": "user", "content": "score?"}]
                )
            except openai.APIError as exc:
                result.failed += 1
                result.errors[type(exc).__name__] += 1
                return
            if reply.choices[0].message.content == "0.75":
                result.succeeded += 1
                result.last_success_s = time.monotonic() - started

        await asyncio.gather(*(one() for _ in range(calls)))
        result.wall_s = time.monotonic() - started
        await client.close()
        counts = stats()
        result.refused, result.dropped = counts["refused"], counts["dropped"]
    return result


async def main(rpm: int, calls: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ours, theirs = await asyncio.gather(plugtune_side(rpm, calls, Path(tmp)), baseline_side(rpm, calls))
    print(f"\njudge: 429 above {rpm} requests in any 60 s; {calls} calls at once per side\n")
    print(
        "| side | succeeded | failed after retries | 429s sent | replies unread | sustained (x R) | wall s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in (ours, theirs):
        failed = f"{r.failed} ({r.failed / calls:.1%})"
        print(
            f"| {r.name} | {r.succeeded} | {failed} | {r.refused} | {r.dropped} | "
            f"{r.sustained_share(rpm):.2f} | {r.wall_s:.0f} |"
        )
    for r in (ours, theirs):
        if r.errors:
            print(f"\n{r.name} failures: {dict(r.errors)}")
    target = ours.sustained_share(rpm) >= 0.9 and ours.failed <= 0.01 * calls
    print(f"\nplugtune sustains >= 0.9 R with <= 1% failed: {'yes' if target else 'NO'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rpm", type=int, default=60, help="the judge's limit R (requests per minute)")
    parser.add_argument("--calls", type=int, default=0, help="calls per side (default 4 R)")
    parser.add_argument("--serve-judge", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_judge:
        serve_judge(args.serve_judge)
        sys.exit(0)
    asyncio.run(main(args.rpm, args.calls or 4 * args.rpm))
