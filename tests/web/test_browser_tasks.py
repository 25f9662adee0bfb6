"""A multi-task job's per-task curves (issue 27 item 5) in a real headless Chromium: the job page
draws reward, failures and signal health with one series per task, and compare one per job and
task, with no page or console error."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from plugtune.store import Store
from plugtune.types import MetricPoint
from plugtune.web import create_app
from tests.web.browsing import checked_page, needs_chromium, serving

pytestmark = [pytest.mark.browser, needs_chromium]

TASKS = {"math": 1.0, "code": 0.0}


def _mixed(store: Store, name: str) -> int:
    """A finished two-task job with the metrics the trainer writes per task."""
    job = store.create_job(name, {"name": name, "model": "tiny", "tasks": {t: {} for t in TASKS}})
    for status in ("validating", "running", "succeeded"):
        store.transition(job, status)
    now = time.time() - 600
    points = []
    for step in (1, 2, 3):
        values = {"reward/mean": 0.5, "loss": 0.1}
        for task, reward in TASKS.items():
            values[f"task/{task}/reward/mean"] = reward
            values[f"task/{task}/trajectories/failed"] = 2.0 if task == "code" else 0.0
            values[f"task/{task}/plugin/errors/500"] = 2.0 if task == "code" else 0.0
            values[f"task/{task}/groups/zero_variance_share"] = 1.0
        points += [MetricPoint(now + step, "", k, v, step=step) for k, v in values.items()]
    store.add_metrics(job, points)
    store.update_job(job, steps_done=3, steps_total=3)
    return job


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, int]]:
    folder = tmp_path_factory.mktemp("tasks")
    store = Store.open(f"sqlite:///{folder / 'plugtune.db'}", retention_days=7)
    a, b = _mixed(store, "mix-a"), _mixed(store, "mix-b")
    with serving(create_app(store)) as base:
        yield base, a, b
    store.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    with checked_page(browser, bypass_csp=True, dialogs_fail=True) as opened:
        yield opened


def _series(page: Any, chart: str) -> list[str]:
    return page.locator(f'[data-chart="{chart}"] path.series').evaluate_all(
        "ps => ps.map(p => p.dataset.series)"
    )


def test_the_job_page_draws_a_series_per_task(served: tuple[str, int, int], page: Any) -> None:
    base, a, _ = served
    page.goto(f"{base}/jobs/{a}")
    page.wait_for_selector('#curves [data-chart="task_reward"] svg path.series', state="attached")
    assert sorted(_series(page, "task_reward")) == ["code", "math"]
    assert sorted(_series(page, "task_failures")) == [
        "code: failed",
        "code: failed: 500",
        "math: failed",
        "math: failed: 500",
    ]
    assert sorted(_series(page, "task_signal")) == [
        "code: groups/zero_variance_share",
        "math: groups/zero_variance_share",
    ]


def test_compare_draws_a_series_per_job_and_task(served: tuple[str, int, int], page: Any) -> None:
    base, a, b = served
    page.goto(f"{base}/compare?ids={a},{b}")
    page.wait_for_selector('#compare-charts[data-loaded="1"]')
    assert sorted(_series(page, "task_reward")) == sorted(
        f"#{job} {name} · {task}" for job, name in ((a, "mix-a"), (b, "mix-b")) for task in TASKS
    )
