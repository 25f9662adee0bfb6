"""Every store test runs against SQLite in a temp dir and against the real PostgreSQL.

PostgreSQL tests use one fresh schema per test run (dropped afterwards), emptied before each
test, so parallel and previous runs never see each other's rows.
Override the server with PLUGTUNE_TEST_POSTGRES_URL.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from plugtune.store import Store
from plugtune.store.schema import metadata, store_meta

POSTGRES_URL = os.environ.get(
    "PLUGTUNE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


@dataclass(frozen=True)
class Target:
    """Where a test's store lives; ``open()`` gives another handle on the same data."""

    url: str
    schema: str | None

    def open(self, **kwargs: object) -> Store:
        return Store.open(self.url, schema=self.schema, retention_days=7, **kwargs)  # type: ignore[arg-type]


def _postgres_unreachable() -> str | None:
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed"
    try:
        with psycopg.connect(POSTGRES_URL.replace("+psycopg", ""), connect_timeout=3):
            return None
    except psycopg.Error as e:
        return f"PostgreSQL at {POSTGRES_URL} is unreachable: {str(e).strip().splitlines()[0]}"


@pytest.fixture(scope="session")
def postgres_skip_reason() -> str | None:
    return _postgres_unreachable()


@pytest.fixture(scope="session")
def postgres_session(postgres_skip_reason: str | None) -> Iterator[Store | None]:
    """One schema for the whole run (creating tables per test is most of a test's time)."""
    if postgres_skip_reason:
        yield None
        return
    store = Store.open(POSTGRES_URL, schema=f"pt_test_{uuid.uuid4().hex[:12]}", retention_days=7)
    yield store
    store.drop_all()
    store.close()


def _empty(store: Store) -> None:
    # DELETE, children first: much cheaper than TRUNCATE on a dozen small tables.
    with store._db.engine.begin() as conn:
        for table in reversed(metadata.sorted_tables):
            if table is not store_meta:
                conn.execute(table.delete())


@pytest.fixture(params=["sqlite", "postgres"])
def target(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    postgres_skip_reason: str | None,
    postgres_session: Store | None,
) -> Iterator[Target]:
    """An empty store: a new SQLite file, or the run's PostgreSQL schema with every table emptied."""
    if request.param == "sqlite":
        yield Target(f"sqlite:///{tmp_path / 'state' / 'plugtune.db'}", None)
        return
    if postgres_session is None:
        pytest.skip(postgres_skip_reason or "PostgreSQL is unreachable")
    _empty(postgres_session)
    yield Target(POSTGRES_URL, postgres_session._db.schema)


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_target(
    request: pytest.FixtureRequest, tmp_path: Path, postgres_skip_reason: str | None
) -> Iterator[Target]:
    """A database (SQLite file / PostgreSQL schema) that does not exist yet."""
    if request.param == "sqlite":
        yield Target(f"sqlite:///{tmp_path / 'fresh' / 'plugtune.db'}", None)
        return
    if postgres_skip_reason:
        pytest.skip(postgres_skip_reason)
    target = Target(POSTGRES_URL, f"pt_test_{uuid.uuid4().hex[:12]}")
    yield target
    cleanup = target.open()
    cleanup.drop_all()
    cleanup.close()


@pytest.fixture
def store(target: Target) -> Iterator[Store]:
    s = target.open()
    yield s
    s.close()


@pytest.fixture
def job_id(store: Store) -> int:
    return store.create_job("test-job", {"name": "test-job", "hyperparameters": {"steps": 3}})
