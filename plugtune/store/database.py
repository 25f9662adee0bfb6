"""Opening the database, transactions, and translating database errors once into PlatformError.

SQLite: WAL mode, ``synchronous=FULL`` (a committed transaction is fsynced, so it survives a
crash of the process *and* of the machine), a 30 s busy timeout, foreign keys on, and write
transactions that start with ``BEGIN IMMEDIATE`` so two processes never deadlock upgrading a
read lock. PostgreSQL: the psycopg 3 driver; an optional schema isolates one store from another
in the same database (tests use one schema per run).
"""

from __future__ import annotations

import logging
import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Boolean,
    ColumnElement,
    Connection,
    Engine,
    Insert,
    String,
    Table,
    create_engine,
    event,
    exc,
    insert,
    literal,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from plugtune.errors import PlatformError
from plugtune.home import private_dir, private_file
from plugtune.store.schema import MIGRATIONS, SCHEMA_VERSION, metadata, store_meta

log = logging.getLogger(__name__)

BUSY_TIMEOUT_S = 30.0
_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def normalize_url(url: str) -> URL:
    """Parse a database URL; plain ``postgresql://`` / ``postgres://`` mean the psycopg 3 driver."""
    try:
        parsed = make_url(url)
    except exc.ArgumentError as e:
        raise PlatformError(
            f"PLUGTUNE_DATABASE_URL {url!r} is not a database URL: {e}",
            hint="Use sqlite:///path/to/plugtune.db or postgresql://user@host:5432/dbname.",
        ) from e
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise PlatformError(
            f"database URL {_safe(parsed)} names {parsed.get_backend_name()!r}; plugtune stores "
            "its data in SQLite or PostgreSQL",
            hint="Use sqlite:///path/to/plugtune.db or postgresql://user@host:5432/dbname.",
        )
    if parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise PlatformError(
            "an in-memory SQLite database cannot be shared between plugtune's processes",
            hint="Use a file: sqlite:///path/to/plugtune.db",
        )
    return parsed


def sqlite_file(url: str) -> Path | None:
    """The file a SQLite URL names (None for PostgreSQL); raises PlatformError for a bad URL."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    return Path(str(parsed.database)).expanduser().resolve()


def _safe(url: URL) -> str:
    return url.render_as_string(hide_password=True)


class Database:
    """An engine plus the transaction helpers every table module uses. Thread-safe."""

    def __init__(self, url: URL, schema: str | None = None) -> None:
        self.url = url
        self.is_sqlite = url.get_backend_name() == "sqlite"
        self.schema = schema
        if schema is not None and (self.is_sqlite or not _SCHEMA_NAME.match(schema)):
            raise PlatformError(
                f"schema {schema!r} is not usable: schemas are PostgreSQL-only, lowercase "
                "letters, digits and '_'"
            )
        self.engine = self._create_engine()

    def _create_engine(self) -> Engine:
        if self.is_sqlite:
            path = Path(str(self.url.database)).expanduser()
            try:  # a new store is its owner's alone (its -wal and -shm files take its mode)
                private_dir(path.parent)
                if self.url.database not in (None, "", ":memory:"):
                    private_file(path)
            except OSError as e:
                raise PlatformError(
                    f"cannot create the folder {path.parent} for the database file: {e}",
                    hint="Set PLUGTUNE_HOME or PLUGTUNE_DATABASE_URL to a writable place.",
                ) from e
            engine = create_engine(
                self.url,
                connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_S},
                pool_size=8,
                max_overflow=16,
            )
            event.listen(engine, "connect", _sqlite_on_connect)
            return engine
        options: dict[str, Any] = {}
        if self.schema is not None:
            options["schema_translate_map"] = {None: self.schema}
        return create_engine(self.url, pool_pre_ping=True, pool_size=8, max_overflow=16).execution_options(
            **options
        )

    def create_schema(self) -> None:
        with self.errors("creating the tables"):
            if self.is_sqlite:
                with self.engine.connect() as conn:
                    _enable_wal(conn)
                # One transaction holding the write lock: processes opening a new file at once queue here.
                with self.write("creating the tables") as conn:
                    metadata.create_all(conn)
                    self._check_version(conn)
                return
            with self.engine.begin() as conn:
                # Two processes opening a fresh database at once must not race on CREATE SCHEMA/TABLE.
                conn.execute(text("SELECT pg_advisory_xact_lock(8321)"))
                if self.schema is not None:
                    conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"'))
                metadata.create_all(conn)
                self._check_version(conn)

    def _check_version(self, conn: Connection) -> None:
        found = conn.execute(select(store_meta.c.value).where(store_meta.c.key == "schema_version")).scalar()
        if found is None:
            conn.execute(insert(store_meta), {"key": "schema_version", "value": str(SCHEMA_VERSION)})
            return
        while found.isdigit() and int(found) in MIGRATIONS and int(found) < SCHEMA_VERSION:
            found = self._migrate(conn, int(found))
        if found != str(SCHEMA_VERSION):
            raise PlatformError(
                f"the database at {_safe(self.url)} has plugtune schema version {found}; this plugtune "
                f"reads version {SCHEMA_VERSION}",
                hint="Use the plugtune version that wrote it, or point PLUGTUNE_DATABASE_URL / "
                "PLUGTUNE_HOME at a new database.",
            )

    def _migrate(self, conn: Connection, version: int) -> str:
        """Upgrade the database from ``version`` to the next one, in the caller's transaction."""
        prefix = f'"{self.schema}".' if self.schema is not None else ""
        for statement in MIGRATIONS[version]:
            blob = "BYTEA" if self.engine.dialect.name == "postgresql" else "BLOB"
            conn.execute(text(statement.format(trajectories=prefix + "trajectories", blob=blob)))
        upgraded = str(version + 1)
        conn.execute(update(store_meta).where(store_meta.c.key == "schema_version").values(value=upgraded))
        return upgraded

    def drop_schema(self) -> None:
        """Delete every table (PostgreSQL: the whole schema). For tests and `plugtune` resets."""
        with self.errors("dropping the tables"), self.engine.begin() as conn:
            if self.schema is not None:
                conn.execute(text(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE'))
            else:
                metadata.drop_all(conn)

    @contextmanager
    def write(self, what: str) -> Iterator[Connection]:
        """One write transaction: committed (and durable) when the block exits without error."""
        with self.errors(what), self.engine.connect() as conn:
            if self.is_sqlite:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.rollback()
                raise
            conn.commit()

    @contextmanager
    def read(self, what: str) -> Iterator[Connection]:
        with self.errors(what), self.engine.connect() as conn:
            yield conn
            conn.rollback()

    @contextmanager
    def errors(self, what: str) -> Iterator[None]:
        """Translate driver errors into one PlatformError that says what failed and what to do."""
        try:
            yield
        except PlatformError:
            raise
        except (exc.DBAPIError, exc.NoSuchModuleError, ModuleNotFoundError, sqlite3.Error) as e:
            raise self._platform_error(what, e) from e

    def _platform_error(self, what: str, e: BaseException) -> PlatformError:
        where = _safe(self.url)
        lines = str(getattr(e, "orig", None) or e).strip().splitlines()
        reason = lines[0] if lines else type(e).__name__
        if isinstance(e, (exc.NoSuchModuleError, ModuleNotFoundError)):
            return PlatformError(
                f"cannot use {where}: a database driver is missing ({reason})",
                hint="Install PostgreSQL support with: pip install 'psycopg[binary]'",
            )
        if self.is_sqlite:
            if "unable to open database file" in reason:
                return PlatformError(
                    f"cannot open the database file {self.url.database}: {reason}",
                    hint="Check that the folder exists and is writable, or set PLUGTUNE_DATABASE_URL.",
                )
            if "locked" in reason or "busy" in reason:
                return PlatformError(
                    f"the database file {self.url.database} stayed locked by another process for "
                    f"more than {BUSY_TIMEOUT_S:.0f} s while {what}",
                    hint="Another plugtune process holds a long write; retry, or use PostgreSQL.",
                )
        elif isinstance(e, exc.OperationalError) and _is_connect_failure(reason):
            return PlatformError(
                f"cannot connect to PostgreSQL at {where}: {reason}",
                hint="Check that the server is running and that PLUGTUNE_DATABASE_URL is right.",
            )
        return PlatformError(f"database error while {what} ({where}): {reason}")

    def close(self) -> None:
        self.engine.dispose()


def _is_connect_failure(reason: str) -> bool:
    words = ("connection", "connect", "could not translate host", "does not exist", "authentication")
    return any(w in reason.lower() for w in words)


def _enable_wal(conn: Connection) -> None:
    """Switch the file to WAL (persistent; not allowed inside a transaction).

    On a fresh file two processes switching at once can deadlock upgrading their read locks, and
    SQLite then answers one of them "database is locked" at once, without its busy timeout. So the
    switch is retried, with short sleeps, until the busy timeout has passed.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    pause = 0.002
    while True:
        try:
            if conn.exec_driver_sql("PRAGMA journal_mode").scalar() != "wal":
                conn.exec_driver_sql("PRAGMA journal_mode=WAL")
            conn.commit()
            return
        except exc.OperationalError as e:
            conn.rollback()
            if "locked" not in str(e.orig) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Autocommit at the driver: Database.write issues BEGIN IMMEDIATE itself; reads need no BEGIN.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def upsert(
    db: Database, table: Table, keys: list[str], update_columns: list[str] | None, *, newer_than: str = ""
) -> Insert:
    """INSERT ... ON CONFLICT (keys) DO UPDATE SET the update columns (or DO NOTHING when None).

    ``newer_than``: update only when the new row's value of that column is >= the stored one.
    """
    stmt = sqlite_insert(table) if db.is_sqlite else postgresql_insert(table)
    if update_columns is None:
        return stmt.on_conflict_do_nothing(index_elements=keys)
    where = table.c[newer_than] <= stmt.excluded[newer_than] if newer_than else None
    return stmt.on_conflict_do_update(
        index_elements=keys, set_={name: stmt.excluded[name] for name in update_columns}, where=where
    )


class contains_text(FunctionElement[bool]):
    """``column`` contains ``needle``, case-insensitively, wildcards taken literally.

    SQLite's LIKE already ignores ASCII case (as its lower() does), so it gets a plain LIKE, about
    twice as fast as ``lower(x) LIKE lower(y)`` over a million rows; PostgreSQL gets ILIKE.
    """

    type = Boolean()
    inherit_cache = True
    name = "contains_text"

    def __init__(self, column: ColumnElement[str], needle: str) -> None:
        escaped = needle.replace("/", "//").replace("%", "/%").replace("_", "/_")
        super().__init__(column, literal(f"%{escaped}%", String()))


@compiles(contains_text)
def _contains_text_ilike(element: contains_text, compiler: Any, **kw: Any) -> str:
    column, pattern = list(element.clauses)
    return f"{compiler.process(column, **kw)} ILIKE {compiler.process(pattern, **kw)} ESCAPE '/'"


@compiles(contains_text, "sqlite")
def _contains_text_sqlite(element: contains_text, compiler: Any, **kw: Any) -> str:
    column, pattern = list(element.clauses)
    return f"{compiler.process(column, **kw)} LIKE {compiler.process(pattern, **kw)} ESCAPE '/'"
