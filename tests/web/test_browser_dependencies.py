"""In a real Chromium, after a real job whose grader calls a judge on 127.0.0.1 (issue 26.6): the
Plugin tab has a panel for the declared judge (its URL and budget) with its requests/s, latency,
errors by cause, budget in use and 429 share over the tab's ranges; the rollout, which calls
nothing, has its panel too, with no request; a job that declares nothing says so."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import run_job
from plugtune.settings import Settings
from plugtune.store import Store
from plugtune.web import create_app
from tests.jobs.jobkit import make_job
from tests.judge_server import judge
from tests.web.browsing import checked_page, needs_chromium, serving, shot

pytestmark = [pytest.mark.browser, pytest.mark.slow, needs_chromium]

FLAKY = """
import httpx
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    # each trajectory's first request is answered 429 (Retry-After: 1), the next 200
    reply = httpx.post("{url}/flaky/" + ctx.trajectory_id + "/1", json={{}}, timeout=15)
    reply.raise_for_status()
    return float(reply.json()["score"])
"""
CHARTS = ["requests", "latency", "errors", "budget", "rate_limited"]


@pytest.fixture()
def page(browser: Any) -> Iterator[Any]:
    with checked_page(browser, bypass_csp=True, dialogs_fail=True) as opened:
        yield opened


def test_the_plugin_tab_shows_the_judge_it_called_with_its_requests_and_429_share(
    tmp_path: Path, home: Settings, page: Any
) -> None:
    store = Store.open(home.database_url)
    try:
        with judge() as server:
            port = server.server_address[1]
            url = f"http://127.0.0.1:{port}"
            job_file = make_job(
                tmp_path / "judged",
                grader=FLAKY.format(url=url),
                hyper={"steps": 1, "batch_size": 4, "group_size": 2},
                extra={"dependencies": {"judge": {"url": url, "rpm": 600, "concurrency": 4}}},
            )
            job_id, invalid = create_job(store, job_file)
            assert invalid is None, invalid
            assert run_job(store, home, job_id) == "succeeded"
            asked = server.requests  # type: ignore[attr-defined]
        assert asked == 16  # 8 trajectories, a 429 then a 200 each
        with serving(create_app(store)) as base:
            page.goto(f"{base}/jobs/{job_id}/plugins?plugin=exact")
            panel = page.locator('#plugin-dependencies section[data-dependency="judge"]')
            panel.wait_for()
            assert panel.locator(".dep-name").inner_text() == "judge"
            assert panel.locator(".dep-url").inner_text() == url
            assert panel.locator(".dep-budget").inner_text() == "rpm 600 · concurrency 4"
            for key in CHARTS:  # every chart drawn, none empty
                assert panel.locator(f'[data-chart="dep:judge:{key}"] svg path.series').count() >= 1, key
            summary = panel.locator(".dep-summary").inner_text()
            found = re.fullmatch(
                r"In this range: up to ([\d.]+) requests/s · ([\d.]+)% of requests rate limited \(429\)"
                r" · p99 up to ([\d.]+) ms\.",
                summary,
            )
            assert found, summary
            assert float(found[1]) > 0
            assert 20 <= float(found[2]) <= 80, summary  # half the requests were answered 429
            assert float(found[3]) > 0
            causes = panel.locator('[data-chart="dep:judge:errors"] path.series')
            drawn = [causes.nth(i).get_attribute("data-series") for i in range(causes.count())]
            assert "rate limited" in drawn, drawn
            shot(page, "plugin-dependencies.png", full_page=True)

            page.locator('#range-toolbar [data-range="1h"]').click()
            page.wait_for_function("document.getElementById('plugin-charts').dataset.loadedRange === '1h'")
            assert "rate limited (429)" in panel.locator(".dep-summary").inner_text()

            page.goto(f"{base}/jobs/{job_id}/plugins?plugin=answer")  # the rollout: declared, not called
            rollout = page.locator('#plugin-dependencies section[data-dependency="judge"]')
            rollout.wait_for()
            assert rollout.locator(".dep-summary").inner_text() == "No request in this range."
    finally:
        store.close()


def test_a_plugin_without_dependencies_says_how_to_declare_one(
    tmp_path: Path, home: Settings, page: Any
) -> None:
    store = Store.open(home.database_url)
    try:
        job_id, invalid = create_job(store, make_job(tmp_path / "plain", hyper={"steps": 1}))
        assert invalid is None, invalid
        assert run_job(store, home, job_id) == "succeeded"
        with serving(create_app(store)) as base:
            page.goto(f"{base}/jobs/{job_id}/plugins")
            empty = page.locator("#plugin-dependencies #no-dependencies")
            empty.wait_for()
            assert "declares no dependency" in empty.inner_text()
            assert "job.yaml dependencies:" in empty.inner_text()
            assert page.locator("#plugin-dependencies section").count() == 0
    finally:
        store.close()
