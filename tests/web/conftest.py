"""The console's tests read a real store filled through its API: SQLite in a temp dir, and the real
PostgreSQL (a fresh schema per test; skipped with the reason when the server is unreachable)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from plugtune.store import Store
from plugtune.web import create_app
from tests.web.seed import Seeded, seed

BASE_URL = "http://127.0.0.1:8321"  # a name the console answers to (any other Host is a 400)
POSTGRES_URL = os.environ.get(
    "PLUGTUNE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


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


@pytest.fixture(params=["sqlite", "postgres"])
def store(
    request: pytest.FixtureRequest, tmp_path: Path, postgres_skip_reason: str | None
) -> Iterator[Store]:
    if request.param == "sqlite":
        opened = Store.open(f"sqlite:///{tmp_path / 'plugtune.db'}", retention_days=7)
        yield opened
        opened.close()
        return
    if postgres_skip_reason:
        pytest.skip(postgres_skip_reason)
    opened = Store.open(POSTGRES_URL, schema=f"web_{uuid.uuid4().hex[:12]}", retention_days=7)
    try:
        yield opened
    finally:
        opened.drop_all()
        opened.close()


@pytest.fixture
def seeded(store: Store) -> Seeded:
    return seed(store)


@pytest.fixture
def retried() -> list[str]:
    return []


@pytest.fixture
def client(store: Store, seeded: Seeded, retried: list[str]) -> TestClient:
    return TestClient(create_app(store, on_retry=retried.append), base_url=BASE_URL)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium for a module's browser tests (each page has its own context). Per module:
    Playwright's sync API keeps an event loop on the main thread while it is open."""
    sync_api = pytest.importorskip("playwright.sync_api")
    from tests.web.browsing import ARGS, CHROMIUM

    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed at /usr/bin/chromium")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield launched
        launched.close()
