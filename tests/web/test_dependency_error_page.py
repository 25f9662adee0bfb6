"""A job that failed on a dependency (a service its plugins call) shows its owner and the automatic
retry's countdown, as a platform failure does."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient
from typer.testing import CliRunner

from plugtune.cli import app
from plugtune.errors import HINTS, DependencyCause, ErrorType
from plugtune.store import Store
from plugtune.types import ErrorRecord, MetricPoint


def test_a_dependency_error_shows_its_owner_and_the_automatic_retry_countdown(
    client: TestClient, store: Store
) -> None:
    now = time.time()
    job = store.create_job("judged", {"model": "tiny"})
    store.transition(job, "running")
    attempt = store.start_attempt(job, pid=1)
    error = {
        "type": ErrorType.DEPENDENCY.value,
        "owner": "dependency",
        "cause": DependencyCause.SERVER_ERROR.value,
        "message": "the dependency judge (127.0.0.1:8000) answered HTTP 500 (server error)",
        "hint": HINTS[DependencyCause.SERVER_ERROR],
    }
    store.end_attempt(job, attempt, "failed", ErrorRecord.from_dict(error))
    store.set_job_error(job, ErrorRecord.from_dict(error), attempt=attempt)
    store.update_job(job, next_retry_at=now + 900, auto_retries=1)
    store.transition(job, "failed", "dependency error")
    html = client.get(f"/jobs/{job}").text
    assert "Dependency error" in html and 'id="failure-owner">dependency<' in html
    assert f'data-countdown-to="{now + 900}"' in html


def test_a_running_job_that_waits_out_an_outage_says_so_on_its_page_api_events_and_cli(
    client: TestClient, store: Store
) -> None:
    """The attempt writes dependency/waiting/<name>/<cause> (the outage's start; 0 once it is over):
    the job's status says what it waits for in the page, GET /api/jobs/ID, its events and jobs show."""
    from plugtune.web.job_events import job_event

    since = time.time() - 30
    job = store.create_job("judged", {"model": "tiny"})
    store.transition(job, "running")
    store.add_metrics(job, [MetricPoint(since, "", "dependency/waiting/judge/unreachable", since, step=1)])
    said = (
        f"waiting for dependency judge: unreachable since {time.strftime('%H:%M:%S', time.localtime(since))}"
    )
    assert client.get(f"/api/jobs/{job}").json()["job"]["waiting"] == said
    assert f"running · {said}</dd>" in client.get(f"/jobs/{job}").text
    found = store.get_job(job)
    assert found is not None and job_event(store, found).waiting == said
    if store.url.startswith("sqlite"):  # the PostgreSQL fixture's schema is the test's own
        shown = CliRunner().invoke(app, ["jobs", "show", str(job)], env={"PLUGTUNE_DATABASE_URL": store.url})
        assert f"  {said}\n" in shown.stdout, shown.output
    # over: the series goes back to 0, and nothing is said any more
    store.add_metrics(
        job, [MetricPoint(time.time(), "", "dependency/waiting/judge/unreachable", 0.0, step=2)]
    )
    assert client.get(f"/api/jobs/{job}").json()["job"]["waiting"] is None
    assert "waiting for dependency" not in client.get(f"/jobs/{job}").text
