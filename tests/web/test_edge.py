"""The console's edge: Host allow-list, CSRF and origin checks, security headers, limits, the login form."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient

from plugtune.store import Store
from plugtune.web import create_app
from tests.web.conftest import BASE_URL
from tests.web.seed import Seeded

TOKEN = "edge-token"
FORM = {"content-type": "application/x-www-form-urlencoded"}
TEMPLATES = Path(__file__).parents[2] / "plugtune" / "web" / "templates"


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf_token" value="([0-9a-f]{64})"', page)
    assert found, "the page has no CSRF field"
    return found.group(1)


def test_a_host_the_console_does_not_answer_to_is_a_400_naming_the_header(
    store: Store, seeded: Seeded
) -> None:
    rebound = TestClient(create_app(store), base_url="http://attacker.example:8321")
    answer = rebound.get("/api/jobs")
    assert answer.status_code == 400
    detail = answer.json()["detail"]
    assert "Host header 'attacker.example:8321'" in detail and "--allowed-host attacker.example" in detail
    assert "<title>400" in rebound.get("/jobs").text  # a browser gets the error page
    allowed = TestClient(
        create_app(store, allowed_hosts=["Attacker.Example"]), base_url="http://attacker.example"
    )
    assert allowed.get("/api/jobs").status_code == 200
    for base in ("http://localhost:8321", "http://[::1]:8321", BASE_URL):
        assert TestClient(create_app(store), base_url=base).get("/api/jobs").status_code == 200, base


def test_a_form_from_another_origin_or_port_cannot_retry_a_job(
    client: TestClient, store: Store, seeded: Seeded
) -> None:
    job = seeded.failed_job
    for origin in ("http://attacker.example", "http://127.0.0.1:9999", "null"):
        answer = client.post(f"/jobs/{job}/retry", headers={**FORM, "origin": origin}, content=b"")
        assert answer.status_code == 403, origin
        assert "cross-origin request refused" in answer.text
    referred = client.post(
        f"/api/jobs/{job}/retry", headers={"referer": "http://127.0.0.1:9999/evil.html"}, content=b""
    )
    assert referred.status_code == 403 and "127.0.0.1:9999" in referred.json()["detail"]
    assert store.get_job(job).status == "failed"  # type: ignore[union-attr]


def test_the_consoles_own_form_retries_only_with_its_csrf_token(
    client: TestClient, store: Store, seeded: Seeded, retried: list[str]
) -> None:
    job = seeded.failed_job
    token = _csrf(client.get(f"/jobs/{job}").text)
    same = {**FORM, "origin": BASE_URL}
    forged = client.post(f"/jobs/{job}/retry", headers=same, content=b"csrf_token=" + b"0" * 64)
    assert forged.status_code == 403 and "CSRF token is missing or stale" in forged.text
    missing = client.post(f"/api/jobs/{job}/retry", headers={"origin": BASE_URL})
    assert missing.status_code == 403 and "reload the page" in missing.json()["detail"]
    assert store.get_job(job).status == "failed"  # type: ignore[union-attr]
    done = client.post(
        f"/jobs/{job}/retry", headers=same, content=f"csrf_token={token}".encode(), follow_redirects=False
    )
    assert done.status_code == 303 and retried == [str(job)]
    assert store.get_job(job).status == "queued"  # type: ignore[union-attr]


def test_every_answer_carries_the_security_headers(client: TestClient, seeded: Seeded) -> None:
    answers = [
        client.get("/jobs"),
        client.get(f"/api/jobs/{seeded.failed_job}"),
        client.get("/static/style.css"),
        client.get("/api/jobs/999"),
        client.get("/jobs", headers={"host": "elsewhere.example"}),
    ]
    for answer in answers:
        csp = answer.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["referrer-policy"] == "same-origin"
    for template in TEMPLATES.glob("*.html"):  # the CSP would block inline script: none is written
        text = template.read_text()
        # a JSON data block (never executed) is allowed when tojson writes it: it escapes < > & '
        executable = r"<script(?![^>]*\bsrc=)(?![^>]*\btype=\"application/json\")[^>]*>"
        assert not re.search(executable, text), template.name
        for block in re.findall(r"<script[^>]*application/json[^>]*>(.*?)</script>", text, re.S):
            assert re.fullmatch(r"\{\{ [\w.]+ \| tojson \}\}", block.strip()), (template.name, block)
        assert not re.search(r"\son[a-z]+\s*=", text), template.name


def test_oversized_bodies_queries_and_absurd_numbers_are_4xx_naming_what(
    client: TestClient, seeded: Seeded
) -> None:
    job = seeded.failed_job
    big = client.post(
        f"/api/jobs/{job}/retry",
        content=b"{}" + b" " * (2 << 20),
        headers={"content-type": "application/json"},
    )
    assert big.status_code == 413 and "at most 1048576" in big.json()["detail"]
    long = client.get("/api/jobs", params={"status": "x" * 9000})
    assert long.status_code == 414 and "query string" in long.json()["detail"]
    many = client.get("/api/jobs?" + "&".join(f"p{i}=1" for i in range(100)))
    assert many.status_code == 400 and "100 parameters" in many.json()["detail"]
    for path, name in [
        (f"/api/jobs/{10**30}", "job_id"),
        (f"/api/jobs?page={10**30}", "page"),
        (f"/api/jobs/{job}/logs?before={10**30}", "before"),
        (f"/api/jobs/{job}/trajectories?step={10**30}", "step"),
        (f"/api/jobs/{job}/trajectories/{'x' * 10_000}", "trajectory_id"),
    ]:
        answer = client.get(path)
        assert answer.status_code in (400, 422) and name in answer.json()["detail"], (path, answer.text[:200])
    page = client.get(f"/jobs?page={10**30}")
    assert page.status_code == 400 and "page must be &lt;= 1000000000" in page.text
    digits = client.get(f"/jobs/{job}/logs", params={"before": "9" * 5000})
    assert digits.status_code == 400 and "a 5000-digit number" in digits.text


def test_login_form_signs_a_browser_in_and_out(store: Store, seeded: Seeded) -> None:
    client = TestClient(create_app(store, api_token=TOKEN), base_url=BASE_URL)
    refused = client.get(f"/jobs/{seeded.failed_job}?x=1")
    assert refused.status_code == 401 and 'action="/login"' in refused.text
    assert f'name="next" value="/jobs/{seeded.failed_job}?x=1"' in refused.text
    csrf = _csrf(refused.text)
    wrong = client.post("/login", headers=FORM, content=f"csrf_token={csrf}&token=nope&next=/jobs".encode())
    assert (
        wrong.status_code == 401
        and "the API token is wrong" in wrong.text
        and 'id="token-input"' in wrong.text
    )
    body = f"csrf_token={csrf}&token={TOKEN}&next=/jobs/{seeded.failed_job}".encode()
    signed_in = client.post(
        "/login", headers={**FORM, "origin": BASE_URL}, content=body, follow_redirects=False
    )
    assert signed_in.status_code == 303 and signed_in.headers["location"] == f"/jobs/{seeded.failed_job}"
    cookie = signed_in.headers["set-cookie"]
    assert "plugtune_session=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert TOKEN not in cookie and "token" not in signed_in.headers["location"]
    page = client.get(f"/jobs/{seeded.failed_job}")
    assert page.status_code == 200 and 'id="logout-button"' in page.text
    escaped = client.post(
        "/login",
        headers=FORM,
        content=f"csrf_token={csrf}&token={TOKEN}&next=//evil.example".encode(),
        follow_redirects=False,
    )
    assert escaped.headers["location"] == "/jobs"  # never to another site
    out = client.post(
        "/logout",
        headers={**FORM, "origin": BASE_URL},
        content=f"csrf_token={_csrf(page.text)}".encode(),
        follow_redirects=False,
    )
    assert out.status_code == 303 and out.headers["location"] == "/login"
    assert client.get("/api/jobs").status_code == 401


def test_token_in_the_query_of_a_post_is_accepted(store: Store, seeded: Seeded) -> None:
    client = TestClient(create_app(store, api_token=TOKEN), base_url=BASE_URL)
    answer = client.post(f"/api/jobs/{seeded.failed_job}/retry", params={"token": TOKEN})
    assert answer.status_code == 200, answer.text
    assert store.get_job(seeded.failed_job).status == "queued"  # type: ignore[union-attr]
    wrong = client.post(f"/api/jobs/{seeded.failed_job}/retry", params={"token": "nope"})
    assert wrong.status_code == 401 and wrong.json()["detail"] == "the API token is wrong"


def test_a_pages_script_writes_through_the_api_with_the_csrf_header(
    client: TestClient, store: Store, seeded: Seeded
) -> None:
    docs = client.get("/docs").text
    assert "X-CSRF-Token" in docs
    token = re.search(r'<meta name="csrf-token" content="([0-9a-f]{64})">', docs)
    assert token
    job = seeded.platform_job
    answer = client.post(
        f"/api/jobs/{job}/retry", headers={"origin": BASE_URL, "x-csrf-token": token.group(1)}
    )
    assert answer.status_code == 200, answer.text
    assert store.get_job(job).status == "queued"  # type: ignore[union-attr]
