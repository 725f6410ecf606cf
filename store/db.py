"""The connection to the store's database: URL checks, engine, transactions, schema check.

``Database(url)`` connects at once (a bad URL or an unreachable database is a StoreError
naming the URL, password redacted). SQLite runs in WAL mode with one writer at a time
(``BEGIN IMMEDIATE`` for writes); every database error surfaces as a StoreError naming what
was being done. The other parts of the store (writes, reads, retention, …) share one.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from sqlalchemy import Connection, Engine, create_engine, event, func, inspect, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from core.errors import StoreError
from store import partitions
from store.tables import SCHEMA_VERSION, SchemaVersionRow

log = logging.getLogger(__name__)
_SQLITE_BUSY_S = 30.0  # how long a connection waits for another one's lock


def redact(url: str) -> str:
    """The URL with its password replaced by ***, even when it does not parse."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def raw_sqlite(conn: Connection) -> sqlite3.Connection:
    """The driver connection under a SQLite Connection."""
    return cast(sqlite3.Connection, conn.connection.driver_connection)


class Database:
    """One database and its pooled connections (module docstring)."""

    def __init__(self, url: str) -> None:
        self.url = redact(url)
        self.schema_ok = False
        self.days = partitions.DayPartitions()  # PostgreSQL: the chunks' days made
        parsed = self._parse(url)
        self.dialect = parsed.get_backend_name()
        try:
            self.engine = self._create_engine(parsed)
            with self.engine.connect():
                pass
        except (SQLAlchemyError, OSError) as exc:
            raise StoreError(f"cannot open database {self.url}: {reason(exc)}") from exc

    def _parse(self, url: str) -> URL:
        try:
            parsed = make_url(url)
        except (ArgumentError, ValueError) as exc:
            raise StoreError(f"bad database URL {self.url}: {exc}") from exc
        if parsed.drivername in ("postgresql", "postgres"):
            parsed = parsed.set(drivername="postgresql+psycopg")
        if parsed.get_backend_name() not in ("sqlite", "postgresql"):
            raise StoreError(
                f"bad database URL {self.url}: only sqlite:/// and postgresql:// are supported"
            )
        return parsed

    def _create_engine(self, parsed: URL) -> Engine:
        if self.dialect == "postgresql":
            return create_engine(parsed, pool_pre_ping=True, connect_args={"connect_timeout": 10})
        database = parsed.database or ""
        in_memory = database in ("", ":memory:") or "mode=memory" in database
        if not in_memory and not database.startswith("file:"):
            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(parsed, connect_args={"timeout": _SQLITE_BUSY_S})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Let SQLAlchemy emit BEGIN itself (transactional DDL, BEGIN IMMEDIATE for writers).
            dbapi_conn.isolation_level = None
            cursor = dbapi_conn.cursor()
            if not in_memory:
                _wal(cursor, _SQLITE_BUSY_S)
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            write = conn.get_execution_options().get("kvscope_write", False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

        return engine

    def close(self) -> None:
        """Release every pooled connection."""
        self.engine.dispose()

    @contextmanager
    def tx(self, action: str, *, write: bool = False) -> Iterator[Connection]:
        """One transaction; database errors become StoreError naming the action and the URL."""
        try:
            with self.engine.connect() as conn:
                if write:
                    conn.execution_options(kvscope_write=True)
                with conn.begin():
                    yield conn
        except (SQLAlchemyError, self.engine.dialect.loaded_dbapi.Error) as exc:
            raise StoreError(f"{action} failed on {self.url}: {reason(exc)}") from exc

    def insert(self, table: Any) -> Any:
        """An INSERT into ``table`` in this dialect's form (it has ``on_conflict_do_…``)."""
        return (sqlite.insert if self.dialect == "sqlite" else postgresql.insert)(table)

    def read_version(self, conn: Connection) -> int | None:
        if not inspect(conn).has_table(SchemaVersionRow.__tablename__):
            return None
        version = conn.scalar(select(func.max(SchemaVersionRow.version)))
        return None if version is None else int(version)

    def require_schema(self) -> None:
        """Refuse a database whose schema version is not this code's."""
        if self.schema_ok:
            return
        with self.tx("schema check") as conn:
            version = self.read_version(conn)
        if version != SCHEMA_VERSION:
            raise StoreError(self.version_message(version))
        self.schema_ok = True

    def version_message(self, version: int | None) -> str:
        if version is None:
            return f"{self.url} has no kvscope schema: run `kvscope db migrate --db URL`"
        if version > SCHEMA_VERSION:
            return (
                f"{self.url} has schema version {version}, newer than this kvscope "
                f"({SCHEMA_VERSION}): upgrade kvscope"
            )
        return (
            f"{self.url} has schema version {version}, older than {SCHEMA_VERSION}: "
            "run `kvscope db migrate --db URL`"
        )

    def vacuum(self, table: str) -> None:
        """PostgreSQL: ``VACUUM (SKIP_LOCKED)`` of a table whose rows come and go (the head:
        an hour's rows are deleted when sealed), so the next rows reuse their space instead
        of growing the table until autovacuum comes by; a failure is logged, not raised."""
        try:
            with self.engine.connect() as conn:
                auto = conn.execution_options(isolation_level="AUTOCOMMIT")
                auto.exec_driver_sql(f"VACUUM (SKIP_LOCKED) {table}")
        except SQLAlchemyError as exc:
            log.warning("VACUUM %s on %s: %s", table, self.url, reason(exc))

    def make_days(self, days: set[int]) -> None:
        """PostgreSQL: the chunks' day partitions of ``days`` made (once per Store)."""
        missing = self.days.missing(days)
        if self.dialect != "postgresql" or not missing:
            return
        with self.tx(f"making the partitions of chunks for {len(missing)} day(s)", write=True) as c:
            partitions.make_days(c, missing)
        self.days.add(missing)


def _wal(cursor: Any, patience_s: float) -> None:
    """Put the database in WAL mode, waiting out other connections doing the same.

    Switching a fresh file to WAL needs an exclusive lock, and SQLite answers "database is
    locked" at once instead of calling the busy handler when another connection holds it.
    The mode is read first: once one connection has set it, it sticks to the file.
    """
    deadline = time.monotonic() + patience_s
    pause = 0.005
    while True:
        try:
            if str(cursor.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


def no_partition(exc: StoreError) -> bool:
    """Whether a write failed for want of a partition (SQLSTATE 23514, check_violation)."""
    cause = getattr(exc.__cause__, "orig", exc.__cause__)
    return getattr(cause, "sqlstate", None) == "23514" and "no partition" in str(cause)


def reason(exc: BaseException) -> str:
    """The driver's own message (one line), without SQLAlchemy's boilerplate."""
    orig = getattr(exc, "orig", None)
    message = str(orig if orig is not None else exc)
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("(Background on this error")]
    return "; ".join(lines) or type(exc).__name__
