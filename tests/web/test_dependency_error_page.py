"""A job that failed on a dependency (a service its plugins call) shows its owner and the automatic
retry's countdown, as a platform failure does."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from plugtune.errors import HINTS, DependencyCause, ErrorType
from plugtune.store import Store


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
    store.end_attempt(job, attempt, "failed", error)
    store.set_job_error(job, error, attempt=attempt)
    store.update_job(job, next_retry_at=now + 900, auto_retries=1)
    store.transition(job, "failed", "dependency error")
    html = client.get(f"/jobs/{job}").text
    assert "Dependency error" in html and 'id="failure-owner">dependency<' in html
    assert f'data-countdown-to="{now + 900}"' in html
