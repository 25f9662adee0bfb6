"""Lists that grow without bound are paged: a job's attempts (every manual retry adds one)."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from plugtune.store import Store
from plugtune.types import ErrorRecord
from plugtune.web.pages import ATTEMPTS_ON_JOB_PAGE, ATTEMPTS_PER_PAGE
from tests.web.seed import Seeded

RETRIED = ATTEMPTS_PER_PAGE + 5


def _retried_job(store: Store) -> int:
    job = store.create_job("retried-a-lot", {"model": "tiny"})
    store.transition(job, "running")
    for _ in range(RETRIED):
        number = store.start_attempt(job, pid=1)
        error = ErrorRecord("internal error", "platform", "x", f"died {number}")
        store.end_attempt(job, number, "failed", error)
    return job


def _numbers(html: str) -> list[int]:
    table = html[html.index('id="attempts"') : html.index("</table>", html.index('id="attempts"'))]
    return [int(n) for n in re.findall(r"<tr>\s*<td>(\d+)</td>", table)]


def test_the_job_page_shows_the_newest_attempts_and_links_to_all_of_them(
    client: TestClient, store: Store, seeded: Seeded
) -> None:
    job = _retried_job(store)
    page = client.get(f"/jobs/{job}").text
    assert _numbers(page) == list(range(RETRIED, RETRIED - ATTEMPTS_ON_JOB_PAGE, -1))
    assert f"The newest {ATTEMPTS_ON_JOB_PAGE} of {RETRIED} attempts" in page
    assert f'href="/jobs/{job}/attempts"' in page
    few = client.get(f"/jobs/{seeded.failed_job}").text
    assert _numbers(few) == [1] and 'id="attempts-more"' not in few


def test_the_attempts_page_pages_through_every_attempt(
    client: TestClient, store: Store, seeded: Seeded
) -> None:
    job = _retried_job(store)
    first = client.get(f"/jobs/{job}/attempts")
    assert first.status_code == 200
    assert _numbers(first.text) == list(range(RETRIED, RETRIED - ATTEMPTS_PER_PAGE, -1))
    assert f"page 1 of 2 · {RETRIED} attempts, newest first" in first.text
    second = client.get(f"/jobs/{job}/attempts", params={"page": "2"}).text
    assert _numbers(second) == list(range(RETRIED - ATTEMPTS_PER_PAGE, 0, -1))
    assert 'href="?page=1" rel="prev"' in second
    assert client.get(f"/jobs/{job}/attempts", params={"page": "0"}).status_code == 400
    assert client.get("/jobs/999/attempts").status_code == 404
