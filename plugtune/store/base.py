"""What every table module of the store shares: the database, the clock, JSON helpers."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Select, func, select

from plugtune.store.database import Database


class StoreBase:
    """State the table mixins of :class:`plugtune.store.Store` read; set by ``Store.open``."""

    _db: Database
    _clock: Callable[[], float]
    _retention_s: float


MAX_PAGE = 1000


def page_size(limit: int) -> int:
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    return min(limit, MAX_PAGE)


def count_rows(conn: Connection, ids: Select[Any], cap: int | None) -> int:
    """Count the rows ``ids`` selects, stopping at ``cap`` when given."""
    if cap is not None:
        if cap < 1:
            raise ValueError(f"cap must be >= 1, got {cap}")
        ids = ids.limit(cap)
    return int(conn.execute(select(func.count()).select_from(ids.subquery())).scalar_one())


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_fallback)


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _fallback(value: Any) -> Any:
    # JSON for what plugins put in metrics/evidence: records, sets and tuples, bytes; else its str().
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
