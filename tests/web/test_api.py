"""The JSON API against a real store in a temp dir, filled through the store's own API."""

from __future__ import annotations

import io
import zipfile

from fastapi.testclient import TestClient

from plugtune.errors import HINTS, Cause
from plugtune.store import Store
from plugtune.types import ErrorRecord
from plugtune.web.charts import END_SLACK_S
from tests.web.seed import GRADER_CODE, XSS_IMG, XSS_SCRIPT, Seeded


def test_jobs_list_filters_by_status_and_pages(client: TestClient, seeded: Seeded) -> None:
    everything = client.get("/api/jobs").json()
    assert everything["total"] == 4
    newest_first = [seeded.done_job, seeded.running_job, seeded.platform_job, seeded.failed_job]
    assert [j["id"] for j in everything["items"]] == newest_first
    failed = client.get("/api/jobs", params={"status": "failed"}).json()
    assert {j["id"] for j in failed["items"]} == {seeded.failed_job, seeded.platform_job}
    assert failed["items"][1]["error"]["type"] == "Call plugin error"
    second = client.get("/api/jobs", params={"page": 2, "page_size": 1}).json()
    assert [j["id"] for j in second["items"]] == [seeded.running_job]
    bad = client.get("/api/jobs", params={"status": "exploded"})
    assert bad.status_code == 400
    assert "status must be one of" in bad.json()["detail"]


def test_failed_job_carries_type_owner_message_hint_and_history(client: TestClient, seeded: Seeded) -> None:
    detail = client.get(f"/api/jobs/{seeded.failed_job}").json()
    error = detail["job"]["error"]
    assert (error["type"], error["owner"], error["cause"]) == ("Call plugin error", "plugin", "500")
    assert error["hint"] == HINTS[Cause.ERROR_500]
    assert error["plugin"] == "exact" and error["trajectory_id"] == "s2-g1-r2"
    assert "ZeroDivisionError" in error["traceback"]
    assert detail["job"]["steps_done"] == 3 and detail["job"]["total_steps"] == 10
    assert [a["status"] for a in detail["attempts"]] == ["failed"]
    assert detail["attempts"][0]["error"]["message"].startswith("grader exact raised")
    assert len(detail["errors"]) == 1


def test_unknown_job_is_404_in_json_and_html(client: TestClient) -> None:
    api = client.get("/api/jobs/999")
    assert api.status_code == 404 and api.json() == {"detail": "job 999 does not exist"}
    page = client.get("/jobs/999")
    assert page.status_code == 404 and "job 999 does not exist" in page.text


def test_retry_queues_a_failed_job_and_calls_the_hook(
    client: TestClient, seeded: Seeded, store: Store, retried: list[str]
) -> None:
    answer = client.post(f"/api/jobs/{seeded.failed_job}/retry")
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "queued"
    assert store.get_job(seeded.failed_job).status == "queued"  # type: ignore[union-attr]
    assert retried == [str(seeded.failed_job)]
    again = client.post(f"/api/jobs/{seeded.failed_job}/retry")
    assert again.status_code == 409
    assert "only a failed or cancelled job can be retried" in again.json()["detail"]
    assert retried == [str(seeded.failed_job)]


def test_retry_button_redirects_back_to_the_job(client: TestClient, seeded: Seeded) -> None:
    answer = client.post(f"/jobs/{seeded.platform_job}/retry", follow_redirects=False)
    assert answer.status_code == 303
    assert answer.headers["location"] == f"/jobs/{seeded.platform_job}?retried=1"
    page = client.get(answer.headers["location"])
    assert "Retry requested" in page.text
    refused = client.post(f"/jobs/{seeded.running_job}/retry")
    assert refused.status_code == 409 and "Cannot retry" in refused.text


def test_training_curves_by_step(client: TestClient, seeded: Seeded) -> None:
    charts = {c["key"]: c for c in client.get(f"/api/jobs/{seeded.failed_job}/curves").json()["charts"]}
    assert set(charts) >= {"reward", "loss", "kl", "response_length", "plugin_errors"}
    reward = {s["name"]: s["points"] for s in charts["reward"]["series"]}
    assert reward["mean"] == [[1.0, 0.2], [2.0, 0.4], [3.0, 0.6000000000000001]]
    assert "exact" in reward
    assert charts["reward"]["x"] == "step"
    assert charts["plugin_errors"]["series"][0]["name"] == "500"


def test_training_charts_say_why_they_are_empty(client: TestClient, seeded: Seeded) -> None:
    charts = {c["key"]: c for c in client.get(f"/api/jobs/{seeded.done_job}/curves").json()["charts"]}
    assert (
        charts["plugin_errors"]["empty"] == "No plugin call failed." and not charts["plugin_errors"]["series"]
    )
    assert charts["loss"]["empty"] == "Not recorded: the job succeeded without it."  # it ended: no "yet"
    live = {c["key"]: c for c in client.get(f"/api/jobs/{seeded.running_job}/curves").json()["charts"]}
    assert (live["plugin_errors"]["empty"], live["loss"]["empty"]) == (
        "No plugin error so far.",
        "Not recorded yet.",
    )


def test_plugins_status_failure_reason_and_code(client: TestClient, seeded: Seeded) -> None:
    plugins = {p["name"]: p for p in client.get(f"/api/jobs/{seeded.failed_job}/plugins").json()}
    assert plugins["solve"]["status"] == "completed" and plugins["solve"]["kind"] == "rollout"
    assert plugins["exact"]["status"] == "failed"
    assert "ZeroDivisionError" in plugins["exact"]["failure_reason"]
    code = client.get(f"/api/jobs/{seeded.failed_job}/plugins/exact/code").json()
    assert code["code_hash"] == "h-grader-1"
    assert code["files"] == [{"path": "plugins/grader.py", "text": GRADER_CODE.decode()}]
    missing = client.get(f"/api/jobs/{seeded.failed_job}/plugins/nope")
    assert missing.status_code == 404 and "its plugins: solve, exact" in missing.json()["detail"]


def test_download_code_as_zip_and_as_one_file(client: TestClient, seeded: Seeded) -> None:
    answer = client.get(f"/api/jobs/{seeded.failed_job}/plugins/exact/code.zip")
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/zip"
    assert 'filename="exact-h-grader-1.zip"' in answer.headers["content-disposition"]
    with zipfile.ZipFile(io.BytesIO(answer.content)) as archive:
        assert archive.namelist() == ["exact-h-grader-1/plugins/grader.py"]
        assert archive.read("exact-h-grader-1/plugins/grader.py") == GRADER_CODE
    one = client.get(f"/api/jobs/{seeded.failed_job}/plugins/exact/code/plugins/grader.py")
    assert one.content == GRADER_CODE and 'filename="grader.py"' in one.headers["content-disposition"]


def test_plugin_metrics_over_ranges(client: TestClient, seeded: Seeded) -> None:
    url = f"/api/jobs/{seeded.failed_job}/plugins/solve/metrics"
    answer = client.get(url, params={"range": "1h"}).json()
    keys = [c["key"] for c in answer["charts"]]
    assert keys == [
        *("exec_qps", "latency", "error_qps", "cpu_percent", "memory_percent", "instances"),
        *("outbound_mib_s", "concurrency_per_instance"),
    ]
    # an ended plugin's window ends where it ended (and keeps the points its attempt wrote just after)
    assert answer["end"] == seeded.now - 300 + END_SLACK_S
    assert answer["end"] - answer["start"] == 3600 and not answer["reclaimed"]
    qps = answer["charts"][0]["series"][0]["points"]
    assert 55 <= len(qps) <= 61 and all(answer["start"] <= t <= answer["end"] for t, _ in qps)
    latency = {s["name"] for s in answer["charts"][1]["series"]}
    assert latency == {"avg", "p50", "p99"}
    errors = {s["name"] for s in answer["charts"][2]["series"]}
    assert errors == {"500", "Timeout"}
    wide = client.get(url, params={"range": "7d"}).json()
    assert len(wide["charts"][0]["series"][0]["points"]) > len(qps)
    start, end = seeded.now - 2 * 3600, seeded.now - 1.5 * 3600
    custom = client.get(url, params={"range": "custom", "start": start, "end": end}).json()
    points = custom["charts"][0]["series"][0]["points"]
    assert 28 <= len(points) <= 31 and all(start <= t <= end for t, _ in points)
    assert client.get(url, params={"range": "2y"}).status_code == 400
    assert client.get(url, params={"range": "custom", "start": end, "end": start}).status_code == 400


def test_reclaimed_monitoring_data_is_reported(client: TestClient, seeded: Seeded, store: Store) -> None:
    assert store.purge_expired(now=seeded.now + 8 * 86400) == 2
    answer = client.get(f"/api/jobs/{seeded.failed_job}/plugins/exact/metrics", params={"range": "7d"}).json()
    assert answer["reclaimed"] is True
    assert "has been reclaimed" in answer["reclaimed_message"]
    assert all(not c["series"] for c in answer["charts"])
    page = client.get(f"/jobs/{seeded.failed_job}/logs", params={"plugin": "exact"})
    assert "have been reclaimed" in page.text


def test_logs_newest_first_with_filters(client: TestClient, seeded: Seeded) -> None:
    url = f"/api/jobs/{seeded.failed_job}/logs"
    everything = client.get(url).json()["items"]
    assert len(everything) == 14
    assert [line["id"] for line in everything] == sorted((line["id"] for line in everything), reverse=True)
    assert {line["plugin"] for line in client.get(url, params={"plugin": "exact"}).json()["items"]} == {
        "exact"
    }
    errors = client.get(url, params={"level": "error"}).json()["items"]
    assert [line["message"] for line in errors] == [f"grader crashed {XSS_IMG}"]
    one = client.get(url, params={"trajectory": "s2-g1-r2"}).json()["items"]
    assert len(one) == 4 and {line["trajectory_id"] for line in one} == {"s2-g1-r2"}
    assert len(client.get(url, params={"q": "SLOW TOOL"}).json()["items"]) == 1
    assert client.get(url, params={"level": "LOUD"}).status_code == 400


def test_logs_keyset_pages_and_live_tail(client: TestClient, seeded: Seeded, store: Store) -> None:
    url = f"/api/jobs/{seeded.failed_job}/logs"
    first = client.get(url, params={"limit": 5}).json()
    second = client.get(url, params={"limit": 5, "before": first["before"]}).json()
    third = client.get(url, params={"limit": 5, "before": second["before"]}).json()
    ids = [line["id"] for page in (first, second, third) for line in page["items"]]
    assert len(ids) == 14 == len(set(ids)) and third["before"] is None
    newest = first["items"][0]["id"]
    assert client.get(url, params={"after": newest}).json()["items"] == []
    from plugtune.types import LogLine

    store.add_logs(seeded.failed_job, [LogLine(seeded.now, "INFO", "solve", "fresh")])
    tail = client.get(url, params={"after": newest}).json()
    assert [line["message"] for line in tail["items"]] == ["fresh"] and tail["job_status"] == "failed"


def test_logs_page_links_previous_and_next(client: TestClient, seeded: Seeded) -> None:
    from plugtune.web import pages

    pages.LOGS_PER_PAGE, saved = 5, pages.LOGS_PER_PAGE
    try:
        first = client.get(f"/jobs/{seeded.failed_job}/logs")
        assert 'rel="next"' in first.text and 'rel="prev"' not in first.text
        second_url = (
            first.text.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0].replace("&amp;", "&")
        )
        second = client.get(f"/jobs/{seeded.failed_job}/logs{second_url}")
        assert 'rel="prev"' in second.text and 'rel="next"' in second.text
    finally:
        pages.LOGS_PER_PAGE = saved


def test_trajectory_list_filters(client: TestClient, seeded: Seeded) -> None:
    url = f"/api/jobs/{seeded.failed_job}/trajectories"
    assert [t["id"] for t in client.get(url).json()["items"]][:2] == ["s2-g1-r2", "s2-g1-r1"]
    assert [t["id"] for t in client.get(url, params={"status": "failed"}).json()["items"]] == ["s2-g1-r2"]
    assert [t["id"] for t in client.get(url, params={"status": "discard"}).json()["items"]] == ["s2-g1-r1"]
    assert len(client.get(url, params={"step": 1}).json()["items"]) == 3
    assert len(client.get(url, params={"min_reward": 0.5}).json()["items"]) == 3
    assert [t["id"] for t in client.get(url, params={"q": "onerror"}).json()["items"]] == ["s2-g1-r2"]
    assert len(client.get(url, params={"plugin": "exact"}).json()["items"]) == 6
    assert client.get(url, params={"step": "two"}).status_code == 400
    paged = client.get(url, params={"limit": 4}).json()
    rest = client.get(url, params={"limit": 4, "before": paged["before"]}).json()
    assert len(paged["items"]) == 4 and len(rest["items"]) == 2 and rest["before"] is None


def test_trajectory_detail_messages_rewards_errors_logs(client: TestClient, seeded: Seeded) -> None:
    t = client.get(f"/api/jobs/{seeded.failed_job}/trajectories/s2-g1-r2").json()
    assert t["status"] == "failed" and t["reward"] is None
    assert t["errors"][0]["cause"] == "500" and t["errors"][0]["plugin"] == "exact"
    call = t["messages"][2]["tool_calls"][0]
    assert call["name"] == "calculator" and '"expression": "19 + 23"' in call["arguments"]
    assert t["messages"][3]["tool_call_id"] == "call-s2-g1-r2"
    assert XSS_SCRIPT in t["messages"][4]["content"]
    times = [line["time"] for line in t["logs"]["items"]]
    assert len(times) == 4 and times == sorted(times)
    ok = client.get(f"/api/jobs/{seeded.failed_job}/trajectories/s1-g0-r0").json()
    assert ok["reward_components"] == {"exact": 1.0} and ok["advantage"] == 0.5
    assert client.get(f"/api/jobs/{seeded.failed_job}/trajectories/nope").status_code == 404


def test_trajectory_neighbors_follow_the_filtered_list(client: TestClient, seeded: Seeded) -> None:
    url = f"/api/jobs/{seeded.failed_job}/trajectories/s2-g1-r1/neighbors"
    assert client.get(url).json() == {"prev": "s2-g1-r2", "next": "s2-g1-r0"}
    assert client.get(url, params={"status": "discard"}).json() == {"prev": None, "next": None}
    top = client.get(f"/api/jobs/{seeded.failed_job}/trajectories/s2-g1-r2/neighbors").json()
    assert top == {"prev": None, "next": "s2-g1-r1"}


def test_group_side_by_side(client: TestClient, seeded: Seeded) -> None:
    group = client.get(f"/api/jobs/{seeded.failed_job}/groups/g0").json()
    assert [t["id"] for t in group["trajectories"]] == ["s1-g0-r0", "s1-g0-r1", "s1-g0-r2"]
    assert [t["advantage"] for t in group["trajectories"]] == [0.5, -0.5, 0.5]
    page = client.get(f"/jobs/{seeded.failed_job}/groups/g0")
    assert page.status_code == 200 and page.text.count('class="col"') == 3
    assert client.get(f"/jobs/{seeded.failed_job}/groups/nope").status_code == 404


def test_prometheus_exposition(client: TestClient, seeded: Seeded) -> None:
    answer = client.get("/metrics")
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = answer.text
    assert 'plugtune_jobs{status="failed"} 2' in text
    assert 'plugtune_jobs{status="running"} 1' in text
    assert f'plugtune_plugin_metric{{job="{seeded.running_job}",metric="exec_qps",plugin="solve"}} 7' in text
    assert f'plugtune_training_metric{{job="{seeded.running_job}",metric="reward/mean"}} 0.5' in text
    assert (
        f'plugtune_plugin_up{{job="{seeded.running_job}",plugin="solve",role="rollout",status="running"}} 1'
        in text
    )
    for line in text.splitlines():
        assert line.startswith("#") or line.startswith("plugtune_"), line


def test_docs_and_openapi_work_offline(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    assert "/api/jobs/{job_id}/logs" in schema["paths"]
    docs = client.get("/docs").text
    assert (
        "/api/jobs/{job_id}/trajectories" in docs
        and "http" not in docs.split("<main>")[1].split("</main>")[0]
    )


def test_retry_history_says_what_started_each_attempt(
    client: TestClient, seeded: Seeded, store: Store
) -> None:
    job = seeded.platform_job
    store.transition(job, "queued", "automatic retry 1")  # as the scheduler does when next_retry_at is due
    store.transition(job, "running", "attempt starting")
    second = store.start_attempt(job, pid=2)
    store.end_attempt(
        job, second, "failed", ErrorRecord("internal error", "platform", "", "again")
    )
    store.transition(job, "failed", "attempt died")
    assert client.post(f"/api/jobs/{job}/retry").status_code == 200
    store.transition(job, "running", "attempt starting")
    store.start_attempt(job, pid=3, resumed_from_step=2)
    attempts = client.get(f"/api/jobs/{job}").json()["attempts"]
    assert [(a["number"], a["trigger"]) for a in attempts] == [
        (3, "manual retry"),
        (2, "automatic retry"),
        (1, "first run"),
    ]
    assert attempts[0]["resumed_from_step"] == 2 and attempts[1]["error"]["message"] == "again"


def test_trajectory_detail_has_its_tokens_and_history_metrics(client: TestClient, seeded: Seeded) -> None:
    t = client.get(f"/api/jobs/{seeded.failed_job}/trajectories/s1-g0-r0").json()
    assert t["prompt_ids"] == [1, 2, 3] and t["response_ids"] == [4, 5]
    assert t["response_mask"] == [1, 1] and t["response_logprobs"] == [-0.1, -0.2]
    group = client.get(f"/api/jobs/{seeded.failed_job}/groups/g0").json()["trajectories"]
    assert all(len(g["response_ids"]) == len(g["response_mask"]) == 2 for g in group)


def test_job_warnings_reach_the_api_and_the_job_page(
    client: TestClient, seeded: Seeded, store: Store
) -> None:
    from plugtune.jobs.report import JOB_WARNINGS
    from plugtune.types import LogLine

    message = "step 2: logprob_gap is 0.12, above the 0.001 that numerical noise explains <b>x</b>"
    store.add_logs(seeded.done_job, [LogLine(seeded.now, "WARNING", JOB_WARNINGS, message, "trainer")])
    assert client.get(f"/api/jobs/{seeded.done_job}").json()["warnings"] == [message]
    assert (
        client.get(f"/api/jobs/{seeded.failed_job}").json()["warnings"] == []
    )  # a plugin's WARNING is not one
    html = client.get(f"/jobs/{seeded.done_job}").text
    assert 'id="job-warnings"' in html and "logprob_gap is 0.12" in html and "<b>x</b>" not in html


def test_a_discard_reason_is_shown_in_the_api_the_list_the_detail_and_the_group(
    client: TestClient, seeded: Seeded, store: Store
) -> None:
    import dataclasses

    [record] = store.trajectory_records(seeded.failed_job, ["s2-g1-r1"])
    why = f"answer discarded it (Status.DISCARD): the sandbox was down \u202e{XSS_SCRIPT}"
    store.upsert_trajectories(seeded.failed_job, [dataclasses.replace(record, discard_reason=why)])
    items = client.get(f"/api/jobs/{seeded.failed_job}/trajectories", params={"status": "discard"}).json()
    assert [t["discard_reason"] for t in items["items"]] == [why]
    detail = client.get(f"/api/jobs/{seeded.failed_job}/trajectories/s2-g1-r1").json()
    assert detail["discard_reason"] == why
    for url in (f"/jobs/{seeded.failed_job}/trajectories", f"/jobs/{seeded.failed_job}/groups/g1"):
        page = client.get(url).text
        assert "the sandbox was down ⟨U+202E⟩" in page and XSS_SCRIPT not in page, url


def test_a_100_kb_message_keeps_every_page_short_and_bidi_controls_visible(store: Store) -> None:
    """The console walk's "very long content": a plugin's 100 KB Status.FAILURE reason reaches the
    job banner, the Plugin tab, the trajectory list and the group view; each shows the head, the
    rest behind "show more", and a right-to-left override as ⟨U+202E⟩."""
    import dataclasses

    from plugtune.web import create_app
    from tests.web.conftest import BASE_URL
    from tests.web.seed import _trajectories

    reason = "saved photo_\u202egnp.exe " + "x" * 100_000
    job = store.create_job("loud", {"model": "tiny"})
    store.transition(job, "validating")
    store.transition(job, "running")
    attempt = store.start_attempt(job, pid=1)
    store.upsert_plugin(job, "solve", "rollout", "plugins/rollout.py:solve")
    store.set_plugin_status(job, "solve", "running")
    error = {"type": "Call plugin error", "owner": "plugin", "cause": "Status failure", "plugin": "solve"}
    error |= {"message": f"solve returned Status.FAILURE (try 1 of 1); its reason: {reason}"}
    store.set_plugin_status(job, "solve", "failed", failure_reason=f"Status failure [solve]: {reason}")
    record = dataclasses.replace(_trajectories()[0], status="discard", discard_reason=reason)
    record = dataclasses.replace(record, messages=[{"role": "user", "content": reason}])
    store.upsert_trajectories(job, [record])
    store.end_attempt(job, attempt, "failed", ErrorRecord.from_dict(error))
    store.set_job_error(job, ErrorRecord.from_dict(error), attempt=attempt)
    store.transition(job, "failed")
    client = TestClient(create_app(store), base_url=BASE_URL)
    urls = [f"/jobs/{job}", f"/jobs/{job}/plugins", f"/jobs/{job}/trajectories"]
    urls.append(f"/jobs/{job}/groups/{record.group_id}")
    for url in urls:
        page = client.get(url)
        assert page.status_code == 200, url
        # the text is sent once or twice, but all past its head is folded in a closed <details>
        assert page.text.count("x" * 90_000) <= page.text.count('<details class="more">'), url
        assert len(page.content) < 450_000, (url, len(page.content))
        assert "photo_⟨U+202E⟩gnp.exe" in page.text and "\u202e" not in page.text, url
        assert "show more" in page.text, url
    detail = client.get(f"/api/jobs/{job}/trajectories/{record.trajectory_id}").json()
    assert detail["discard_reason"] == reason  # "show more" has the whole text to show
