"""Reading every log line: the newest N past one page, every line after an id in order, and counts
of the lines a reader left out (a page holds at most MAX_PAGE lines)."""

from __future__ import annotations

from plugtune.store import Store
from plugtune.store.base import MAX_PAGE
from plugtune.types import LogLine

TOTAL = 2 * MAX_PAGE + 500


def _write(store: Store, job_id: int, start: int, count: int) -> None:
    store.add_logs(
        job_id,
        [
            LogLine(
                time=1000.0 + i / 1000,
                level="ERROR" if i % 7 == 0 else "INFO",
                plugin="solve",
                message=f"m{i}",
            )
            for i in range(start, start + count)
        ],
    )


def test_the_newest_lines_past_one_page_come_back_oldest_first(store: Store, job_id: int) -> None:
    _write(store, job_id, 0, TOTAL)
    rows = store.newest_logs(job_id, TOTAL - 100)
    assert [r.message for r in rows] == [f"m{i}" for i in range(100, TOTAL)]
    assert store.count_logs(job_id, before_id=rows[0].id) == 100  # what the reader left out
    everything = store.newest_logs(job_id, 10 * TOTAL)
    assert len(everything) == TOTAL and store.count_logs(job_id, before_id=everything[0].id) == 0
    errors = store.newest_logs(job_id, 10 * TOTAL, level="error")
    assert [r.message for r in errors] == [f"m{i}" for i in range(TOTAL) if i % 7 == 0]


def test_every_line_after_an_id_in_order_however_many_arrived(store: Store, job_id: int) -> None:
    _write(store, job_id, 0, 10)
    last = store.newest_logs(job_id, 1)[-1].id
    _write(store, job_id, 10, TOTAL)  # a burst far over one page between two reads
    after = list(store.logs_after(job_id, last))
    assert [r.message for r in after] == [f"m{i}" for i in range(10, 10 + TOTAL)]
    assert [r.id for r in after] == sorted(r.id for r in after)
    assert list(store.logs_after(job_id, after[-1].id)) == []
    assert store.count_logs(job_id, after_id=last) == TOTAL


def test_a_page_oldest_first(store: Store, job_id: int) -> None:
    _write(store, job_id, 0, 30)
    first = store.logs(job_id, oldest_first=True, limit=10)
    assert [r.message for r in first] == [f"m{i}" for i in range(10)]
    nxt = store.logs(job_id, oldest_first=True, after_id=first[-1].id, limit=10)
    assert [r.message for r in nxt] == [f"m{i}" for i in range(10, 20)]
