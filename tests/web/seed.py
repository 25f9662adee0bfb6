"""A store filled through its own API with what the console must show (used by tests and screenshots).

Job "failed": a plugin-owned ``Call plugin error`` (grader raised), two plugins with code, metrics
and logs, six trajectories in two groups, one failed trajectory whose messages carry injected
HTML. Job "platform": an internal error with an automatic retry pending. Job "running": live logs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from plugtune.errors import HINTS, Cause, ErrorType
from plugtune.store import Store
from plugtune.types import ErrorRecord, LogLine, MetricPoint, TrajectoryRecord

XSS_SCRIPT = "<script>alert(1)</script>"
XSS_IMG = "<img src=x onerror=alert(1)>"

ROLLOUT_CODE = b'''"""Adds two numbers with a calculator tool."""
from plugtune import rollout, Runtime


@rollout(runtime=Runtime(memory_mb=512, timeout_s=60, max_concurrency=4))
async def solve(ctx, policy, sample):
    client = policy.async_openai()
    reply = await client.chat.completions.create(model=policy.model, messages=sample.messages)
    ctx.logger.info("answer: %s", reply.choices[0].message.content)  # <b>not bold</b>
    return None
'''

GRADER_CODE = b'''"""Exact match against the expected sum."""
from plugtune import grader


@grader(weight=1.0)
def exact(ctx, sample, trajectory):
    expected = sample.extra["answer"]
    ratio = len(trajectory.text) / (len(expected) - len(expected))
    return float(trajectory.text.strip() == expected) * ratio
'''

GRADER_TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/work/project/plugins/grader.py", line 8, in exact\n'
    "    ratio = len(trajectory.text) / (len(expected) - len(expected))\n"
    "ZeroDivisionError: division by zero"
)


@dataclass(frozen=True)
class Seeded:
    failed_job: int
    platform_job: int
    running_job: int
    done_job: int
    failed_trajectory: str
    now: float


def seed(store: Store, now: float | None = None) -> Seeded:
    now = time.time() if now is None else now
    failed = _failed_job(store, now)
    platform = _platform_job(store, now)
    running = _running_job(store, now)
    done = store.create_job("small-ok", {"model": "tiny"})
    for status in ("validating", "running", "succeeded"):
        store.transition(done, status)
    return Seeded(failed, platform, running, done, "s2-g1-r2", now)


def _failed_job(store: Store, now: float) -> int:
    job = store.create_job("adder-grpo", {"model": "tiny-adder", "steps": 10})
    store.transition(job, "validating")
    store.transition(job, "running")
    attempt = store.start_attempt(job, pid=4242)
    store.put_code("h-rollout-1", {"plugins/rollout.py": ROLLOUT_CODE})
    store.put_code("h-grader-1", {"plugins/grader.py": GRADER_CODE})
    store.upsert_plugin(job, "solve", "rollout", "plugins/rollout.py:solve", code_hash="h-rollout-1")
    store.upsert_plugin(job, "exact", "grader", "plugins/grader.py:exact", code_hash="h-grader-1")
    for name in ("solve", "exact"):
        store.set_plugin_status(job, name, "running", at=now - 3 * 3600)
    store.set_plugin_status(job, "solve", "completed", at=now - 300)
    # As the jobs layer records it: str(PluginCallError); the traceback is in the job error's evidence.
    reason = "500 [plugins/grader.py:exact]: grader exact raised ZeroDivisionError: division by zero"
    store.set_plugin_status(job, "exact", "failed", failure_reason=reason, at=now - 300)
    store.write_batch(job, metrics=_plugin_metrics(now) + _training_metrics(now), logs=_logs(now))
    store.upsert_trajectories(job, _trajectories())
    store.update_job(job, steps_done=3, steps_total=10)
    error = {
        "type": ErrorType.CALL_PLUGIN.value,
        "owner": "plugin",
        "cause": Cause.ERROR_500.value,
        "message": "grader exact raised ZeroDivisionError: division by zero",
        "hint": HINTS[Cause.ERROR_500],
        "plugin": "plugins/grader.py:exact",  # the runtime names a plugin by its entry
        "trajectory_id": "s2-g1-r2",
        "traceback": GRADER_TRACEBACK,
    }
    store.end_attempt(job, attempt, "failed", ErrorRecord.from_dict(error))
    store.set_job_error(job, ErrorRecord.from_dict(error), attempt=attempt)
    store.transition(job, "failed", "grader exact failed 3 times")
    return job


def _platform_job(store: Store, now: float) -> int:
    job = store.create_job("platform-hiccup", {"model": "tiny"})
    store.transition(job, "running")
    attempt = store.start_attempt(job, pid=1)
    error = {
        "type": ErrorType.INTERNAL.value,
        "owner": "platform",
        "cause": "attempt process died",
        "message": "the job's attempt process was killed by a signal (exit code -9)",
        "hint": HINTS[ErrorType.INTERNAL],
    }
    store.end_attempt(job, attempt, "failed", ErrorRecord.from_dict(error))
    store.set_job_error(job, ErrorRecord.from_dict(error), attempt=attempt)
    store.update_job(job, next_retry_at=now + 900, auto_retries=0)
    store.transition(job, "failed", "attempt died")
    return job


def _running_job(store: Store, now: float) -> int:
    job = store.create_job("live", {"model": "tiny"})
    store.transition(job, "running")
    store.upsert_plugin(job, "solve", "rollout", "plugins/rollout.py:solve", code_hash="h-rollout-1")
    store.set_plugin_status(job, "solve", "running", at=now - 60)
    store.add_logs(job, [LogLine(now - 30 + i, "INFO", "solve", f"live line {i}") for i in range(3)])
    store.add_metrics(job, [MetricPoint(now - 60 + i * 10, "solve", "exec_qps", 2.0 + i) for i in range(6)])
    store.add_metrics(job, [MetricPoint(now - 20, "", "reward/mean", 0.5, step=1)])
    return job


def _plugin_metrics(now: float) -> list[MetricPoint]:
    points = []
    start, stop = now - 3 * 3600, now - 300
    t = start
    i = 0
    while t <= stop:
        wave = (i % 30) / 30
        for plugin, scale in (("solve", 1.0), ("exact", 0.5)):
            values = {
                "exec_qps": 4.0 * scale + wave,
                "latency_ms_avg": 120 * scale + 40 * wave,
                "latency_ms_p50": 100 * scale + 30 * wave,
                "latency_ms_p99": 400 * scale + 200 * wave,
                "error_qps/500": 0.0 if plugin == "solve" else 0.2 * wave,
                "error_qps/Timeout": 0.05 * wave,
                "cpu_percent": 30 + 20 * wave,
                "memory_percent": 40 + 10 * wave,
                "instances": 2 + (i // 60) % 3,
                "outbound_mib_s": 0.3 + 0.1 * wave,
                "concurrency_per_instance": 1 + 2 * wave,
            }
            points.extend(MetricPoint(t, plugin, name, value) for name, value in values.items())
        t += 60
        i += 1
    return points


def _training_metrics(now: float) -> list[MetricPoint]:
    points = []
    for step in range(1, 4):
        t = now - 3600 + step * 600
        values = {
            "reward/mean": 0.2 * step,
            "reward/exact": 0.25 * step,
            "loss": 1.0 / step,
            "kl": 0.01 * step,
            "response_length": 20 + step,
            "plugin/errors/500": float(step - 1),
            "plugin/failed_calls/500": float(2 * step - 1),  # as the attempt writes it: retried calls too
            "trajectories/total": 16.0,
            "trajectories/failed": float(step - 1),
            "time/step_s": 4.0 - step,
        }
        points.extend(MetricPoint(t, "", name, value, step=step) for name, value in values.items())
    return points


def _logs(now: float) -> list[LogLine]:
    lines = []
    for i, tid in enumerate(TRAJECTORY_IDS):
        lines.append(
            LogLine(now - 2000 + i * 10, "INFO", "solve", f"answer for {tid}: 42", trajectory_id=tid)
        )
        lines.append(LogLine(now - 1999 + i * 10, "DEBUG", "exact", f"grading {tid}", trajectory_id=tid))
    lines.append(
        LogLine(
            now - 1000,
            "ERROR",
            "exact",
            f"grader crashed {XSS_IMG}",
            trajectory_id="s2-g1-r2",
            source="stderr",
        )
    )
    lines.append(LogLine(now - 999, "WARNING", "solve", "slow tool call: 2.1 s", trajectory_id="s2-g1-r2"))
    return lines


TRAJECTORY_IDS = ["s1-g0-r0", "s1-g0-r1", "s1-g0-r2", "s2-g1-r0", "s2-g1-r1", "s2-g1-r2"]


DISCARD_REASON = "solve discarded it (Status.DISCARD): the calculator tool was down"


def _trajectories() -> list[TrajectoryRecord]:
    out = []
    for tid in TRAJECTORY_IDS:
        step, group, rollout = (int(part[1:]) for part in tid.split("-"))
        failed = tid == "s2-g1-r2"
        discard = tid == "s2-g1-r1"
        messages = [
            {"role": "system", "content": "You add numbers. Use the calculator tool."},
            {"role": "user", "content": "What is 19 + 23?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call-{tid}",
                        "type": "function",
                        "function": {"name": "calculator", "arguments": '{"expression": "19 + 23"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"call-{tid}", "name": "calculator", "content": "42"},
            {"role": "assistant", "content": f"{XSS_SCRIPT} {XSS_IMG} The answer is 42." if failed else "42"},
        ]
        errors = []
        if failed:
            errors.append(
                ErrorRecord(
                    type=ErrorType.CALL_PLUGIN.value,
                    owner="plugin",
                    cause=Cause.ERROR_500.value,
                    message=f"ZeroDivisionError: division by zero {XSS_SCRIPT}",
                    plugin="exact",
                    trajectory_id=tid,
                    attempt=3,
                    traceback=GRADER_TRACEBACK,
                )
            )
        reward = None if failed or discard else (1.0 if rollout != 1 else 0.0)
        out.append(
            TrajectoryRecord(
                trajectory_id=tid,
                group_id=f"g{group}",
                step=step,
                sample_index=group,
                rollout_index=rollout,
                attempt=3 if failed else 1,
                policy_version=step,
                prompt_ids=[1, 2, 3],
                response_ids=[4, 5],
                response_mask=[1, 1],
                response_logprobs=[-0.1, -0.2],
                messages=messages,
                reward=reward,
                reward_components={} if reward is None else {"exact": reward},
                advantage=None if reward is None else reward - 0.5,
                status="failed" if failed else ("discard" if discard else "success"),
                errors=errors,
                code_hash={"solve": "h-rollout-1", "exact": "h-grader-1"},
                discard_reason=DISCARD_REASON if discard else "",
            )
        )
    return out
