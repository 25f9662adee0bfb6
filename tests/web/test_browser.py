"""End to end in a real headless Chromium (Debian's), against uvicorn serving the console.

The README's screenshots come from these tests: ``PLUGTUNE_SCREENSHOTS=docs/screenshots pytest
tests/web/test_browser.py`` writes them there (otherwise they go to a temp folder).
"""

from __future__ import annotations

import io
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plugtune.store import Store
from plugtune.types import LogLine
from plugtune.web import create_app
from tests.web.browsing import checked_page, needs_chromium, serving, shot
from tests.web.seed import DISCARD_REASON, GRADER_CODE, XSS_IMG, XSS_SCRIPT, Seeded, seed

pytestmark = [pytest.mark.browser, needs_chromium]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Store, Seeded]]:
    folder = tmp_path_factory.mktemp("console")
    store = Store.open(f"sqlite:///{folder / 'plugtune.db'}", retention_days=7)
    seeded = seed(store)
    with serving(create_app(store)) as base:
        yield base, store, seeded
    store.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    # Without the CSP, injected markup that escaped escaping would run: the dialog check then tests
    # the escaping itself (the CSP is asserted in test_pages). wait_for_function needs it too.
    with checked_page(browser, accept_downloads=True, bypass_csp=True, dialogs_fail=True) as opened:
        yield opened


def test_failed_job_banner_plugin_tab_range_download_and_logs(
    served: tuple[str, Store, Seeded], page: Any
) -> None:
    base, _, seeded = served
    job = seeded.failed_job
    page.goto(f"{base}/jobs")
    shot(page, "jobs.png")
    page.click(f'tr[data-job="{job}"] a')
    banner = page.locator("#failure-banner")
    banner.wait_for()
    assert "Call plugin error" in banner.inner_text()
    assert page.locator("#failure-owner").inner_text() == "plugin"
    assert "The plugin raised an exception" in page.locator("#failure-hint").inner_text()
    page.wait_for_selector("#curves .chart svg path.series")
    page.hover('[data-chart="reward"] svg rect')
    assert page.locator('[data-chart="reward"] .hover-label').text_content().startswith("step ")
    shot(page, "job-failed.png", full_page=True)

    page.click("text=Plugins")
    page.wait_for_selector("#plugin-charts .chart svg path.series")
    assert page.locator("#plugin-name").inner_text() == "solve"
    page.select_option("#plugin-select", "exact")
    page.wait_for_url("**/plugins?plugin=exact**")
    assert page.locator("#plugin-status").inner_text() == "failed"
    assert "ZeroDivisionError" in page.locator("#failure-reason").inner_text()
    assert page.locator("tr.failed-line td.ln").inner_text() == "8"
    page.wait_for_selector("#plugin-charts .chart svg path.series")
    one_hour = page.locator('[data-chart="exec_qps"] path.series').get_attribute("d")

    page.click('#range-toolbar button[data-range="3h"]')
    page.wait_for_function("document.getElementById('plugin-charts').dataset.loadedRange === '3h'")
    assert "range=3h" in page.url
    assert page.locator('[data-chart="exec_qps"] path.series').get_attribute("d") != one_hour
    assert page.locator(".chart").count() == 8
    shot(page, "plugin-tab.png", full_page=True)

    with page.expect_download() as download_info:
        page.click("#download-code")
    download = download_info.value
    assert download.suggested_filename == "exact-h-grader-1.zip"
    with zipfile.ZipFile(io.BytesIO(Path(download.path()).read_bytes())) as archive:
        assert archive.read("exact-h-grader-1/plugins/grader.py") == GRADER_CODE

    page.click("#view-logs")
    page.wait_for_url(f"**/jobs/{job}/logs?plugin=exact")
    assert page.locator("#log-plugin").input_value() == "exact"
    plugins = page.locator("#log-table tbody tr td:nth-child(3)").all_inner_texts()
    assert plugins and set(plugins) == {"exact"}
    assert f"grader crashed {XSS_IMG}" in page.locator("#log-table").inner_text()
    shot(page, "logs.png", full_page=True)


def test_failed_trajectory_logs_fullscreen_keys_and_escaping(
    served: tuple[str, Store, Seeded], page: Any
) -> None:
    base, _, seeded = served
    page.goto(f"{base}/jobs/{seeded.failed_job}/trajectories")
    page.click('#trajectory-list tr[data-id="s2-g1-r2"] td:nth-child(2)')
    page.wait_for_function("document.getElementById('detail-id')?.textContent === 's2-g1-r2'")
    assert page.locator("#trajectory-logs").evaluate("d => d.open") is True
    assert "grader crashed" in page.locator("#trajectory-logs").inner_text()
    detail = page.locator("#detail").inner_text()
    assert f"{XSS_SCRIPT} {XSS_IMG} The answer is 42." in detail  # shown as text, never run
    assert page.locator("#detail script, #detail img").count() == 0
    assert "→ calculator(" in detail and "ZeroDivisionError" in detail
    page.set_viewport_size({"width": 1400, "height": 1300})  # the sticky detail panel is viewport-high
    shot(page, "trajectory-failed.png")
    page.set_viewport_size({"width": 1400, "height": 900})
    page.select_option("#log-plugin-filter", "solve")
    assert set(page.locator("#trajectory-logs tbody tr td:nth-child(3)").all_inner_texts()) == {"solve"}

    page.click("#fullscreen-toggle")
    page.wait_for_function("document.getElementById('detail').classList.contains('fullscreen')")
    page.keyboard.press("ArrowDown")
    page.wait_for_function("document.getElementById('detail-id').textContent === 's2-g1-r1'")
    assert page.locator("#trajectory-logs").evaluate("d => d.open") is True  # discarded: expanded
    assert page.locator("#discard-reason").inner_text() == f"No gradient: {DISCARD_REASON}"
    page.keyboard.press("ArrowDown")
    page.wait_for_function("document.getElementById('detail-id').textContent === 's2-g1-r0'")
    assert page.locator("#trajectory-logs").evaluate("d => d.open") is False  # success: on demand
    shot(page, "trajectory-fullscreen.png")
    page.click("#traj-prev")
    page.wait_for_function("document.getElementById('detail-id').textContent === 's2-g1-r1'")
    page.keyboard.press("ArrowUp")
    page.wait_for_function("document.getElementById('detail-id').textContent === 's2-g1-r2'")
    assert page.evaluate("document.getElementById('detail').classList.contains('fullscreen')")
    assert page.evaluate("!document.fullscreenElement || document.fullscreenElement.id === 'detail'")
    assert "t=s2-g1-r2" in page.url

    page.goto(f"{base}/jobs/{seeded.failed_job}/groups/g1")
    assert XSS_SCRIPT in page.locator("#group-view").inner_text()
    shot(page, "group.png", full_page=True)


def test_live_tail_shows_new_lines_while_the_job_runs(served: tuple[str, Store, Seeded], page: Any) -> None:
    base, store, seeded = served
    page.goto(f"{base}/jobs/{seeded.running_job}/logs")
    assert page.locator("#live-tail").is_checked()
    store.add_logs(seeded.running_job, [LogLine(time.time(), "WARNING", "solve", f"tailed {XSS_SCRIPT}")])
    page.wait_for_selector("#log-table tbody tr:first-child >> text=tailed", timeout=30_000)
    assert f"tailed {XSS_SCRIPT}" in page.locator("#log-table tbody tr").first.inner_text()


def test_token_protected_console_login_retry_and_logout(tmp_path: Path, browser: Any, page: Any) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'plugtune.db'}", retention_days=7)
    seeded = seed(store)
    with serving(create_app(store, api_token="browser-token")) as base:
        refused = page.goto(f"{base}/jobs/{seeded.failed_job}")
        assert refused.status == 401 and page.locator("#token-input").count() == 1
        page.problems.clear()  # the browser logs the expected 401s
        page.fill("#token-input", "not-the-token")
        page.click("#login-form button[type=submit]")
        page.wait_for_selector("#login-error")
        assert page.locator("#login-error").inner_text() == "the API token is wrong"
        page.problems.clear()
        page.fill("#token-input", "browser-token")
        page.click("#login-form button[type=submit]")
        page.wait_for_selector("#failure-banner")
        assert page.url == f"{base}/jobs/{seeded.failed_job}"  # back where it was, no token in the URL
        cookies = {c["name"]: c for c in page.context.cookies()}
        assert cookies["plugtune_session"]["httpOnly"] and cookies["plugtune_session"]["sameSite"] == "Strict"
        assert "browser-token" not in cookies["plugtune_session"]["value"]
        page.goto(f"{base}/jobs/{seeded.failed_job}/plugins")
        page.wait_for_selector("#plugin-charts .chart svg path.series")  # the JSON API took the cookie
        page.goto(f"{base}/jobs/{seeded.failed_job}")
        page.click("#retry-button")  # the form carries the CSRF token
        page.wait_for_selector("#flash")
        assert store.get_job(seeded.failed_job).status == "queued"  # type: ignore[union-attr]
        page.click("#logout-button")
        page.wait_for_url(f"{base}/login")
        assert page.locator("#token-input").count() == 1
        assert page.goto(f"{base}/jobs").status == 401
        page.problems.clear()
    store.close()


ATTACKER_PAGE = """<!doctype html><html><body>
<form id="f" method="post" action="{target}"><input name="x" value="1"></form>
<script>document.getElementById("f").submit();</script></body></html>"""


def test_a_page_on_another_port_cannot_retry_a_job(tmp_path: Path, page: Any) -> None:
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse
    from starlette.routing import Route

    store = Store.open(f"sqlite:///{tmp_path / 'plugtune.db'}", retention_days=7)
    seeded = seed(store)
    with serving(create_app(store)) as console:
        target = f"{console}/jobs/{seeded.failed_job}/retry"
        evil = Starlette(routes=[Route("/", lambda _: HTMLResponse(ATTACKER_PAGE.format(target=target)))])
        with serving(evil) as attacker:  # same site (127.0.0.1) to the browser, another origin
            with page.expect_response(target) as answer:
                page.goto(attacker)
            assert answer.value.status == 403
            assert "cross-origin request refused" in page.locator("main").inner_text()
            page.problems.clear()  # the browser logs the 403
    assert store.get_job(seeded.failed_job).status == "failed"  # type: ignore[union-attr]
    store.close()


def test_phone_width_dark_mode_long_lines_and_bidi(served: tuple[str, Store, Seeded], browser: Any) -> None:
    base, store, seeded = served
    job = store.create_job("loud", {"model": "tiny"})
    huge = "y" * 100_000
    store.add_logs(job, [LogLine(time.time(), "INFO", "solve", f"big {huge}")])
    store.add_logs(job, [LogLine(time.time(), "INFO", "solve", "saved photo_\u202egnp.exe")])
    # bypass_csp: wait_for_function evaluates a string (the CSP itself is asserted in test_pages)
    context = browser.new_context(
        viewport={"width": 390, "height": 844}, color_scheme="dark", bypass_csp=True
    )
    page = context.new_page()
    page.set_default_timeout(30_000)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        for path in (
            "/jobs",
            f"/jobs/{seeded.failed_job}",
            f"/jobs/{seeded.failed_job}/plugins",
            f"/jobs/{job}/logs",
            f"/jobs/{seeded.failed_job}/trajectories",
            "/functions",
        ):
            page.goto(base + path)
            wide = page.evaluate("document.documentElement.scrollWidth")
            assert wide <= 390, f"{path} is {wide} px wide at 390 px"
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(20, 23, 29)"  # the dark palette follows prefers-color-scheme
        page.goto(f"{base}/jobs/{job}/logs")
        cells = page.locator("#log-table td.msg-text")
        assert "photo_⟨U+202E⟩gnp.exe" in cells.nth(0).inner_text()  # never reads as "exe.png"
        tall = page.evaluate("document.documentElement.scrollHeight")
        assert tall < 5000, f"a 100 KB line made the page {tall} px tall"
        shot(page, "logs-phone-dark.png", full_page=True)
        cells.nth(1).locator("button.show-more").click()
        page.wait_for_function(
            "(document.querySelectorAll('#log-table td.msg-text')[1]?.textContent.length ?? 0) > 100000"
        )
        assert cells.nth(1).inner_text().endswith("y" * 50)
        page.goto(f"{base}/jobs/{seeded.failed_job}")
        shot(page, "job-phone-dark.png", full_page=True)
    finally:
        context.close()
    assert errors == []
