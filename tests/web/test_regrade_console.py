"""The console's way into re-grades and fixtures on a real job: the trajectory list links the job's
re-grades page, and a trajectory's detail offers its fixture lines (what `plugtune fixture add`
appends) for download."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import run_job
from plugtune.pretest.regrade import fixture_rows
from plugtune.settings import Settings
from plugtune.store import Store
from plugtune.web import create_app
from tests.jobs.jobkit import make_job
from tests.web.browsing import checked_page, needs_chromium, serving

pytestmark = pytest.mark.slow

PARITY = """
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    return float(int(sample.extra["answer"]) % 2 == 0)
"""


@pytest.fixture(scope="module")
def parity_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, int]]:
    root = tmp_path_factory.mktemp("parity")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PLUGTUNE_HOME", str(root / "state"))
        env.setenv("PLUGTUNE_DATABASE_URL", f"sqlite:///{root / 'state' / 'plugtune.db'}")
        home = Settings.from_env()
        store = Store.open(home.database_url)
        hyper = {"steps": 1, "batch_size": 2, "group_size": 2}
        job_id, invalid = create_job(store, make_job(Path(root / "project"), grader=PARITY, hyper=hyper))
        assert invalid is None, invalid
        assert run_job(store, home, job_id) == "succeeded", store.get_job(job_id)
        yield store, job_id
        store.close()


def test_the_trajectory_list_links_the_regrades_page(parity_job: tuple[Store, int]) -> None:
    store, job_id = parity_job
    console = TestClient(create_app(store), base_url="http://127.0.0.1:8321")
    html = console.get(f"/jobs/{job_id}/trajectories").text
    assert f'href="/jobs/{job_id}/regrades" id="regrades-link"' in html
    page = console.get(f"/jobs/{job_id}/regrades")
    assert page.status_code == 200 and "No re-grade stored for this job." in page.text


@pytest.mark.browser
@needs_chromium
def test_a_trajectory_offers_its_fixture_lines(parity_job: tuple[Store, int], browser: Any) -> None:
    store, job_id = parity_job
    tid = store.trajectories(job_id, limit=1)[0].trajectory_id
    with serving(create_app(store)) as base, checked_page(browser, bypass_csp=True) as page:
        page.goto(f"{base}/jobs/{job_id}/trajectories?t={tid}")
        page.wait_for_function(f"document.getElementById('detail-id')?.textContent === '{tid}'")
        link = page.locator("#fixture-line")
        assert link.get_attribute("download") == f"fixture-{tid}.jsonl"
        got = page.request.get(base + str(link.get_attribute("href")))
        assert got.status == 200
        text = got.text()
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines == fixture_rows(store, job_id, tid)
    assert lines[0]["expect"] == store.get_trajectory(job_id, tid).reward  # type: ignore[union-attr]
