"""The report's numbers as pure functions: percentiles, errors by cause, the trainer-demand verdict."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from plugtune.pretest.calls import CallError, CallRecord
from plugtune.pretest.command import local_test
from plugtune.pretest.faas import Injection
from plugtune.pretest.summary import demand, errors_by_cause, percentile
from plugtune.pretest.trial import FunctionSnapshot
from plugtune.sdk import Runtime
from tests.pretest.helpers import FAULTY, options

ROLLOUT = "plugins/rollout.py:solve"


def call(started: float, latency_ms: float, service_ms: float, cause: str = "") -> CallRecord:
    error = (
        CallError("Call plugin error", "plugin", cause, f"{cause} happened", "hint", "tb") if cause else None
    )
    return CallRecord(
        plugin=ROLLOUT,
        name="solve",
        kind="rollout",
        sample_index=0,
        trajectory_id="t",
        ok=not cause,
        latency_ms=latency_ms,
        service_ms=0.0 if cause else service_ms,
        status="error" if cause else "success",
        error=error,
        started=started,
    )


def rollout(max_concurrency: int, max_instances: int) -> FunctionSnapshot:
    runtime = Runtime(max_concurrency=max_concurrency, max_instances=max_instances)
    return FunctionSnapshot(ROLLOUT, "solve", "rollout", runtime, "hash")


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 0.5), percentile(values, 0.95), percentile(values, 0.99)) == (50, 95, 99)
    assert percentile([], 0.5) == 0.0


def test_errors_by_cause_counts_and_keeps_the_first() -> None:
    calls = [call(2.0, 5, 5, "Timeout"), call(1.0, 5, 5, "Timeout"), call(3.0, 5, 5, "500")]
    out = errors_by_cause(calls)
    assert out["Timeout"]["count"] == 2 and out["500"]["count"] == 1
    assert out["Timeout"]["message"] == "Timeout happened"


def test_parallel_rollouts_keep_up() -> None:
    calls = [call(0.0, 800, 790) for _ in range(16)]  # all 16 at once, no waiting
    verdict = demand(4, 4, rollout(8, 4), calls, 0.8, 16)
    assert verdict["keeps_up"] and verdict["suggestion"] == ""


def test_queued_rollouts_do_not_keep_up_and_get_a_suggestion() -> None:
    # capacity 4: 16 rollouts of 0.8 s run in four waves
    calls = [call(0.8 * (i // 4), 800 * (i // 4 + 1), 800) for i in range(16)]
    verdict = demand(4, 4, rollout(2, 2), calls, 3.2, 16)
    assert not verdict["keeps_up"] and verdict["capacity"] == 4
    assert "max_instances: 8" in verdict["suggestion"]


def test_injection_splits_the_rate_and_rejects_unknown_faults() -> None:
    injection = Injection.parse("timeout, 500", 0.5, seed=7)
    assert injection.for_plugin(0).rates == {"timeout": 0.25, "500": 0.25}
    with pytest.raises(ValueError, match="timeout, eof, oom, 500, nan"):
        Injection.parse("segv", 1.0)
    with pytest.raises(ValueError, match="inject-rate"):
        Injection.parse("500", 0.0)


def test_one_function_under_two_names_is_two_rows(tmp_path: Path) -> None:
    """job.yaml lists graders.py:exact twice, as `strict` and `lenient`: each row counts its own calls."""
    shutil.copytree(FAULTY / "plugins", tmp_path / "plugins")
    shutil.copytree(FAULTY / "data", tmp_path / "data")
    job = tmp_path / "job.yaml"
    twice = (
        "    - {entry: plugins/graders.py:exact, name: strict}\n"
        "    - {entry: plugins/graders.py:exact, name: lenient, weight: 0.5}"
    )
    job.write_text((FAULTY / "ok.yaml").read_text().replace("    - {entry: plugins/graders.py:exact}", twice))
    doc = local_test(options(job, samples=2, policy_url="http://127.0.0.1:9/v1"))  # no model: unused
    assert doc["summary"]["ok"], doc["summary"]["errors_by_cause"]
    rows = {p["name"]: p for p in doc["summary"]["plugins"]}
    assert set(rows) == {"answers", "strict", "lenient"}
    assert [rows[name]["calls"] for name in ("answers", "strict", "lenient")] == [2, 2, 2]
    assert rows["strict"]["plugin"] == rows["lenient"]["plugin"]
    assert rows["strict"]["plugin"].endswith("plugins/graders.py:exact")
