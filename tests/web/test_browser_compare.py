"""The jobs list (search, filters, pagination, live refresh, picking jobs) and the compare view, in a
real headless Chromium against uvicorn serving the console over a store filled through its API.

``PLUGTUNE_SCREENSHOTS=docs/screenshots pytest tests/web/test_browser_compare.py`` writes the README's
screenshots of the searched jobs list and of the compare view.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from plugtune.store import Store
from plugtune.types import MetricPoint
from plugtune.web import create_app
from plugtune.web.pages import JOBS_PER_PAGE
from tests.web.browsing import needs_chromium, open_page, serving, shot
from tests.web.seed import Seeded, seed

pytestmark = [pytest.mark.browser, needs_chromium]
SWEEP = JOBS_PER_PAGE + 5


@dataclass(frozen=True)
class Console:
    base: str
    store: Store
    seeded: Seeded
    a: int
    b: int


def _trained(store: Store, name: str, lr: float, group_size: int, *, slow: float, timeouts: int) -> int:
    """A finished job with the curves, step times and failed calls a trainer writes."""
    spec = {
        "name": name,
        "model": "tiny",
        "data": {"train": "data/train.jsonl"},
        "hyperparameters": {"lr": lr, "group_size": group_size, "steps": 12},
        "plugins": {"rollout": {"entry": "plugins/rollout.py:solve"}},
    }
    job = store.create_job(name, spec)
    for status in ("validating", "running", "succeeded"):
        store.transition(job, status)
    now = time.time() - 3600
    points = []
    for step in range(1, 13):
        values = {
            "reward/mean": 1 - math.exp(-step * lr * 2e3),
            "loss": 1.0 / (step * lr * 1e5),
            "kl": step * lr * 100,
            "response_length": 30 + step * group_size,
            "time/step_s": slow + (step % 3),
            "plugin/failed_calls/Timeout": float(timeouts if step % 4 == 0 else 0),
            "plugin/failed_calls/500": 1.0 if step == 5 else 0.0,
        }
        points.extend(MetricPoint(now + step * 30, "", k, v, step=step) for k, v in values.items())
    store.add_metrics(job, points)
    store.update_job(job, steps_done=12, steps_total=12)
    return job


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    folder = tmp_path_factory.mktemp("compare")
    store = Store.open(f"sqlite:///{folder / 'plugtune.db'}", retention_days=7)
    seeded = seed(store)
    for i in range(SWEEP):
        store.create_job(f"sweep-{i:03d}", {"model": "tiny", "hyperparameters": {"lr": i}})
    a = _trained(store, "adder-lr1e-4", 1e-4, 4, slow=2.0, timeouts=2)
    b = _trained(store, "adder-lr3e-4", 3e-4, 8, slow=5.0, timeouts=0)
    with serving(create_app(store)) as base:
        yield Console(base, store, seeded, a, b)
    store.close()


def _page(browser: Any, **options: Any) -> Any:
    # bypass_csp: wait_for_function evaluates strings (the CSP itself is asserted in test_pages)
    return open_page(browser, bypass_csp=True, **options)


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    opened = _page(browser)
    yield opened
    opened.context.close()
    assert opened.problems == [], opened.problems


def _ids(page: Any) -> list[int]:
    return [
        int(x)
        for x in page.locator("#jobs tbody tr[data-job]").evaluate_all("rs => rs.map(r => r.dataset.job)")
    ]


def test_search_narrows_the_list_filters_combine_and_the_url_can_be_shared(
    console: Console, page: Any
) -> None:
    page.goto(f"{console.base}/jobs")
    assert len(_ids(page)) == JOBS_PER_PAGE
    page.fill("#job-q", "ADDER")
    page.press("#job-q", "Enter")
    page.wait_for_url("**/jobs?q=ADDER**")
    assert set(_ids(page)) == {console.seeded.failed_job, console.a, console.b}
    assert "3 jobs found" in page.locator(".pager").inner_text()
    page.select_option("#status-filter", "failed")
    page.click("#job-search button[type=submit]")
    page.wait_for_url("**status=failed**")
    assert _ids(page) == [console.seeded.failed_job]
    shared = page.url
    page.goto(f"{console.base}/jobs")
    page.goto(shared)  # the search lives in the URL: the same rows, the same form
    assert _ids(page) == [console.seeded.failed_job]
    assert page.locator("#job-q").input_value() == "ADDER"
    assert page.locator("#status-filter").input_value() == "failed"
    page.goto(f"{console.base}/jobs")
    page.select_option("#cause-filter", "attempt process died")
    page.click("#job-search button[type=submit]")
    assert _ids(page) == [console.seeded.platform_job]
    page.click("#clear-search")
    page.wait_for_url(f"{console.base}/jobs")
    assert len(_ids(page)) == JOBS_PER_PAGE


def test_pagination_moves_forward_and_back_within_the_search(console: Console, page: Any) -> None:
    page.goto(f"{console.base}/jobs?q=sweep")
    first = _ids(page)
    assert len(first) == JOBS_PER_PAGE
    assert f"page 1 of 2 · {SWEEP} jobs found" in page.locator(".pager").inner_text()
    page.click(".pager a[rel=next]")
    page.wait_for_url("**page=2**")
    second = _ids(page)
    assert len(second) == SWEEP - JOBS_PER_PAGE and not set(first) & set(second)
    assert "q=sweep" in page.url and page.locator("#job-q").input_value() == "sweep"
    page.click(".pager a[rel=prev]")
    page.wait_for_url("**page=1**")
    assert _ids(page) == first


def test_the_list_and_steps_done_refresh_without_a_reload(console: Console, page: Any) -> None:
    store, running = console.store, console.seeded.running_job
    page.goto(f"{console.base}/jobs?status=running")
    page.evaluate("window.__same_document = true")
    assert page.locator("#jobs-live").is_visible()  # a job on the page is running
    store.update_job(running, steps_done=7, steps_total=20)
    cell = f'#jobs tr[data-job="{running}"] [data-cell="steps"]'
    page.wait_for_function(f"document.querySelector('{cell}')?.textContent === '7 / 20'", timeout=30_000)
    assert page.evaluate("window.__same_document") is True
    page.goto(f"{console.base}/jobs")  # queued jobs on it: it refreshes too, and shows new jobs
    page.evaluate("window.__same_document = true")
    total = console.store.count_jobs()
    assert page.locator(".pager .muted").inner_text() == f"page 1 of 2 · {total} jobs"
    fresh = store.create_job("arrived-while-watching", {"model": "tiny"})
    page.wait_for_selector(f'#jobs tbody tr[data-job="{fresh}"]', timeout=30_000)
    assert _ids(page)[0] == fresh and len(_ids(page)) == JOBS_PER_PAGE
    assert page.locator(".pager .muted").inner_text() == f"page 1 of 2 · {total + 1} jobs"
    assert page.evaluate("window.__same_document") is True  # no reload happened


def test_a_searched_list_keeps_its_search_when_it_refreshes(console: Console, page: Any) -> None:
    page.goto(f"{console.base}/jobs?q=sweep-00")  # ten queued jobs: the list refreshes every 3 s
    wanted = _ids(page)
    assert len(wanted) == 10 and page.locator("#jobs-live").is_visible()
    fresh = console.store.create_job("not-a-sweep", {"model": "tiny"})
    console.store.update_job(wanted[0], steps_done=2, steps_total=9)
    cell = f'#jobs tr[data-job="{wanted[0]}"] [data-cell="steps"]'
    page.wait_for_function(f"document.querySelector('{cell}')?.textContent === '2 / 9'", timeout=30_000)
    assert _ids(page) == wanted  # the refresh asked the API for the same search
    assert page.locator(f'#jobs tr[data-job="{fresh}"]').count() == 0
    console.store.update_job(wanted[-1], name="sweep-x00")  # it leaves this search (not the sweep)
    page.wait_for_selector(f'#jobs tr[data-job="{wanted[-1]}"]', state="detached", timeout=30_000)
    assert _ids(page) == wanted[:-1]
    assert page.locator(".pager .muted").inner_text() == "page 1 of 1 · 9 jobs found"


def test_compare_two_jobs_from_the_list_shows_both_curves_shares_times_and_the_config_diff(
    console: Console, page: Any
) -> None:
    page.goto(f"{console.base}/jobs?q=adder-lr")
    button = page.locator("#compare-button")
    assert button.is_disabled()
    page.check(f'#jobs tr[data-job="{console.a}"] input.pick')
    assert button.is_disabled() and "pick one more" in page.locator("#compare-hint").inner_text()
    page.check(f'#jobs tr[data-job="{console.b}"] input.pick')
    assert button.is_enabled()
    shot(page, "jobs-search.png")
    asked: list[str] = []
    page.on("request", lambda r: "/api/compare" in r.url and asked.append(r.url))
    button.click()
    page.wait_for_url("**/compare?ids=**")
    page.wait_for_selector('#compare-charts[data-loaded="1"]')
    assert asked == []  # the page carries its curves; finished jobs are not asked again
    for chart in ("reward", "loss", "kl", "response_length"):
        names = page.locator(f'[data-chart="{chart}"] path.series').evaluate_all(
            "ps => ps.map(p => p.dataset.series)"
        )
        assert names == [f"#{console.a} adder-lr1e-4", f"#{console.b} adder-lr3e-4"], chart
    diff = {
        row.get_attribute("data-key"): row.locator("td").all_inner_texts()[1:]
        for row in page.locator("#config-diff tbody tr").all()
    }
    assert diff == {
        "hyperparameters.group_size": ["4", "8"],
        "hyperparameters.lr": ["0.0001", "0.0003"],
        "name": ["adder-lr1e-4", "adder-lr3e-4"],
    }
    causes = page.locator(f'#compare-causes tr[data-job="{console.a}"]').inner_text()
    assert "Timeout: 85.7%" in causes and "500: 14.3%" in causes  # 6 of 7 failed calls timed out
    assert "no failed call" not in causes
    assert "500: 100.0%" in page.locator(f'#compare-causes tr[data-job="{console.b}"]').inner_text()
    mean = page.locator(f'#compare-step-time tr[data-job="{console.b}"] [data-cell="mean"]').inner_text()
    assert mean == "6 s"  # 5 + (step % 3) over 12 steps averages 6
    page.set_viewport_size({"width": 1400, "height": 1300})
    shot(page, "compare.png", full_page=True)


def test_compare_of_a_running_job_draws_its_new_steps_without_a_reload(console: Console, page: Any) -> None:
    running = console.seeded.running_job
    page.goto(f"{console.base}/compare?ids={console.a},{running}")
    page.wait_for_selector('#compare-charts[data-loaded="1"]')
    assert page.locator("#compare-live").is_visible()
    line = f'[data-chart="reward"] path.series[data-series="#{running} live"]'
    before = page.locator(line).get_attribute("d")
    console.store.add_metrics(running, [MetricPoint(time.time(), "", "reward/mean", 0.8, step=2)])
    page.wait_for_function(
        f"document.querySelector('{line}')?.getAttribute('d') !== {before!r}", timeout=30_000
    )
    assert page.locator(line).get_attribute("d").count("L") == 1  # steps 1 and 2


def test_more_than_five_picked_jobs_cannot_be_compared(console: Console, page: Any) -> None:
    page.goto(f"{console.base}/jobs?q=sweep-00")
    boxes = page.locator("#jobs input.pick")
    for i in range(6):
        boxes.nth(i).check()
    assert page.locator("#compare-button").is_disabled()
    assert "6 picked: at most 5 can be compared" in page.locator("#compare-hint").inner_text()
    boxes.nth(0).uncheck()
    assert page.locator("#compare-button").is_enabled()
    page.click("#compare-clear")
    assert page.locator("#compare-button").is_disabled() and boxes.nth(1).is_checked() is False


def test_compare_says_what_is_wrong_with_its_ids(console: Console, page: Any) -> None:
    answer = page.goto(f"{console.base}/compare?ids={console.a}")
    assert answer.status == 400
    assert "compare needs 2 to 5 different jobs, got 1 job" in page.locator("main").inner_text()
    answer = page.goto(f"{console.base}/compare?ids={console.a},987654")
    assert answer.status == 404 and "no job has id 987654" in page.locator("main").inner_text()
    page.problems.clear()  # the browser logs the 400 and the 404


def test_list_job_and_compare_pages_fit_a_phone_in_dark_mode(console: Console, browser: Any) -> None:
    phone = _page(browser, viewport={"width": 390, "height": 844}, color_scheme="dark")
    try:
        for path in (
            "/jobs",
            "/jobs?q=sweep&page=2",
            f"/jobs/{console.a}",
            f"/compare?ids={console.a},{console.b},{console.seeded.failed_job}",
        ):
            phone.goto(console.base + path)
            if path.startswith("/compare"):
                phone.wait_for_selector('#compare-charts[data-loaded="1"]')
            wide = phone.evaluate("document.documentElement.scrollWidth")
            assert wide <= 390, f"{path} is {wide} px wide at 390 px"
            background = phone.evaluate("getComputedStyle(document.body).backgroundColor")
            assert background == "rgb(20, 23, 29)", path  # prefers-color-scheme: dark
        assert phone.problems == [], phone.problems
    finally:
        phone.context.close()
