"""In a real Chromium, after a real job: the job page draws each plugin's ``ctx.metric`` curves
under a heading of its own, and the trajectory detail lists the trajectory's own values, with a
plugin's metric names shown as text (issue 24, item 2)."""

from __future__ import annotations

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
from tests.web.browsing import checked_page, needs_chromium, serving, shot

pytestmark = [pytest.mark.browser, pytest.mark.slow, needs_chromium]

HOSTILE = "<img src=x onerror=alert(1)>"
GRADER = f"""
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    ctx.metric("chars", len(trajectory.completion))
    ctx.metric({HOSTILE!r}, 1.0)
    return 1.0 if trajectory.completion.strip() == sample.extra["answer"] else 0.0
"""
ROLLOUT = """
from plugtune import rollout

@rollout
def answer(ctx, policy, sample):
    policy.chat(sample.messages, temperature=1.0, max_tokens=sample.sampling.max_tokens)
    ctx.metric("turns", 1)
    return None
"""


@pytest.fixture()
def page(browser: Any) -> Iterator[Any]:
    with checked_page(browser, bypass_csp=True, dialogs_fail=True) as opened:
        yield opened


def test_the_job_page_has_a_section_per_plugin_and_the_detail_its_values(
    tmp_path: Path, home: Settings, page: Any
) -> None:
    store = Store.open(home.database_url)
    try:
        job_id, invalid = create_job(store, make_job(tmp_path / "effects", rollout=ROLLOUT, grader=GRADER))
        assert invalid is None, invalid
        assert run_job(store, home, job_id) == "succeeded"
        with serving(create_app(store)) as base:
            page.goto(f"{base}/jobs/{job_id}")
            page.wait_for_selector("#curves h3.chart-section")
            headings = page.locator("#curves h3.chart-section").all_inner_texts()
            assert headings == ["Plugin answer — ctx.metric per step", "Plugin exact — ctx.metric per step"]
            # each heading is followed by its plugin's charts, each with its mean, min and max lines
            assert page.locator('#curves [data-chart="metric:exact:chars"] svg path.series').count() == 3
            order = page.evaluate(
                "[...document.getElementById('curves').children].map(n => n.dataset.section"
                " || n.querySelector('[data-chart]')?.dataset.chart || '')"
            )
            exact = order.index("Plugin exact")
            assert order.index("metric:answer:turns") < exact < order.index("metric:exact:chars")
            assert HOSTILE in page.locator("#curves").inner_text()  # a metric name is text
            assert page.locator("#curves img").count() == 0
            shot(page, "plugin-metrics.png", full_page=True)

            tid = store.trajectories(job_id, limit=1)[0].trajectory_id
            page.goto(f"{base}/jobs/{job_id}/trajectories?t={tid}")
            page.wait_for_selector("#trajectory-metrics")
            listed = page.locator("#trajectory-metrics dt").all_inner_texts()
            assert {"turns", "exact/chars", f"exact/{HOSTILE}"} <= set(listed)
            assert page.locator("#detail img").count() == 0
    finally:
        store.close()
