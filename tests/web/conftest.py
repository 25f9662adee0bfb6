from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from plugtune.store import Store
from plugtune.web import create_app
from tests.web.seed import Seeded, seed


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store.open(f"sqlite:///{tmp_path / 'plugtune.db'}", retention_days=7)
    yield opened
    opened.close()


@pytest.fixture
def seeded(store: Store) -> Seeded:
    return seed(store)


@pytest.fixture
def retried() -> list[str]:
    return []


@pytest.fixture
def client(store: Store, seeded: Seeded, retried: list[str]) -> TestClient:
    return TestClient(create_app(store, on_retry=retried.append))
