"""In a real Chromium: the trajectory detail's Tokens view of a 4,000-token reply (issue 27, item 4).

The job page's logprob_gap warning links the trajectory's token view; the view opens within a bound
(drawing the first block of tokens only, the rest as they near the viewport), colours policy-sampled
and tool tokens apart and each policy token by its trainer-vs-sampler gap, lists the largest gaps
with links that draw and show the token, marks the span a history rewrite cut and the truncation
point, and shows a tool's hostile HTML as text."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from plugtune.demo import MODEL_DIR
from plugtune.jobs.control import create_job
from plugtune.jobs.report import JOB_WARNINGS
from plugtune.store import Store
from plugtune.types import DroppedSpan, LogLine, TrajectoryRecord
from plugtune.web import create_app
from tests.jobs.jobkit import make_job
from tests.web.browsing import checked_page, needs_chromium, serving, shot

pytestmark = [pytest.mark.browser, pytest.mark.slow, needs_chromium]

HOSTILE = "<script>alert(1)</script><img src=x onerror=alert(1)>"
LENGTH = 4000
FAR, MID = 3000, 1000  # policy tokens the trainer scored far from (gap 2.5) and near (0.3) the sampler
CUT_AT = 1500  # where a history rewrite cut tokens
#: Generous: from navigation to the drawn view takes ~0.3 s on an idle machine (see the report), but
#: this suite shares two cores with others; a view that drew all 4,000 tokens at once took longer.
READY_BOUND_MS = 10_000


def _long_record(hostile: list[int], words: list[int]) -> TrajectoryRecord:
    """A tool reply with hostile HTML, then runs of 200 policy tokens and 50 tool tokens."""
    mask = [0] * len(hostile) + [1 if (i // 50) % 5 else 0 for i in range(LENGTH - len(hostile))]
    mask[FAR] = mask[MID] = 1
    ids = hostile + [words[i % len(words)] for i in range(LENGTH - len(hostile))]
    sampler = [-1.0 if m else 0.0 for m in mask]
    trainer = [(-1.0 - 1e-4) if m else 0.0 for m in mask]
    trainer[FAR], trainer[MID] = -3.5, -1.3
    return TrajectoryRecord(
        trajectory_id="long-r0",
        group_id="long",
        step=1,
        sample_index=0,
        rollout_index=0,
        attempt=1,
        policy_version=0,
        prompt_ids=[1, 2, 3],
        response_ids=ids,
        response_mask=mask,
        response_logprobs=sampler,
        messages=[{"role": "user", "content": "a long one"}, {"role": "assistant", "content": "..."}],
        reward=0.5,
        advantage=0.5,
        stop_reason="length",
        trainer_logprobs=trainer,
        dropped_spans=[DroppedSpan(at=CUT_AT, tokens=120, policy_tokens=100, rewrite=1)],
    )


@pytest.fixture()
def page(browser: Any) -> Iterator[Any]:
    with checked_page(browser, bypass_csp=False, dialogs_fail=True) as opened:
        yield opened


def test_a_4000_token_reply_in_the_token_view(tmp_path: Path, page: Any) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'plugtune.db'}")
    try:
        job_id, invalid = create_job(store, make_job(tmp_path / "long", hyper={"max_new_tokens": 4096}))
        assert invalid is None, invalid
        tokenizer = AutoTokenizer.from_pretrained(str(MODEL_DIR), local_files_only=True)
        hostile = tokenizer.encode(HOSTILE, add_special_tokens=False)
        words = tokenizer.encode("Let me add the numbers one at a time.\n", add_special_tokens=False)
        short = dataclasses.replace(
            _long_record(hostile, words),
            trajectory_id="short-r0",
            response_ids=words[:3],
            response_mask=[1, 1, 0],
            response_logprobs=[-0.1, -0.2, 0.0],
            trainer_logprobs=[],
            dropped_spans=[],
            stop_reason="stop",
        )
        store.upsert_trajectories(job_id, [short])  # older: below the long one in the list
        store.upsert_trajectories(job_id, [_long_record(hostile, words)])
        warning = (
            "step 1: logprob_gap is 0.02, above the 0.001 that numerical noise explains: training is "
            "off-policy. Likely cause: ... Example trajectories: long-r0."
        )
        store.add_logs(job_id, [LogLine(time.time(), "WARNING", JOB_WARNINGS, warning)])
        with serving(create_app(store)) as base:
            page.goto(f"{base}/jobs/{job_id}")
            link = page.locator("#job-warnings a", has_text="long-r0")
            assert link.get_attribute("href") == f"/jobs/{job_id}/trajectories?t=long-r0&view=tokens"
            link.click()
            page.wait_for_selector("#token-view[data-ready]", timeout=READY_BOUND_MS)
            ready_ms = int(page.locator("#token-view").get_attribute("data-ready-ms"))
            assert ready_ms < READY_BOUND_MS, f"the token view was ready {ready_ms} ms after navigation"
            print(f"token view of {LENGTH} tokens ready {ready_ms} ms after navigation")
            assert page.locator("#token-view").evaluate("d => d.open")
            # only the first block is drawn; the others wait for the viewport
            drawn = page.locator("#token-body .tok").count()
            assert 0 < drawn <= 400, drawn
            summary = page.locator("#token-summary").inner_text()
            assert summary.startswith("4,000 tokens · ") and "policy-sampled" in summary

            # a tool's hostile HTML is text, token by token
            texts = page.evaluate(
                f"[...Array({len(hostile)}).keys()].map(i => document.getElementById('tok-' + i).textContent)"
            )
            assert "".join(texts).replace("·", " ") == HOSTILE
            assert page.locator("#token-view script, #token-view img").count() == 0

            # the mask: tool tokens and policy tokens look apart
            first_policy = next(i for i in range(len(hostile), LENGTH) if (i - len(hostile)) // 50 % 5)
            tool = page.locator("#tok-0")
            policy = page.locator(f"#tok-{first_policy}")
            assert "env" in tool.get_attribute("class").split()
            assert {"pol", "gap-0"} <= set(policy.get_attribute("class").split())
            colour = "e => getComputedStyle(e).backgroundColor"
            assert tool.evaluate(colour) != policy.evaluate(colour)
            assert policy.evaluate(colour) == "rgb(229, 245, 236)"  # gap below 0.001: noise

            # the largest gaps (above float noise), largest first, each a link that draws and shows it
            items = page.locator("#token-gaps li")
            assert items.count() == 2
            assert items.nth(0).inner_text().startswith(f"#{FAR} ") and "gap 2.5" in items.nth(0).inner_text()
            assert items.nth(1).inner_text().startswith(f"#{MID} ")
            assert page.locator(f"#tok-{FAR}").count() == 0  # not drawn yet
            items.nth(0).locator("a").click()
            far = page.locator(f"#tok-{FAR}")
            far.wait_for()
            assert {"pol", "gap-5"} <= set(far.get_attribute("class").split())
            assert far.evaluate(colour) != policy.evaluate(colour)
            assert "sampler -1 · trainer -3.5 · gap 2.5" in far.get_attribute("title")
            assert far.evaluate(
                "e => { const r = e.getBoundingClientRect(), b = document.getElementById('token-body')"
                ".getBoundingClientRect(); return r.top >= b.top && r.bottom <= b.bottom; }"
            )
            page.locator("#token-gaps li").nth(1).locator("a").click()
            assert "gap-3" in page.locator(f"#tok-{MID}").get_attribute("class").split()

            # the span a history rewrite cut, marked where it was
            page.locator("#token-dropped a").click()
            marker = page.locator("#tok-drop-1")
            assert "cut 120 tokens here (100 policy-sampled" in marker.inner_text()
            assert marker.evaluate("e => e.nextElementSibling.id") == f"tok-{CUT_AT}"

            # the truncation point, after the last token
            cut = page.locator("#token-truncation")
            assert "max_new_tokens 4096" in cut.inner_text()
            page.locator("#token-body").evaluate("b => { b.scrollTop = b.scrollHeight; }")
            page.wait_for_selector(f"#tok-{LENGTH - 1}")
            assert cut.evaluate("e => e.previousElementSibling.lastElementChild.id") == f"tok-{LENGTH - 1}"
            shot(page, "token-view.png")

            # moving to the next trajectory keeps the view open and shows that one's tokens
            page.locator("#traj-next").click()
            page.wait_for_selector("#detail-id:text-is('short-r0')")  # the CSP forbids wait_for_function
            page.wait_for_selector("#token-view[data-ready]")
            summary = page.locator("#token-summary").inner_text()
            assert summary.startswith("3 tokens · 2 policy-sampled · 1 tool / environment")
            assert "the trainer's log-probs were not recorded" in summary
            assert page.locator("#token-truncation").count() == 0
            assert {"pol", "gap-none"} <= set(page.locator("#tok-0").get_attribute("class").split())
    finally:
        store.close()
