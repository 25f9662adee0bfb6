"""A corpus of hostile requests to the real console server (uvicorn): each is a clear 4xx JSON error,
never a 500 or a hang, and the server answers a normal request right after it."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugtune.store import Store
from plugtune.web import create_app
from tests.web.browsing import serving
from tests.web.seed import Seeded, seed

JOB = 1  # the seeded failed job
TRAVERSALS = [
    "..%2f..%2fetc%2fpasswd",
    "..%252f..%252fetc%252fpasswd",
    "%2e%2e/%2e%2e/etc/passwd",
    "../../etc/passwd",
    "a%00b",
    "%ff%fe",
]
PLUGIN_ROUTES = [
    f"/api/jobs/{JOB}/plugins/{{}}",
    f"/api/jobs/{JOB}/plugins/{{}}/code",
    f"/api/jobs/{JOB}/plugins/{{}}/code.zip",
    f"/api/jobs/{JOB}/plugins/exact/code/{{}}",
    f"/api/jobs/{JOB}/plugins/exact/code/plugins/{{}}",
    f"/api/jobs/{JOB}/plugins/{{}}/metrics",
    f"/api/jobs/{JOB}/trajectories/{{}}",
    f"/api/jobs/{JOB}/trajectories/{{}}/neighbors",
    f"/api/jobs/{JOB}/groups/{{}}",
    f"/jobs/{JOB}/groups/{{}}",
    "/static/{}",
]
IDS = ["-1", "0", str(10**30), str(2**63), "abc", "1e3", "9" * 10_000, "%00", "%ff"]
JOB_ROUTES = [
    "/api/jobs/{}",
    "/api/jobs/{}/logs",
    "/api/jobs/{}/trajectories",
    "/api/jobs/{}/plugins",
    "/api/jobs/{}/events",
    "/jobs/{}",
    "/jobs/{}/plugins",
    "/jobs/{}/logs",
]
QUERIES = [
    "/api/jobs?page=-1",
    f"/api/jobs?page={10**30}",
    "/api/jobs?page_size=100000",
    "/api/jobs?status=%ff",
    f"/api/jobs/{JOB}/logs?q=%ff%fe",
    f"/api/jobs/{JOB}/logs?level=%00",
    f"/api/jobs/{JOB}/logs?before={10**30}",
    f"/api/jobs/{JOB}/logs?after=-5",
    f"/api/jobs/{JOB}/logs?limit=0",
    f"/api/jobs/{JOB}/trajectories?step={10**30}",
    f"/api/jobs/{JOB}/trajectories?min_reward=nan",
    f"/api/jobs/{JOB}/trajectories?q=" + "a" * 9000,
    f"/api/jobs/{JOB}/plugins/exact/metrics?range=custom&start=1e309&end=1",
    f"/api/jobs/{JOB}/plugins/exact/metrics?range=forever",
    "/api/jobs?" + "&".join(f"k{i}=v" for i in range(200)),
    f"/jobs?page={10**30}",
    f"/jobs/{JOB}/trajectories?before=-3",
    # The jobs list's search and the compare view.
    "/api/jobs?q=" + "a" * 300,
    "/jobs?q=" + "a" * 300,
    "/jobs?cause=%00",
    "/api/compare?ids=" + "1," * 3000,
    "/api/compare?ids=%C2%B2,1",
    "/api/compare?ids=1,2,3,4,5,6",
    f"/api/compare?ids={JOB},{10**30}",
    "/compare?ids=abc",
    "/compare",
]
JSON = {"content-type": "application/json"}
WRITES = [
    ("POST", f"/api/jobs/{JOB}/retry", b"{bad", JSON),
    ("POST", f"/api/jobs/{JOB}/retry", b'{"a": "\xff\xfe"}', JSON),
    ("POST", f"/api/jobs/{JOB}/retry", b"[" * 100_000 + b"]" * 100_000, JSON),
    ("POST", f"/api/jobs/{JOB}/retry", b'{"a": "' + b"x" * (10 << 20) + b'"}', JSON),
    ("POST", f"/api/jobs/{JOB}/retry", b"<xml/>", {"content-type": "application/xml"}),
    ("POST", f"/api/jobs/{JOB}/retry", b"a=1", {"content-type": "text/plain"}),
    ("POST", f"/jobs/{JOB}/retry", b"csrf_token=%ff", {"content-type": "application/x-www-form-urlencoded"}),
    ("POST", f"/api/jobs/{10**30}/retry", b"", {}),
    ("POST", "/api/jobs/abc/retry", b"", {}),
    ("PUT", f"/api/jobs/{JOB}", b"{}", JSON),
    ("PATCH", f"/api/jobs/{JOB}", b"{}", JSON),
    # The control plane's routes (POST /api/jobs, cancel, DELETE, events).
    ("DELETE", f"/api/jobs/{10**30}", b"", {}),
    ("DELETE", "/api/jobs/abc", b"", {}),
    ("DELETE", f"/api/jobs/{JOB}", b"", {"origin": "http://evil.example"}),
    ("POST", f"/api/jobs/{JOB}/cancel", b"", {}),  # failed, no retry pending: nothing to cancel
    ("POST", f"/api/jobs/{10**30}/cancel", b"", {}),
    ("POST", "/api/jobs", b"name: x\n", {"content-type": "text/yaml", "origin": "http://evil.example"}),
    ("POST", "/api/jobs", b"name: [unclosed\n", {"content-type": "text/yaml"}),
    ("POST", "/api/jobs?dry_run=true", b"\xff\xfe", {"content-type": "application/x-yaml"}),
    ("POST", "/api/jobs", b"x" * (33 << 20), {"content-type": "application/x-yaml"}),
    ("POST", "/api/jobs", b'{"spec": "name: x"}', JSON),
    ("POST", "/api/jobs", b"--b\r\nbroken", {"content-type": "multipart/form-data; boundary=b"}),
    ("POST", "/api/jobs", b"garbage", {"content-type": "multipart/form-data"}),
    (
        "POST",
        "/api/jobs",
        b'--b\r\nContent-Disposition: form-data; name="project"; filename="p.zip"\r\n\r\n'
        b"not a zip\r\n--b--\r\n",
        {"content-type": "multipart/form-data; boundary=b"},
    ),
    (
        "POST",
        "/api/jobs",
        b'--b\r\nContent-Disposition: form-data; name="project_files"; filename="../../etc/x"\r\n\r\n'
        b"x\r\n--b--\r\n",
        {"content-type": "multipart/form-data; boundary=b"},
    ),
    ("POST", "/api/jobs?dry_run=maybe", b"name: x\n", {"content-type": "text/yaml"}),
    ("POST", "/login", b"token=" + b"x" * (2 << 20), {"content-type": "application/x-www-form-urlencoded"}),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, Store, Seeded]]:
    folder: Path = tmp_path_factory.mktemp("hostile")
    store = Store.open(f"sqlite:///{folder / 'plugtune.db'}", retention_days=7)
    seeded = seed(store)
    assert seeded.failed_job == JOB
    with serving(create_app(store, home=folder)) as base:
        host, port = base.removeprefix("http://").split(":")
        yield host, int(port), store, seeded
    store.close()


def _ask(
    server: tuple[str, int, Store, Seeded],
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection(server[0], server[1], timeout=30)
    try:
        connection.request(
            method, path, body=body or None, headers={"accept": "application/json", **(headers or {})}
        )
        answer = connection.getresponse()
        return answer.status, answer.read()
    except (BrokenPipeError, ConnectionResetError):  # a server may close on a body it refused early
        return 413, b'{"detail": "closed"}'
    finally:
        connection.close()


def _assert_clear_4xx(
    server: tuple[str, int, Store, Seeded],
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> None:
    status, raw = _ask(server, method, path, body, headers)
    assert 400 <= status < 500, (method, path[:120], status, raw[:300])
    detail = json.loads(raw)["detail"]
    assert isinstance(detail, str) and len(detail) > 8, detail
    assert _ask(server, "GET", "/api/jobs")[0] == 200  # still serving
    assert server[2].get_job(JOB).status == "failed"  # type: ignore[union-attr]  # nothing was retried


@pytest.mark.parametrize("value", TRAVERSALS)
@pytest.mark.parametrize("route", PLUGIN_ROUTES)
def test_path_traversal_in_every_path_parameter(
    server: tuple[str, int, Store, Seeded], route: str, value: str
) -> None:
    _assert_clear_4xx(server, "GET", route.format(value))


def test_traversal_never_serves_a_file_outside_the_code(server: tuple[str, int, Store, Seeded]) -> None:
    for value in TRAVERSALS:
        for route in ("/api/jobs/1/plugins/exact/code/{}", "/static/{}"):
            status, raw = _ask(server, "GET", route.format(value))
            assert b"root:" not in raw and status >= 400


@pytest.mark.parametrize("value", IDS)
@pytest.mark.parametrize("route", JOB_ROUTES)
def test_absurd_job_ids(server: tuple[str, int, Store, Seeded], route: str, value: str) -> None:
    _assert_clear_4xx(server, "GET", route.format(value))


@pytest.mark.parametrize("path", QUERIES)
def test_hostile_query_parameters(server: tuple[str, int, Store, Seeded], path: str) -> None:
    _assert_clear_4xx(server, "GET", path)


@pytest.mark.parametrize(
    ("method", "path", "body", "headers"), WRITES, ids=[f"{m} {p[:30]} {b[:12]!r}" for m, p, b, _ in WRITES]
)
def test_hostile_bodies_and_methods(
    server: tuple[str, int, Store, Seeded], method: str, path: str, body: bytes, headers: dict[str, str]
) -> None:
    _assert_clear_4xx(server, method, path, body, headers)
