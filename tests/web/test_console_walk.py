"""Defects found walking the console as a user (issue 15): each test failed before its fix."""

from __future__ import annotations

import time
from pathlib import Path

from fastapi.testclient import TestClient

from plugtune.errors import Cause, PluginCallError
from plugtune.jobs.caller import StepCounts
from plugtune.jobs.control import create_job
from plugtune.store import Store
from plugtune.store.records import Attempt, Job
from plugtune.types import ErrorRecord, LogLine, MetricPoint
from plugtune.web.service import timing
from tests.jobs.jobkit import make_job
from tests.web.seed import Seeded


def _charts(client: TestClient, job: int) -> dict[str, dict]:  # type: ignore[type-arg]
    return {c["key"]: c for c in client.get(f"/api/jobs/{job}/curves").json()["charts"]}


def _failed_at_step_one(store: Store) -> int:
    """A job stopped by a grader at step 1: only the attempt's per-step call counts exist."""
    job = store.create_job("stopped", {"model": "tiny"})
    store.transition(job, "running")
    counts = StepCounts()
    counts.calls = 6
    counts.errors.update({"500": 3, "Timeout": 1})
    counts.examples["500"] = PluginCallError(Cause.ERROR_500, "boom", plugin="exact")
    store.add_metrics(job, counts.metric_points(1))
    store.transition(job, "failed", "Call plugin error: 500")
    return job


def test_plugin_errors_by_cause_show_the_failed_calls_of_a_job_stopped_by_them(
    client: TestClient, store: Store
) -> None:
    job = _failed_at_step_one(store)
    chart = _charts(client, job)["plugin_errors"]
    assert {s["name"]: s["points"] for s in chart["series"]} == {"500": [[1.0, 3.0]], "Timeout": [[1.0, 1.0]]}


def test_a_step_run_again_after_a_retry_is_drawn_once_with_its_newest_value(
    client: TestClient, store: Store
) -> None:
    job = store.create_job("rerun", {"model": "tiny"})
    t = time.time()
    first = [MetricPoint(t + s, "", "reward/mean", 0.1 * s, step=s) for s in (1, 2, 3)]
    again = [MetricPoint(t + 10 + s, "", "reward/mean", 0.5 + s, step=s) for s in (1, 2)]
    store.add_metrics(job, first + again)
    reward = {s["name"]: s["points"] for s in _charts(client, job)["reward"]["series"]}
    assert reward["mean"] == [[1.0, 1.5], [2.0, 2.5], [3.0, 0.30000000000000004]]


def test_the_retry_button_says_what_a_retry_will_do(
    client: TestClient, store: Store, seeded: Seeded, tmp_path: Path
) -> None:
    page = client.get(f"/jobs/{seeded.failed_job}").text
    assert "restarts at step 0: no checkpoint was saved" in page
    assert "resumes from the last checkpoint" not in page
    store.add_checkpoint(seeded.failed_job, 2, "/tmp/ckpt-2")
    assert "resumes from the checkpoint of step 2" in client.get(f"/jobs/{seeded.failed_job}").text
    assert client.get(f"/api/jobs/{seeded.failed_job}").json()["retry_note"].endswith("step 2")
    job_file = make_job(tmp_path / "bad")
    (tmp_path / "bad" / "data" / "train.jsonl").unlink()
    invalid, problem = create_job(store, job_file)
    assert problem is not None
    page = client.get(f"/jobs/{invalid}").text
    assert "validates job.yaml and the data again: fix the problems above first" in page
    assert "checkpoint" not in page.split('id="retry-note"')[1].split("</span>")[0]


def test_a_failed_plugin_has_its_metrics_over_its_lifetime_by_default(
    client: TestClient, store: Store
) -> None:
    job = store.create_job("short", {"model": "tiny"})
    store.upsert_plugin(job, "exact", "grader", "plugins/grader.py:exact")
    start = time.time() - 100
    store.set_plugin_status(job, "exact", "running", at=start)
    store.set_plugin_status(job, "exact", "failed", failure_reason="500: boom", at=start + 20)
    # The attempt writes a plugin's last points as it closes: just after the plugin ended.
    points = [MetricPoint(start + s, "exact", "exec_qps", 1.0 + s) for s in (5, 10, 15, 21)]
    store.add_metrics(job, points)
    answer = client.get(f"/api/jobs/{job}/plugins/exact/metrics").json()
    assert answer["range"] == "life"
    assert start - 11 <= answer["start"] <= start and start + 21 <= answer["end"] <= start + 31
    qps = {c["key"]: c for c in answer["charts"]}["exec_qps"]["series"][0]["points"]
    assert [t - start for t, _ in qps] == [5, 10, 15, 21]
    page = client.get(f"/jobs/{job}/plugins?plugin=exact").text
    assert 'data-range="life" class="active"' in page and 'data-range="life"' in page


def test_queued_jobs_show_their_place_in_the_queue(client: TestClient, store: Store) -> None:
    queued = [store.create_job(f"q{i}", {"model": "tiny"}) for i in range(3)]
    items = {j["id"]: j for j in client.get("/api/jobs", params={"status": "queued"}).json()["items"]}
    assert [items[j]["queue_position"] for j in queued] == [1, 2, 3]  # the oldest runs first
    assert client.get(f"/api/jobs/{queued[2]}").json()["job"]["queue_position"] == 3
    assert "position 2 in the queue" in client.get(f"/jobs/{queued[1]}").text
    assert "#3 in queue" in client.get("/jobs", params={"status": "queued"}).text


def test_the_job_page_shows_its_configuration(client: TestClient, store: Store, tmp_path: Path) -> None:
    job, problem = create_job(store, make_job(tmp_path / "cfg", hyper={"learning_rate": 0.0042}))
    assert problem is None
    page = client.get(f"/jobs/{job}").text
    config = page.split('id="job-config"')[1].split("</section>")[0]
    for text in ("hyperparameters.learning_rate", "0.0042", "data.train", "plugins.rollout", "job.yaml"):
        assert text in config, text
    api = client.get(f"/api/jobs/{job}").json()
    assert api["config"]["hyperparameters"]["learning_rate"] == 0.0042 and "learning_rate" in api["spec_yaml"]


def test_duration_and_eta_follow_the_running_attempt() -> None:
    def job(status: str, done: int, updated: float) -> Job:
        return Job(1, "j", {}, "", status, 0.0, updated, done, 10, None, None, 0)

    def attempt(number: int, started: float, resumed: int, status: str) -> Attempt:
        return Attempt(1, number, None, started, None, status, None, resumed)

    first = attempt(1, 1000.0, 0, "failed")
    assert timing(job("running", 4, 0), [first, attempt(2, 1500.0, 2, "running")], 1700.0) == (700.0, 600.0)
    assert timing(job("succeeded", 10, 2100.0), [first], 9999.0) == (1100.0, None)
    assert timing(job("queued", 0, 0), [], 5.0) == (None, None)


def test_long_log_lines_are_cut_and_bidi_controls_are_shown(client: TestClient, store: Store) -> None:
    job = store.create_job("loud", {"model": "tiny"})
    huge = "x" * 100_000
    lines = [LogLine(time.time(), "INFO", "solve", f"{i} {huge}") for i in range(40)]
    store.add_logs(job, [*lines, LogLine(time.time(), "INFO", "solve", "saved photo_\u202egnp.exe")])
    page = client.get(f"/jobs/{job}/logs")
    assert len(page.content) < 250_000  # was 4 MB: every line in full
    # lines "0 x…" to "9 x…" have 100,002 characters, 2,000 shown
    assert page.text.count("show more (98,002 more characters)") == 10
    assert "photo_⟨U+202E⟩gnp.exe" in page.text and "\u202e" not in page.text
    newest = store.logs(job, limit=2)[1]
    one = client.get(f"/api/jobs/{job}/logs", params={"before": newest.id + 1, "limit": 1}).json()
    assert one["items"][0]["message"] == f"39 {huge}"  # "show more" loads the full line


def test_no_plugin_stays_running_after_its_attempt_ended(store: Store) -> None:
    job = store.create_job("died", {"model": "tiny"})
    store.transition(job, "running")
    number = store.start_attempt(job, pid=1)
    for name, entry in (("solve", "plugins/rollout.py:solve"), ("exact", "plugins/grader.py:exact")):
        store.upsert_plugin(job, name, "rollout" if name == "solve" else "grader", entry)
        store.set_plugin_status(job, name, "running")
    died = {"type": "internal error", "owner": "platform", "cause": "attempt process died", "message": "-9"}
    store.end_attempt(job, number, "failed", ErrorRecord.from_dict(died))
    assert {p.name: p.status for p in store.list_plugins(job)} == {"solve": "completed", "exact": "completed"}
    assert all(p.ended_at is not None for p in store.list_plugins(job))
    store.transition(job, "failed")
    store.transition(job, "queued", "manual retry")
    assert {p.status for p in store.list_plugins(job)} == {"waiting"}  # until the retry deploys them
    number = store.start_attempt(job, pid=2)
    crash = {"type": "Call plugin error", "cause": "Create faas fault", "message": "import failed"}
    crashed = ErrorRecord.from_dict({**crash, "evidence": {"plugin": "plugins/grader.py:exact"}})
    store.end_attempt(job, number, "failed", crashed)
    plugins = {p.name: p for p in store.list_plugins(job)}
    assert plugins["exact"].status == "failed" and "import failed" in plugins["exact"].failure_reason
    assert plugins["solve"].status == "not started"  # never deployed: not "completed", not left "waiting"
