"""The logs a console reader can trust: a live tail that more lines reached than it shows says how
many it skipped, every line can be read oldest first (API and page), the page shows the total and
milliseconds."""

from __future__ import annotations

from fastapi.testclient import TestClient

from plugtune.store import Store
from plugtune.types import LogLine
from tests.web.seed import Seeded

START = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC


def _job_with_lines(store: Store, count: int) -> int:
    job = store.create_job("chatty", {"model": "tiny"})
    store.transition(job, "running")
    lines = [
        LogLine(START + i * 0.001, "ERROR" if i % 4 == 0 else "INFO", "solve", f"line {i:04d}")
        for i in range(count)
    ]
    store.add_logs(job, lines)
    return job


def _ids(store: Store, job: int) -> list[int]:
    return [r.id for r in store.newest_logs(job, 10_000)]


def test_a_live_tail_that_more_lines_reached_says_how_many_it_skipped(
    client: TestClient, store: Store, seeded: Seeded
) -> None:
    job = _job_with_lines(store, 1000)
    ids = _ids(store, job)
    answer = client.get(f"/api/jobs/{job}/logs", params={"after": ids[99], "limit": 200}).json()
    assert [line["message"] for line in answer["items"]] == [f"line {i:04d}" for i in range(999, 799, -1)]
    assert answer["skipped"] == 700  # lines 100..799: newer than `after`, older than the answer
    errors = client.get(
        f"/api/jobs/{job}/logs", params={"after": ids[99], "limit": 50, "level": "ERROR"}
    ).json()
    assert errors["skipped"] == 225 - 50  # the ERROR lines among 100..999 are 225
    quiet = client.get(f"/api/jobs/{job}/logs", params={"after": ids[949], "limit": 200}).json()
    assert len(quiet["items"]) == 50 and quiet["skipped"] == 0


def test_the_api_reads_every_line_oldest_first(client: TestClient, store: Store, seeded: Seeded) -> None:
    job = _job_with_lines(store, 1000)
    seen: list[str] = []
    after = 0
    for _ in range(10):  # 1000 lines, 300 a page
        answer = client.get(
            f"/api/jobs/{job}/logs", params={"order": "oldest", "after": after, "limit": 300}
        ).json()
        seen += [line["message"] for line in answer["items"]]
        if answer["after"] is None:
            break
        after = answer["after"]
    assert seen == [f"line {i:04d}" for i in range(1000)]
    bad = client.get(f"/api/jobs/{job}/logs", params={"order": "sideways"})
    assert bad.status_code == 400 and "order must be one of newest, oldest" in bad.text


def test_the_logs_page_shows_the_total_milliseconds_and_starts_from_the_oldest_line(
    client: TestClient, store: Store, seeded: Seeded
) -> None:
    job = _job_with_lines(store, 1234)
    newest = client.get(f"/jobs/{job}/logs").text
    assert "1,234 lines" in newest
    assert "2023-11-14 22:13:21.233" in newest  # line 1233, written at START + 1.233 s
    assert 'href="?order=oldest"' in newest
    oldest = client.get(f"/jobs/{job}/logs", params={"order": "oldest"}).text
    assert "1,234 lines" in oldest and "100 lines, oldest first" in oldest
    assert oldest.index("line 0000") < oldest.index("line 0001") < oldest.index("line 0099")
    assert "line 0100" not in oldest and "2023-11-14 22:13:20.000" in oldest
    assert "live-tail" not in oldest  # the live tail belongs to the newest lines
    ids = _ids(store, job)
    assert f'href="?order=oldest&amp;after={ids[99]}"' in oldest
    second = client.get(f"/jobs/{job}/logs", params={"order": "oldest", "after": ids[99]}).text
    assert "line 0100" in second and "line 0099" not in second
    filtered = client.get(f"/jobs/{job}/logs", params={"order": "oldest", "level": "ERROR"}).text
    assert "309 lines match" in filtered and "line 0001" not in filtered
