"""Fixtures the whole suite shares: a plugtune home of the test's own (``home``, SQLite under
``tmp_path``, set in the environment as ``plugtune`` reads it) and its store (``store``). A folder's
conftest or a module overrides them where it needs another (``tests/web``'s store runs on SQLite and
PostgreSQL; the Ray job tests' home starts a cluster)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from plugtune.settings import Settings
from plugtune.store import Store


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    state = tmp_path / "state"
    monkeypatch.setenv("PLUGTUNE_HOME", str(state))
    monkeypatch.setenv("PLUGTUNE_DATABASE_URL", f"sqlite:///{state / 'plugtune.db'}")
    return Settings.from_env()


@pytest.fixture()
def store(home: Settings) -> Iterator[Store]:
    s = Store.open(home.database_url)
    yield s
    s.close()
