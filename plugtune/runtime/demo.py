"""A runtime demo: deploy the example plugins, call them, show results, failures and metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from plugtune.errors import PluginCallError
from plugtune.runtime.faults import FaultInjection
from plugtune.runtime.function import Function
from plugtune.runtime.runtime import LocalRuntime
from plugtune.sdk import Context, Policy, Sample, Trajectory

EXAMPLES = Path(__file__).resolve().parent / "examples"
QUESTIONS = [
    ("What is 6 * 7?", 42),
    ("What is 12 + 30?", 42),
    ("What is 100 - 58?", 42),
    ("What is 9 * 9?", 81),
]
# The rollout does not call the model, so the policy endpoint is never reached.
POLICY = Policy(base_url="http://127.0.0.1:9/v1", api_key="demo")


async def run_demo(out: Callable[[str], None]) -> None:
    """Deploy the example rollout and grader on a LocalRuntime and print what happens."""
    async with LocalRuntime(metrics_period_s=0.5) as rt:
        out(f"function runtime up; per-instance limits: {rt.limits_mechanism}")
        roll = await rt.deploy(f"{EXAMPLES / 'rollout.py'}:calculator")
        grade = await rt.deploy(f"{EXAMPLES / 'grader.py'}:exact_match")
        for fn in (roll, grade):
            r = fn.runtime
            out(
                f"deployed {fn.spec.kind.value} {fn.spec.name}: code {fn.code_hash[:12]} "
                f"({', '.join(fn.code())}), memory_mb={r.memory_mb}, timeout_s={r.timeout_s:g}, "
                f"max_concurrency={r.max_concurrency}, instances {r.min_instances}..{r.max_instances}"
            )
        out("")
        out(f"{'question':<20} {'answer':>7} {'reward':>7} {'rollout ms':>11} {'grade ms':>9}")
        rows = await asyncio.gather(
            *(_episode(roll, grade, i, q, a) for i, (q, a) in enumerate(QUESTIONS * 4))
        )
        for row in rows[: len(QUESTIONS)]:
            out(row)
        out(f"... {len(rows)} episodes, all graded")
        out("")
        await _failures(rt, out)
        await asyncio.sleep(0.6)  # one more metrics period
        out("")
        for fn in (roll, grade):
            _metrics(fn, out)


async def _episode(roll: Function, grade: Function, i: int, question: str, answer: int) -> str:
    sample = Sample(messages=[{"role": "user", "content": question}], extra={"answer": answer}, index=i)
    ctx = Context(job_id="demo", sample_id=i, trajectory_id=f"demo-{i}")
    rolled = await roll.invoke(ctx, POLICY, sample)
    trajectory = Trajectory(trajectory_id=ctx.trajectory_id, messages=rolled.value["messages"])
    graded = await grade.invoke(ctx, sample, trajectory)
    return (
        f"{question:<20} {trajectory.completion:>7} {graded.value:>7.1f} "
        f"{rolled.latency_ms:>11.1f} {graded.latency_ms:>9.1f}"
    )


async def _failures(rt: LocalRuntime, out: Callable[[str], None]) -> None:
    """The same grader with injected faults: every failure comes back with exactly one cause."""
    inject = FaultInjection({"500": 0.2, "nan": 0.2, "eof": 0.1}, seed=1)
    faulty = await rt.deploy(f"{EXAMPLES / 'grader.py'}:exact_match", inject=inject)
    sample = Sample(messages=[{"role": "user", "content": "6 * 7"}], extra={"answer": 42})
    trajectory = Trajectory(trajectory_id="demo-f", messages=[{"role": "assistant", "content": "42"}])
    out("the grader again, with faults injected (500 20%, NaN 20%, instance exit 10%):")
    for i in range(10):
        try:
            done = await faulty.invoke(Context(trajectory_id=f"demo-f{i}"), sample, trajectory)
            out(f"  call {i}: {done.status}, reward {done.value}")
        except PluginCallError as exc:
            out(f"  call {i}: {exc.type} / {exc.cause}: {exc.message.splitlines()[0][:90]}")
    await faulty.close()


def _metrics(fn: Function, out: Callable[[str], None]) -> None:
    """A summary of the sampled series: totals, and the busiest window's latency and resources."""
    period = fn.recorder.period_s
    series: dict[str, list[float]] = {}
    for point in fn.metrics():
        series.setdefault(point.name, []).append(point.value)
    calls = sum(series.get("exec_qps", [])) * period
    errors = {
        name.split("/", 1)[1]: round(sum(values) * period)
        for name, values in series.items()
        if name.startswith("error_qps/") and sum(values) > 0
    }
    p50 = max(series.get("latency_ms_p50", [0.0]))
    p99 = max(series.get("latency_ms_p99", [0.0]))
    out(
        f"metrics {fn.spec.name}: {calls:.0f} calls, errors {errors or 'none'}, latency p50 {p50:.1f} ms / "
        f"p99 {p99:.1f} ms (busiest window), peak {max(series.get('instances', [0.0])):.0f} instances, "
        f"peak CPU {max(series.get('cpu_percent', [0.0])):.0f}% of quota, "
        f"peak memory {max(series.get('memory_percent', [0.0])):.1f}% of limit"
    )
