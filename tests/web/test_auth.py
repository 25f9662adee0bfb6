"""The optional API token: every API and page request needs it when set."""

from __future__ import annotations

from fastapi.testclient import TestClient

from plugtune.store import Store
from plugtune.web import create_app
from tests.web.conftest import BASE_URL
from tests.web.seed import Seeded

TOKEN = "s3cret-token"


def _client(store: Store) -> TestClient:
    return TestClient(create_app(store, api_token=TOKEN), base_url=BASE_URL)


def test_without_token_api_pages_and_metrics_are_refused(store: Store, seeded: Seeded) -> None:
    client = _client(store)
    for path in ("/api/jobs", f"/api/jobs/{seeded.failed_job}/logs", "/metrics", "/openapi.json"):
        answer = client.get(path)
        assert answer.status_code == 401, path
        assert answer.json()["detail"].startswith("this console requires the API token")
        assert answer.headers["www-authenticate"] == "Bearer"
    page = client.get("/jobs")
    assert page.status_code == 401 and 'name="token"' in page.text
    assert client.post(f"/api/jobs/{seeded.failed_job}/retry").status_code == 401
    assert store.get_job(seeded.failed_job).status == "failed"  # type: ignore[union-attr]
    assert client.get("/static/style.css").status_code == 200


def test_bearer_token_opens_the_api(store: Store, seeded: Seeded) -> None:
    client = _client(store)
    assert client.get("/api/jobs", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    wrong = client.get("/api/jobs", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["detail"] == "the API token is wrong"


def test_token_query_sets_a_cookie_once_for_the_browser(store: Store, seeded: Seeded) -> None:
    client = _client(store)
    answer = client.get("/jobs", params={"token": TOKEN, "status": "failed"}, follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/jobs?status=failed"
    cookie = answer.headers["set-cookie"]
    assert "plugtune_session=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert TOKEN not in cookie  # the session cookie is derived from the token, not the token
    assert client.get("/jobs?status=failed").status_code == 200
    assert client.get(f"/api/jobs/{seeded.failed_job}").status_code == 200
    client.cookies.clear()
    assert client.get("/jobs", params={"token": "bad"}).status_code == 401
