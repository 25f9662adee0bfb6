from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from plugtune.errors import PlatformError
from plugtune.store import Store
from plugtune.store.database import normalize_url
from plugtune.store.schema import SCHEMA_VERSION


def test_default_url_is_sqlite_under_plugtune_home_in_wal_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PLUGTUNE_DATABASE_URL", raising=False)
    monkeypatch.setenv("PLUGTUNE_HOME", str(tmp_path / "deep" / "home"))
    store = Store.open()
    store.create_job("j", {})
    store.close()
    db_file = tmp_path / "deep" / "home" / "plugtune.db"
    assert db_file.is_file()
    with sqlite3.connect(db_file) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 1


def test_database_url_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLUGTUNE_DATABASE_URL", f"sqlite:///{tmp_path / 'env.db'}")
    with Store.open() as store:
        assert store.is_sqlite and store.url.endswith("env.db")
    assert (tmp_path / "env.db").is_file()


@pytest.mark.parametrize("url", ["postgresql://u:secret@h:5432/db", "postgres://u:secret@h/db"])
def test_plain_postgresql_urls_mean_psycopg(url: str) -> None:
    assert normalize_url(url).drivername == "postgresql+psycopg"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("not a url", "is not a database URL"),
        ("mysql://root@localhost/db", "plugtune stores its data in SQLite or PostgreSQL"),
        ("sqlite://", "in-memory SQLite"),
    ],
)
def test_unusable_urls_are_platform_errors(url: str, message: str) -> None:
    with pytest.raises(PlatformError, match=message):
        Store.open(url)


def test_database_path_that_is_a_folder(tmp_path: Path) -> None:
    with pytest.raises(PlatformError, match=f"cannot open the database file {tmp_path}") as info:
        Store.open(f"sqlite:///{tmp_path}")
    assert info.value.type == "internal error" and "writable" in info.value.hint


def test_database_folder_that_cannot_be_created(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(PlatformError, match="cannot create the folder"):
        Store.open(f"sqlite:///{tmp_path / 'file' / 'sub' / 'plugtune.db'}")


def test_unreachable_postgresql_names_the_url_without_password() -> None:
    with pytest.raises(
        PlatformError, match="cannot connect to PostgreSQL at postgresql\\+psycopg://"
    ) as info:
        Store.open("postgresql://postgres:hunter2@127.0.0.1:1/test")
    assert "hunter2" not in str(info.value) and "server is running" in info.value.hint


def test_schema_is_postgresql_only(tmp_path: Path) -> None:
    with pytest.raises(PlatformError, match="PostgreSQL-only"):
        Store.open(f"sqlite:///{tmp_path / 'a.db'}", schema="abc")


def test_a_database_of_another_schema_version_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    Store.open(url).close()
    with sqlite3.connect(tmp_path / "old.db") as conn:
        conn.execute("UPDATE plugtune_meta SET value = '0' WHERE key = 'schema_version'")
    with pytest.raises(
        PlatformError, match=f"has plugtune schema version 0; this plugtune reads version {SCHEMA_VERSION}"
    ):
        Store.open(url)


def test_a_database_locked_by_another_process_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import plugtune.store.database as database

    monkeypatch.setattr(database, "BUSY_TIMEOUT_S", 0.2)
    url = f"sqlite:///{tmp_path / 'busy.db'}"
    store = Store.open(url)
    holder = sqlite3.connect(tmp_path / "busy.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the write lock
    try:
        with pytest.raises(PlatformError, match="stayed locked by another process") as info:
            store.create_job("j", {})
        assert "creating a job" in info.value.message
        assert store.count_jobs() == 0  # reads still work under WAL while another process writes
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    store.create_job("j", {})
    store.close()


def test_read_connection_for_custom_core_queries(tmp_path: Path) -> None:
    from sqlalchemy import func, select

    from plugtune.store.schema import jobs

    with Store.open(f"sqlite:///{tmp_path / 'r.db'}") as store:
        store.create_job("a", {})
        with store.read_connection("counting") as conn:
            assert conn.execute(select(func.count()).select_from(jobs)).scalar_one() == 1
        with pytest.raises(PlatformError, match="database error while custom read"):
            with store.read_connection("custom read") as conn:
                conn.exec_driver_sql("SELECT * FROM no_such_table")
