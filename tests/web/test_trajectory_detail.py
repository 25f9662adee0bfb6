"""The trajectory list and detail of a real job whose grader gives every reply the same reward
(issue 24, item 13): an advantage-0 trajectory succeeded, so its "no gradient" reason is not shown
as an error; the detail says how each reply ended in words and writes no stray "null"."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from plugtune.jobs.control import create_job
from plugtune.jobs.scheduler import run_job
from plugtune.settings import Settings
from plugtune.store import Store
from plugtune.web import create_app
from tests.jobs.jobkit import make_job
from tests.web.browsing import checked_page, needs_chromium, serving

pytestmark = pytest.mark.slow

CONSTANT = """
from plugtune import grader

@grader
def exact(ctx, sample, trajectory):
    return 1.0
"""


@pytest.fixture(scope="module")
def constant_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, int]]:
    root = tmp_path_factory.mktemp("constant")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PLUGTUNE_HOME", str(root / "state"))
        env.setenv("PLUGTUNE_DATABASE_URL", f"sqlite:///{root / 'state' / 'plugtune.db'}")
        home = Settings.from_env()
        store = Store.open(home.database_url)
        hyper = {"steps": 1, "batch_size": 2, "group_size": 4, "max_new_tokens": 12}
        job_id, invalid = create_job(store, make_job(root / "project", grader=CONSTANT, hyper=hyper))
        assert invalid is None, invalid
        assert run_job(store, home, job_id) == "succeeded", store.get_job(job_id)
        yield store, job_id
        store.close()


def _cells(html: str, name: str) -> list[str]:
    return [c.strip() for c in re.findall(rf'<td class="[^"]*\b{name}\b[^"]*">(.*?)</td>', html, re.S)]


def test_an_advantage_0_trajectory_has_no_error_only_a_no_gradient_reason(
    constant_job: tuple[Store, int],
) -> None:
    store, job_id = constant_job
    html = (
        TestClient(create_app(store), base_url="http://127.0.0.1:8321")
        .get(f"/jobs/{job_id}/trajectories")
        .text
    )
    assert "<th>Error</th>" in html and ">No gradient</th>" in html
    errors, reasons = _cells(html, "error-cause"), _cells(html, "no-gradient")
    assert len(errors) == len(reasons) == 8
    assert errors == [""] * 8  # every trajectory succeeded
    assert all(r.startswith("advantage 0: every scored trajectory of group") for r in reasons), reasons


@pytest.mark.browser
@needs_chromium
def test_the_detail_says_how_the_reply_ended_and_writes_no_null(
    constant_job: tuple[Store, int], browser: Any
) -> None:
    store, job_id = constant_job
    ended = {t.trajectory_id: t.stop_reason for t in store.trajectories(job_id, limit=50)}
    assert set(ended.values()) <= {"stop", "length"} and ended, ended
    words = {"stop": "the model ended its reply", "length": "reply cut at max_new_tokens"}
    with serving(create_app(store)) as base, checked_page(browser, bypass_csp=True) as page:
        for tid, reason in sorted(ended.items())[:4]:
            page.goto(f"{base}/jobs/{job_id}/trajectories?t={tid}")
            page.wait_for_function(f"document.getElementById('detail-id')?.textContent === '{tid}'")
            meta = page.locator("#detail-meta").inner_text()
            assert meta.endswith(words[reason]) and "stop: " not in meta, meta
            texts = page.evaluate(
                "[...document.querySelectorAll('#detail, #trajectory-logs')].flatMap((n) =>"
                " [...n.childNodes].filter((c) => c.nodeType === 3).map((c) => c.textContent.trim()))"
            )
            assert "null" not in texts, texts  # no bare text node beside the sections
            assert "null" not in page.locator("#detail").inner_text().split()
