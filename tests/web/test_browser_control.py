"""The console as a control plane, in a real headless Chromium against a real ``plugtune serve``
(its scheduler runs the jobs): create a job from the New job page, watch it run to the end without a
reload, cancel a running one from its page, see a broken job.yaml's problems before submitting, and
a failure's banner appear live when the event stream is refused (the page polls instead). The pages
run under the console's own Content-Security-Policy (a violation is a console error, which fails the
test).

``PLUGTUNE_SCREENSHOTS=docs/screenshots pytest tests/web/test_browser_control.py`` writes the README's
screenshots of the New job page and of a running job.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from plugtune.store import Store
from plugtune.web import create_app
from tests.jobs.jobkit import make_job
from tests.web.browsing import checked_page, free_port, needs_chromium, serving, shot
from tests.web.conftest import BASE_URL
from tests.web.seed import seed

JOB_TIMEOUT_MS = 240_000  # a few tiny steps; the machine may be busy
CHECK_TIMEOUT_MS = 120_000  # a dry run (the server's first one imports the trainer)
FAILING_GRADER = """
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    return 1 / 0
"""


def _api(base: str, path: str) -> Any:
    with urllib.request.urlopen(f"{base}{path}", timeout=10) as answer:
        return json.loads(answer.read())


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``plugtune serve`` in its own process (API, console, scheduler) on a free 127.0.0.1 port."""
    folder = tmp_path_factory.mktemp("serve")
    port = free_port()
    env = {**os.environ, "PLUGTUNE_HOME": str(folder / "state")}
    env.pop("PLUGTUNE_API_TOKEN", None)
    env.pop("PLUGTUNE_DATABASE_URL", None)
    log = (folder / "serve.log").open("wb")
    command = [sys.executable, "-c", "from plugtune.cli import app; app()", "serve", "--port", str(port)]
    proc = subprocess.Popen(command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                _api(base, "/api/jobs")
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"plugtune serve did not start: {(folder / 'serve.log').read_text()[-2000:]}")
                time.sleep(0.2)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    # Under the console's own CSP (no inline script, no eval): waits use selectors, not wait_for_function.
    with checked_page(browser, timeout_ms=30_000) as opened:
        yield opened


def _project(root: Path, *, steps: int = 2, grader: str | None = None) -> Path:
    """A tiny job's folder (builtin tiny model, a few rows, rollout and grader) for the folder picker."""
    job_file = make_job(root, hyper={"steps": steps}, **({"grader": grader} if grader else {}))
    spec = yaml.safe_load(job_file.read_text())
    spec["model"] = "builtin:tiny-chat"
    job_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    return root


def _create_from_page(page: Any, base: str, folder: Path) -> int:
    """Pick ``folder`` on the New job page (its job.yaml fills the editor), wait for the check to
    pass, submit; return the id of the job page the browser lands on."""
    page.goto(f"{base}/jobs")
    page.click("#new-job-link")
    page.wait_for_url(f"{base}/jobs/new")
    page.set_input_files("#project-folder", str(folder))
    page.wait_for_selector('#validation-status[data-state="ok"]', timeout=CHECK_TIMEOUT_MS)
    assert "job.yaml" in page.locator("#project-summary").inner_text()
    assert "name: " in page.locator("#spec-text").input_value()
    page.click("#submit-job")
    page.wait_for_url(re.compile(r".*/jobs/\d+$"), timeout=30_000)
    return int(page.url.rsplit("/", 1)[1])


def _wait_status(page: Any, status: str, timeout: int) -> None:
    page.wait_for_selector(f'#job-status:text-is("{status}")', timeout=timeout)


def _mark_loaded(page: Any) -> None:
    page.evaluate("window.__notReloaded = true")


def _assert_not_reloaded(page: Any) -> None:
    assert page.evaluate("window.__notReloaded === true"), "the page reloaded"


def test_new_job_page_renders_without_inline_script_and_the_list_links_to_it(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'plugtune.db'}")
    client = TestClient(create_app(store), base_url=BASE_URL)
    html = client.get("/jobs/new").text
    assert 'id="spec-text"' in html and 'id="project-folder"' in html and "webkitdirectory" in html
    assert 'id="project-archive"' in html and 'accept=".zip,.tar.gz' in html
    assert re.search(r'<script src="[^"]*/static/newjob\.js"', html)
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), "an inline script (the CSP forbids it)"
    assert 'href="/jobs/new"' in client.get("/jobs").text
    job = store.create_job("live", {"model": "tiny"})
    store.transition(job, "running")
    running = client.get(f"/jobs/{job}").text
    assert 'id="cancel-button"' in running and 'id="cancel-bar" hidden' not in running
    store.transition(job, "succeeded")
    assert 'id="cancel-bar" hidden' in client.get(f"/jobs/{job}").text
    store.close()


BROKEN = """\
name: broken
model: builtin:tiny-chat
hyperparameters:
  steps: 0
  batch_size: 2
data:
  train: data/missing.jsonl
plugins:
  rollout:
    entry: plugins/rollout.py:answer
"""


@pytest.mark.browser
@needs_chromium
def test_new_job_page_shows_a_broken_job_yamls_problems_before_submit(
    serve: str, page: Any, tmp_path: Path
) -> None:
    before = _api(serve, "/api/jobs")["total"]
    page.goto(f"{serve}/jobs/new")
    folder = _project(tmp_path / "adder")
    page.set_input_files("#spec-file", str(folder / "job.yaml"))  # alone: its paths are the server's
    page.wait_for_selector('#validation-status[data-state="problems"]', timeout=CHECK_TIMEOUT_MS)
    assert "entry: plugins/rollout.py:answer" in page.locator("#spec-text").input_value()
    assert "data/train.jsonl" in page.locator("#problems").inner_text()
    archive = tmp_path / "adder.tar.gz"
    with tarfile.open(archive, "w:gz") as packed:
        packed.add(folder, arcname="adder")
    page.set_input_files("#project-archive", str(archive))
    page.wait_for_selector('#validation-status[data-state="ok"]', timeout=CHECK_TIMEOUT_MS)
    assert "Archive adder.tar.gz" in page.locator("#project-summary").inner_text()
    page.fill("#spec-text", BROKEN)
    page.wait_for_selector('#validation-status[data-state="problems"]', timeout=CHECK_TIMEOUT_MS)
    rows = page.locator("#problems tbody tr")
    text = page.locator("#problems").inner_text()
    assert rows.count() >= 2, text
    fields = page.locator("#problems tbody td:nth-child(3)").all_inner_texts()
    files = page.locator("#problems tbody td:nth-child(1)").all_inner_texts()
    assert "hyperparameters.steps" in fields, text
    assert "data/missing.jsonl" in files, text
    steps_row = rows.filter(has_text="hyperparameters.steps").first
    assert steps_row.locator("td").nth(0).inner_text().endswith("job.yaml")
    assert steps_row.locator("td").nth(1).inner_text() == "4"  # the line of `steps: 0`
    assert steps_row.locator("td").nth(4).inner_text().strip(), "no hint"
    shot(page, "new-job.png", full_page=True)
    assert _api(serve, "/api/jobs")["total"] == before  # a dry run creates nothing

    fixed = BROKEN.replace("steps: 0", "steps: 1").replace("missing.jsonl", "train.jsonl")
    page.fill("#spec-text", fixed + "  graders:\n    - entry: plugins/grader.py:exact\n")
    page.wait_for_selector('#validation-status[data-state="ok"]', timeout=CHECK_TIMEOUT_MS)
    assert page.locator("#problems").is_hidden()
    assert _api(serve, "/api/jobs")["total"] == before

    page.fill("#spec-text", BROKEN)  # submitted anyway: recorded failed, as `plugtune submit` does
    page.wait_for_selector('#validation-status[data-state="problems"]', timeout=CHECK_TIMEOUT_MS)
    page.click("#submit-job")
    page.wait_for_selector("#submit-status a", timeout=CHECK_TIMEOUT_MS)
    assert page.url == f"{serve}/jobs/new"  # the page stays, with the problems
    recorded = int(page.locator("#submit-status a").get_attribute("href").rsplit("/", 1)[1])
    assert _api(serve, f"/api/jobs/{recorded}")["job"]["status"] == "failed"
    assert page.locator("#problems tbody tr").count() >= 2
    page.problems[:] = [p for p in page.problems if "status of 422" not in p]  # the browser logs each 422


@pytest.mark.slow
@pytest.mark.browser
@needs_chromium
def test_a_job_created_from_the_page_runs_to_the_end_without_reload(
    serve: str, page: Any, tmp_path: Path
) -> None:
    job = _create_from_page(page, serve, _project(tmp_path / "adder", steps=4))
    _mark_loaded(page)
    _wait_status(page, "running", JOB_TIMEOUT_MS)
    page.wait_for_selector('#steps-done:text-matches("^[234] / 4$")', timeout=JOB_TIMEOUT_MS)
    assert page.locator("#job-eta").is_visible()
    page.wait_for_selector('#curves [data-chart="loss"] svg path.series', state="attached")
    assert "first run" in page.locator("#attempts tbody").inner_text()  # the attempt started after load
    shot(page, "job-live.png", full_page=True)
    _wait_status(page, "succeeded", JOB_TIMEOUT_MS)
    _assert_not_reloaded(page)
    assert page.locator("#steps-done").inner_text() == "4 / 4"
    assert page.locator("#job-progress").evaluate("p => [p.value, p.max]") == [4, 4]
    assert page.locator("#job-status-text").inner_text() == "succeeded"
    assert page.locator("#cancel-bar").is_hidden() and page.locator("#job-eta").is_hidden()
    page.wait_for_selector('#curves [data-chart="reward"] svg path.series', state="attached")
    assert _api(serve, f"/api/jobs/{job}")["job"]["status"] == "succeeded"


@pytest.mark.slow
@pytest.mark.browser
@needs_chromium
def test_a_running_job_is_cancelled_from_its_page(serve: str, page: Any, tmp_path: Path) -> None:
    job = _create_from_page(page, serve, _project(tmp_path / "long", steps=200))
    _mark_loaded(page)
    _wait_status(page, "running", JOB_TIMEOUT_MS)
    asked: list[str] = []
    page.once("dialog", lambda d: (asked.append(d.message), d.accept()))
    page.click("#cancel-button")
    _wait_status(page, "cancelled", 60_000)
    _assert_not_reloaded(page)
    assert asked and f"Cancel job {job}?" in asked[0]
    assert page.locator("#cancel-button").is_hidden()
    page.wait_for_selector("#cancelled-panel #retry-button")
    # "job N is stopping: ..." was true until the job ended; it does not stay beside the panel
    assert "stopping" not in page.locator("#cancel-result").inner_text()
    assert page.locator("#cancel-bar").is_hidden()
    assert _api(serve, f"/api/jobs/{job}")["job"]["status"] == "cancelled"


@pytest.mark.slow
@pytest.mark.browser
@needs_chromium
def test_a_failure_banner_appears_live_when_the_event_stream_is_refused(
    serve: str, page: Any, tmp_path: Path
) -> None:
    page.route("**/api/jobs/*/events", lambda route: route.fulfill(status=503, body="down"))
    _create_from_page(page, serve, _project(tmp_path / "crash", grader=textwrap.dedent(FAILING_GRADER)))
    _mark_loaded(page)
    page.wait_for_selector("#live-state >> text=updating every", timeout=30_000)
    page.wait_for_selector("#failure-banner", timeout=JOB_TIMEOUT_MS)
    _assert_not_reloaded(page)
    banner = page.locator("#failure-banner").inner_text()
    assert "Call plugin error" in banner and "ZeroDivisionError" in banner
    assert page.locator("#failure-owner").inner_text() == "plugin"
    assert page.locator('#failure-banner a[href$="/plugins?plugin=exact"]').inner_text() == "exact"
    assert page.locator("#job-status").inner_text() == "failed"
    assert page.locator("#failure-banner #retry-button").count() == 1
    page.problems[:] = [p for p in page.problems if "503" not in p]  # the refused stream is logged


HUGE_GRADER = """
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    return 1e308 if ctx.rollout_index == 0 else 0.0
"""


@pytest.mark.slow
@pytest.mark.browser
@needs_chromium
def test_a_loss_nan_banner_links_its_steps_trajectories_live(serve: str, page: Any, tmp_path: Path) -> None:
    """The live banner (job.js) links a Loss nan step's trajectories, as the server-rendered one does."""
    folder = _project(tmp_path / "nan", grader=textwrap.dedent(HUGE_GRADER))
    spec = yaml.safe_load((folder / "job.yaml").read_text())
    spec["plugins"]["graders"][0]["weight"] = 10.0  # the summed reward overflows to inf
    (folder / "job.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    job = _create_from_page(page, serve, folder)
    _mark_loaded(page)
    page.wait_for_selector("#failure-banner #failure-trajectories", timeout=JOB_TIMEOUT_MS)
    _assert_not_reloaded(page)
    assert "Loss nan" in page.locator("#failure-banner").inner_text()
    ids = _api(serve, f"/api/jobs/{job}")["job"]["error"]["evidence"]["trajectory_ids"]
    links = page.locator("#failure-trajectories a")
    assert links.all_inner_texts() == ids[:10] and ids
    assert links.first.get_attribute("href") == f"/jobs/{job}/trajectories?t={ids[0]}"
    assert page.locator("#failure-trajectories").inner_text().startswith("step 1: ")


@pytest.mark.browser
@needs_chromium
def test_new_job_page_fits_a_phone_in_dark_mode(serve: str, browser: Any, tmp_path: Path) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844}, color_scheme="dark")
    page = context.new_page()
    page.set_default_timeout(30_000)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(f"{serve}/jobs/new")
        page.set_input_files("#project-folder", str(_project(tmp_path / "adder")))
        page.wait_for_selector('#validation-status[data-state="ok"]', timeout=CHECK_TIMEOUT_MS)
        page.fill("#spec-text", BROKEN)
        page.wait_for_selector('#validation-status[data-state="problems"]', timeout=CHECK_TIMEOUT_MS)
        wide = page.evaluate("document.documentElement.scrollWidth")
        assert wide <= 390, f"/jobs/new is {wide} px wide at 390 px"
        editor = page.locator("#spec-text").evaluate("t => getComputedStyle(t).backgroundColor")
        assert editor == "rgb(28, 32, 41)"  # the dark palette's panel colour
    finally:
        context.close()
    assert errors == []


@pytest.mark.browser
@needs_chromium
def test_a_job_waiting_for_its_automatic_retry_is_cancelled_from_its_page(tmp_path: Path, page: Any) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'plugtune.db'}", retention_days=7)
    seeded = seed(store)
    with serving(create_app(store)) as base:
        page.goto(f"{base}/jobs/{seeded.platform_job}")
        _mark_loaded(page)
        assert page.locator("#retry-countdown").is_visible() and page.locator("#cancel-button").is_visible()
        page.once("dialog", lambda d: d.accept())
        page.click("#cancel-button")
        _wait_status(page, "cancelled", 30_000)
        page.wait_for_selector("#cancelled-panel")
        _assert_not_reloaded(page)
        assert page.locator("#retry-countdown").count() == 0  # no automatic retry is coming
        assert page.locator("#retry-button").count() == 1 and page.locator("#cancel-button").is_hidden()
        watching: list[tuple[float, str]] = []  # (when, url) of each stream or API read

        def read(request: Any) -> None:
            if "/events" in request.url or "/api/" in request.url:
                watching.append((time.monotonic(), request.url))

        page.on("request", read)
        # the last reads of the ended job: until 2.5 s pass without one (not a fixed 2.5 s, which a
        # busy machine's late last read could outlast), 60 s at most
        quiet_since, deadline = time.monotonic(), time.monotonic() + 60
        while time.monotonic() - max([quiet_since] + [when for when, _ in watching]) < 2.5:
            assert time.monotonic() < deadline, f"the page kept reading: {watching[-5:]}"
            page.wait_for_timeout(250)
        ended = len(watching)
        page.wait_for_timeout(5000)  # past the stream's 2 s reconnect delay
        assert watching[ended:] == [], "still watching an ended job"
        page.goto("about:blank")
    job = store.get_job(seeded.platform_job)
    assert job is not None and job.status == "cancelled" and job.next_retry_at is None
    store.close()


@pytest.mark.browser
@needs_chromium
def test_the_job_page_reconnects_when_its_event_stream_drops(tmp_path: Path, page: Any) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'plugtune.db'}", retention_days=7)
    seeded = seed(store)
    streams: list[str] = []

    def drop_the_first(route: Any) -> None:
        streams.append(route.request.url)
        if len(streams) == 1:
            route.abort("connectionreset")
        else:
            route.continue_()

    page.route("**/api/jobs/*/events", drop_the_first)
    with serving(create_app(store)) as base:
        page.goto(f"{base}/jobs/{seeded.running_job}")
        _mark_loaded(page)
        page.wait_for_selector('#live-state:text-is("live")', timeout=30_000)  # the second stream
        store.update_job(seeded.running_job, steps_done=1)
        page.wait_for_selector('#steps-done:text-is("1")', timeout=30_000)
        store.transition(seeded.running_job, "succeeded")
        _wait_status(page, "succeeded", 30_000)
        _assert_not_reloaded(page)
        assert len(streams) == 2, streams
        page.goto("about:blank")
    page.problems[:] = [p for p in page.problems if "ERR_CONNECTION_RESET" not in p]
    store.close()
