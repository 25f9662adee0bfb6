from __future__ import annotations

from typing import Any

import pytest

from plugtune.store import Store
from plugtune.types import LogLine

PLUGINS = ("solve", "exact")
LEVELS = ("INFO", "INFO", "WARNING", "ERROR")


def _line(i: int) -> LogLine:
    return LogLine(
        time=1000.0 + i,
        level=LEVELS[i % 4].lower() if i % 8 == 0 else LEVELS[i % 4],
        plugin=PLUGINS[i % 2],
        message=f"line {i} " + ("100% done_ok" if i % 10 == 0 else "working"),
        source="stdout" if i % 3 == 0 else "logger",
        call_id=f"c{i}",
        trajectory_id=f"t{i % 5}",
        instance_id="i1",
    )


@pytest.fixture
def lines(store: Store, job_id: int) -> list[LogLine]:
    written = [_line(i) for i in range(200)]
    store.add_logs(job_id, written)
    other = store.create_job("other", {})
    store.add_logs(other, [_line(i) for i in range(50)])  # never seen through job_id
    return written


def _walk(store: Store, job_id: int, page: int, **filters: Any) -> list[str]:
    seen: list[str] = []
    before = None
    for _ in range(1000):  # bounded: 200 lines / page >= 1
        rows = store.logs(job_id, before_id=before, limit=page, **filters)
        if not rows:
            return seen
        assert all(a.id > b.id for a, b in zip(rows, rows[1:], strict=False))
        seen += [r.message for r in rows]
        before = rows[-1].id
    raise AssertionError("pagination did not end")


def test_keyset_pages_newest_first_cover_every_line_once(
    store: Store, job_id: int, lines: list[LogLine]
) -> None:
    assert _walk(store, job_id, 7) == [line.message for line in reversed(lines)]
    first = store.logs(job_id, limit=3)
    assert [r.message for r in first] == [lines[199].message, lines[198].message, lines[197].message]
    row = first[0]
    assert (row.plugin, row.call_id, row.trajectory_id, row.instance_id, row.source, row.time) == (
        "exact",
        "c199",
        "t4",
        "i1",
        "logger",
        1199.0,
    )
    assert store.count_logs(job_id) == 200


@pytest.mark.parametrize(
    "filters",
    [
        {"plugin": "solve"},
        {"level": "error"},
        {"level": "INFO"},
        {"trajectory_id": "t3"},
        {"text": "100% DONE_ok"},
        {"text": "_"},
        {"plugin": "solve", "level": "WARNING", "trajectory_id": "t2"},
    ],
)
def test_filters_match_a_python_reference(
    store: Store, job_id: int, lines: list[LogLine], filters: dict[str, str]
) -> None:
    def keep(line: LogLine) -> bool:
        return (
            ("plugin" not in filters or line.plugin == filters["plugin"])
            and ("level" not in filters or line.level.upper() == filters["level"].upper())
            and ("trajectory_id" not in filters or line.trajectory_id == filters["trajectory_id"])
            and ("text" not in filters or filters["text"].lower() in line.message.lower())
        )

    expected = [line.message for line in reversed(lines) if keep(line)]
    assert expected, "the reference must select something"
    assert _walk(store, job_id, 9, **filters) == expected
    assert store.count_logs(job_id, **filters) == len(expected)  # type: ignore[arg-type]


def test_text_wildcards_are_literal(store: Store, job_id: int, lines: list[LogLine]) -> None:
    assert store.count_logs(job_id, text="%") == 20
    assert store.count_logs(job_id, text="line 1_") == 0


def test_live_tail_returns_only_newer_lines(store: Store, job_id: int, lines: list[LogLine]) -> None:
    newest = store.logs(job_id, limit=1)[0].id
    assert store.logs(job_id, after_id=newest) == []
    store.add_logs(
        job_id, [LogLine(time=2000.0, level="INFO", plugin="solve", message=f"new {i}") for i in range(3)]
    )
    assert [r.message for r in store.logs(job_id, after_id=newest)] == ["new 2", "new 1", "new 0"]
    assert [r.message for r in store.logs(job_id, after_id=newest, plugin="exact")] == []


def test_page_size_is_validated_and_capped(store: Store, job_id: int, lines: list[LogLine]) -> None:
    with pytest.raises(ValueError, match="limit must be >= 1"):
        store.logs(job_id, limit=0)
    assert len(store.logs(job_id, limit=10_000)) == 200


def test_capped_count_stops_at_the_cap(store: Store, job_id: int, lines: list[LogLine]) -> None:
    assert store.count_logs(job_id, cap=50) == 50
    assert store.count_logs(job_id, cap=500) == 200
    assert store.count_logs(job_id, plugin="solve", cap=1000) == 100
    with pytest.raises(ValueError, match="cap must be >= 1"):
        store.count_logs(job_id, cap=0)
