"""Server-rendered pages: what a user sees, and that plugin/data text always stays text."""

from __future__ import annotations

from fastapi.testclient import TestClient

from plugtune.errors import HINTS, Cause
from plugtune.store import Store
from tests.web.seed import XSS_IMG, XSS_SCRIPT, Seeded

ESCAPED_SCRIPT = "&lt;script&gt;alert(1)&lt;/script&gt;"
ESCAPED_IMG = "&lt;img src=x onerror=alert(1)&gt;"


def _assert_no_raw_injection(html: str) -> None:
    assert XSS_SCRIPT not in html and XSS_IMG not in html
    assert "onerror=alert" not in html.replace(ESCAPED_IMG, "")


def test_jobs_page_lists_status_failure_type_and_steps(client: TestClient, seeded: Seeded) -> None:
    html = client.get("/jobs").text
    row = html.split(f'data-job="{seeded.failed_job}"')[1].split("</tr>")[0]
    assert "failed" in row and "Call plugin error" in row and "plugin" in row and "3 / 10" in row
    only_running = client.get("/jobs", params={"status": "running"}).text
    assert (
        f'data-job="{seeded.running_job}"' in only_running
        and f'data-job="{seeded.failed_job}"' not in only_running
    )
    assert client.get("/jobs", params={"status": "bogus"}).status_code == 400


def test_failed_job_page_shows_banner_hint_and_retry(client: TestClient, seeded: Seeded) -> None:
    html = client.get(f"/jobs/{seeded.failed_job}").text
    banner = html.split('id="failure-banner"')[1].split("</section>")[0]
    assert "Call plugin error" in banner and 'id="failure-owner">plugin<' in banner
    assert "grader exact raised ZeroDivisionError" in banner
    assert HINTS[Cause.ERROR_500].split("`")[0] in banner
    assert 'href="/jobs/1/plugins?plugin=exact"' in banner  # the entry in the error resolved to the plugin
    assert 'action="/jobs/1/retry"' in banner and 'id="retry-button"' in banner
    assert "retry-countdown" not in banner  # plugin errors are not retried automatically
    assert 'id="attempts"' in html and "first run" in html


def test_platform_error_shows_the_automatic_retry_countdown(client: TestClient, seeded: Seeded) -> None:
    html = client.get(f"/jobs/{seeded.platform_job}").text
    assert f'data-countdown-to="{seeded.now + 900}"' in html
    assert "internal error" in html and 'id="failure-owner">platform<' in html


def test_plugin_tab_shows_status_failure_reason_and_coloured_code(client: TestClient, seeded: Seeded) -> None:
    html = client.get(f"/jobs/{seeded.failed_job}/plugins", params={"plugin": "exact"}).text
    assert 'id="plugin-status">failed<' in html
    reason = html.split('id="failure-reason"')[1].split("</div>")[0]
    assert "500 [plugins/grader.py:exact]: grader exact raised ZeroDivisionError" in reason
    assert "plugins/grader.py&#34;, line 8, in exact" in reason  # the job error's traceback
    assert '<tr class="failed-line"><td class="ln">8</td>' in html  # the traceback's grader.py:8
    assert '<span class="k">def</span> <span class="nf">exact</span>' in html
    assert 'href="/jobs/1/logs?plugin=exact"' in html
    assert 'href="/api/jobs/1/plugins/exact/code.zip"' in html
    solve = client.get(f"/jobs/{seeded.failed_job}/plugins", params={"plugin": "solve"}).text
    assert "&lt;b&gt;not bold&lt;/b&gt;" in solve and "<b>not bold" not in solve
    assert 'id="failure-reason"' not in solve
    assert client.get(f"/jobs/{seeded.failed_job}/plugins", params={"plugin": "ghost"}).status_code == 404


def test_injected_html_stays_text_on_every_page(client: TestClient, seeded: Seeded) -> None:
    job = seeded.failed_job
    for path in (f"/jobs/{job}/logs", f"/jobs/{job}/trajectories?t=s2-g1-r2", f"/jobs/{job}/groups/g1"):
        html = client.get(path).text
        _assert_no_raw_injection(html)
    assert ESCAPED_IMG in client.get(f"/jobs/{job}/logs").text
    group = client.get(f"/jobs/{job}/groups/g1").text
    assert ESCAPED_SCRIPT in group and ESCAPED_IMG in group


def test_pages_send_a_strict_content_security_policy(client: TestClient, seeded: Seeded) -> None:
    csp = client.get(f"/jobs/{seeded.failed_job}/trajectories").headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp


def test_logs_page_filters_and_live_tail_only_while_running(client: TestClient, seeded: Seeded) -> None:
    html = client.get(f"/jobs/{seeded.failed_job}/logs", params={"plugin": "exact", "level": "error"}).text
    rows = html.split("<tbody>")[1].split("</tbody>")[0]
    assert rows.count("<tr data-id=") == 1 and "grader crashed" in rows
    assert 'id="live-tail"' not in html
    live = client.get(f"/jobs/{seeded.running_job}/logs").text
    assert 'id="live-tail"' in live and "live line 2" in live


def test_trajectories_page_lists_and_selects(client: TestClient, seeded: Seeded) -> None:
    html = client.get(f"/jobs/{seeded.failed_job}/trajectories", params={"status": "failed"}).text
    assert 'data-selected="s2-g1-r2"' in html and 'data-filters="status=failed"' in html
    assert html.count('class="clickable') == 1
    assert (
        client.get(f"/jobs/{seeded.failed_job}/trajectories", params={"min_reward": "x"}).status_code == 400
    )


def test_cancelled_job_offers_retry_and_stderr_lines_are_tagged(
    client: TestClient, seeded: Seeded, store: Store
) -> None:
    store.transition(seeded.running_job, "cancelled", "by the user")
    html = client.get(f"/jobs/{seeded.running_job}").text
    assert 'id="retry-button"' in html and "This job was cancelled." in html
    logs = client.get(f"/jobs/{seeded.failed_job}/logs", params={"level": "ERROR"}).text
    assert '<span class="muted small-tag">stderr</span>' in logs
