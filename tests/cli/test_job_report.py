"""``plugtune jobs show`` prints the API's typed job (JobReportOut), with every key and value the
command printed when it built its own document (jobs.report.job_document, still doctor's input)."""

from __future__ import annotations

import json
from typing import Any

from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.jobs.control import queue_positions
from plugtune.jobs.report import job_document
from plugtune.store import Store
from plugtune.types import ErrorRecord
from plugtune.web.models import JobOut
from tests.web.seed import seed

runner = CliRunner()


def _show(job_id: int) -> dict[str, Any]:
    result = runner.invoke(app, ["jobs", "show", str(job_id), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def _missing(new: Any, old: Any, at: str = "") -> list[str]:
    """Where ``new`` lacks a key of ``old`` or holds another value (lists: item by item)."""
    if isinstance(old, dict):
        if not isinstance(new, dict):
            return [f"{at}: {new!r} is not a mapping"]
        gaps = [f"{at}.{k}: absent" for k in old if k not in new]
        return gaps + [g for k in old if k in new for g in _missing(new[k], old[k], f"{at}.{k}")]
    if isinstance(old, list):
        if not isinstance(new, list) or len(new) != len(old):
            return [f"{at}: {new!r} != {old!r}"]
        pairs = enumerate(zip(new, old, strict=True))
        return [g for i, (n, o) in pairs for g in _missing(n, o, f"{at}[{i}]")]
    return [] if new == old else [f"{at}: {new!r} != {old!r}"]


def test_jobs_show_json_keeps_every_key_and_value_it_printed(store: Store) -> None:
    seeded = seed(store)
    # a second attempt of the platform job, so the attempts' order shows (oldest first, as before)
    store.transition(seeded.platform_job, "queued", "manual retry")
    store.transition(seeded.platform_job, "running")
    second = store.start_attempt(seeded.platform_job, pid=4343, resumed_from_step=2)
    store.add_checkpoint(seeded.failed_job, 3, "/tmp/ckpt-3")
    places = queue_positions(store)
    for job_id in (seeded.failed_job, seeded.platform_job, seeded.running_job, seeded.done_job):
        old = job_document(store, job_id)
        old["queue_position"] = places.get(job_id)
        old = json.loads(json.dumps(old, default=str))
        shown = _show(job_id)
        assert _missing(shown, old) == [], job_id
        # and it is the API's job: every field of JobOut, total_steps beside steps_total
        assert set(JobOut.model_fields) <= set(shown) and shown["total_steps"] == shown["steps_total"]
    platform = _show(seeded.platform_job)
    assert [(a["number"], a["pid"], a["trigger"]) for a in platform["attempts"]] == [
        (1, 1, "first run"),
        (second, 4343, "manual retry"),
    ]
    failed = _show(seeded.failed_job)
    assert failed["checkpoint"]["path"] == "/tmp/ckpt-3" and failed["checkpoint"]["step"] == 3
    assert [p["role"] for p in failed["plugins"]] == [p["kind"] for p in failed["plugins"]]
    assert failed["error"]["plugin"] == "exact"  # as the API names it; evidence keeps the entry
    assert failed["error"]["evidence"]["plugin"] == "plugins/grader.py:exact"


def test_jobs_show_prints_the_job_its_error_attempts_and_plugins(store: Store) -> None:
    seeded = seed(store)
    store.set_job_error(
        seeded.done_job, ErrorRecord("Invalid value", "user", "", "2 problems found:\n- a\n- b", "fix it")
    )
    result = runner.invoke(app, ["jobs", "show", str(seeded.failed_job)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "job 1 adder-grpo: failed (3/10 steps)"
    assert "Call plugin error (plugin): 500" in lines
    assert "  attempt 1: failed (from step 0) — Call plugin error: 500" in lines
    assert any(line.startswith("  plugin exact (grader): failed code h-grader-1 — 500 [") for line in lines)
    assert any(line.startswith("  latest: ") for line in lines)
    platform = runner.invoke(app, ["jobs", "show", str(seeded.platform_job)]).output
    assert "automatic retry 0 in " in platform and "(or now: plugtune jobs retry 2)" in platform
    done = runner.invoke(app, ["jobs", "show", str(seeded.done_job)]).output
    assert "Invalid value (user)\n  2 problems found:" in done
    missing = runner.invoke(app, ["jobs", "show", "99"])
    assert missing.exit_code == 2 and "there is no job 99" in missing.output


def test_jobs_list_json_keeps_every_key_and_value_it_printed(store: Store) -> None:
    seed(store)
    queued = store.create_job("waits", {"model": "tiny"}, spec_yaml="model: tiny\n")
    places = queue_positions(store)
    old = [{**j.to_dict(), "queue_position": places.get(j.id)} for j in store.list_jobs(None, limit=50)]
    result = runner.invoke(app, ["jobs", "list", "--json"])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)["jobs"]
    assert _missing(listed, json.loads(json.dumps(old, default=str))) == []
    assert all(set(JobOut.model_fields) <= set(j) for j in listed)
    assert [j["queue_position"] for j in listed if j["id"] == queued] == [1]
    assert next(j for j in listed if j["id"] == queued)["spec_yaml"] == "model: tiny\n"

    text = runner.invoke(app, ["jobs", "list"]).output.splitlines()
    assert text[0].split()[:3] == [str(queued), "queued", "0/0"]
    assert text[0].endswith("waits  (#1 in the queue)")
    failed = next(line for line in text if "adder-grpo" in line)
    assert failed.endswith("adder-grpo  Call plugin error: 500")
    assert "0/0" not in failed and "   3/10  " in failed


def test_logs_json_keeps_every_key_and_value_it_printed(store: Store) -> None:
    seeded = seed(store)
    old = [r.to_dict() for r in store.newest_logs(seeded.failed_job, 30)]
    assert old and any(r["trajectory_id"] for r in old)
    result = runner.invoke(app, ["logs", str(seeded.failed_job), "--limit", "30", "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert _missing(shown["logs"], json.loads(json.dumps(old, default=str))) == []
    assert shown["older_not_shown"] == store.count_logs(seeded.failed_job, before_id=old[0]["id"])


def test_trajectories_lists_each_with_its_status_reward_and_why(store: Store) -> None:
    seeded = seed(store)
    rows = store.trajectories(seeded.failed_job, limit=50)
    assert any(r.status == "failed" for r in rows) and any(r.reward is not None for r in rows)
    result = runner.invoke(app, ["trajectories", str(seeded.failed_job)])
    assert result.exit_code == 0, result.output
    expected = []
    for r in rows:  # the line it has always printed, from the stored summary
        reward = "-" if r.reward is None else f"{r.reward:.3f}"
        cause = f"  {r.error_cause}" if r.error_cause else ""
        why = f"  — {r.discard_reason}" if r.discard_reason else ""
        expected.append(f"{r.trajectory_id:<20} step {r.step:>4}  {r.status:<8} reward {reward}{cause}{why}")
    assert result.output.splitlines() == expected
    assert f"{seeded.failed_trajectory:<20} step    2  failed   reward -  500" in expected
