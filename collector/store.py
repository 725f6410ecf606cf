"""The SQL store: windows, scrape outcomes, clusters, engines, targets (SQLite or PostgreSQL).

``Store(url)`` connects at once (a bad URL or an unreachable database is a StoreError naming the
URL, password redacted). ``migrate()`` creates or upgrades the schema; every other operation
refuses a database whose schema version differs from the code's. Window writes are idempotent
upserts on (source, series_key, start), batched with one transaction per batch. The bucket
counts a window of a keep_buckets histogram carries go in its row (``buckets``, schema 9:
collector/store_buckets.py), so they are written, replaced, kept or pruned with it.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    MetaData,
    Table,
    create_engine,
    delete,
    event,
    func,
    insert,
    inspect,
    select,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from collector import partitions, store_blocks, store_blocks_pg, store_blocks_sqlite
from collector.handoff import HandoffStore
from collector.inventory import Inventory
from collector.models import (
    SCHEMA_VERSION,
    WINDOW_VALUE_COLUMNS,
    WINDOWS_START_BRIN_DDL,
    Base,
    EngineRecord,
    PlanRecord,
    SchemaVersionRow,
    TargetRecord,
    WindowRow,
    labels_json,
    series_key,
)
from collector.plans import PlanStore
from collector.retention import RetentionStore
from collector.store_buckets import BucketSummer, decode_buckets, encode_buckets
from collector.store_frame import FrameReader, window_filters
from core.errors import StoreError
from core.records import BucketSum, Labels, Window


def _packs_7(conn: Connection) -> None:
    """Schema 6 -> 7 (MIGRATIONS)."""
    conn.execute(text("CREATE INDEX IF NOT EXISTS ix_packed_hours_hour ON packed_hours (hour)"))
    if conn.dialect.name == "postgresql":
        partitions.partition_blocks(conn)
        store_blocks_pg.pack_existing(conn)


_MODES_8 = ("native", "lmcache")
_ENDS_8 = ("", "_lo", "_hi")


def _plans_8(conn: Connection) -> None:
    """Schema 7 -> 8 (MIGRATIONS): the plans' gain_<mode>_now columns were a throughput gain
    at equal KV use; they keep their values under that name (equal_kv_gain_<mode>), and the
    capacity ratio at the SLO gets columns of its own (None for plans made before). A plans
    table that create_all() has just made (a store older than schema 2) has them already."""
    from sqlalchemy import inspect

    have = {c["name"] for c in inspect(conn).get_columns("plans")}
    for m in _MODES_8:
        for end in _ENDS_8:
            old, new, cap = f"gain_{m}_now{end}", f"equal_kv_gain_{m}{end}", f"capacity_{m}{end}"
            if old in have and new not in have:
                conn.execute(text(f"ALTER TABLE plans RENAME COLUMN {old} TO {new}"))
            if cap not in have:
                conn.execute(text(f"ALTER TABLE plans ADD COLUMN {cap} DOUBLE PRECISION"))


def _buckets_9(conn: Connection) -> None:
    """Schema 8 -> 9 (MIGRATIONS): windows get the nullable ``buckets`` column (the bucket
    counts of the catalogue's keep_buckets histograms, collector/store_buckets.py); every
    existing row keeps its values, NULL there. On PostgreSQL the partitioned parent passes
    the column on to every partition; both backends add a nullable column without
    rewriting the table."""
    from sqlalchemy import inspect

    if "buckets" not in {c["name"] for c in inspect(conn).get_columns("windows")}:
        kind = "BYTEA" if conn.dialect.name == "postgresql" else "BLOB"
        conn.execute(text(f"ALTER TABLE windows ADD COLUMN buckets {kind}"))


# Upgrade steps: MIGRATIONS[n] turns schema version n into n + 1, inside migrate()'s one
# transaction and after create_all() has added any new table (steps alter existing tables).
MIGRATIONS: dict[int, Callable[[Connection], None]] = {
    1: lambda _conn: None,  # 1 -> 2: the plans table, which create_all() has just added
    2: lambda _conn: None,  # 2 -> 3: the engine_changes table (create_all() added it)
    # 3 -> 4: the rollup_states table (create_all() added it) and, on PostgreSQL, the BRIN
    # index on windows.start (create_all() makes indexes with new tables only)
    3: lambda conn: _postgresql_only(conn, lambda: conn.execute(text(WINDOWS_START_BRIN_DDL))),
    # 4 -> 5: on PostgreSQL, windows range-partitioned by day on start (collector.partitions);
    # SQLite's table is unchanged
    4: lambda conn: _postgresql_only(conn, lambda: partitions.partition_existing(conn)),
    # 5 -> 6: the packed_hours and window_blocks tables (create_all() added them); on SQLite
    # every complete hour of the store packed (collector.store_blocks), every row kept
    5: lambda conn: _sqlite_only(conn, lambda: store_blocks_sqlite.pack_all(_raw(conn))),
    # 6 -> 7: packed_hours indexed on hour (retention); on PostgreSQL window_blocks made
    # again partitioned by day (collector.partitions) and every complete hour packed
    6: _packs_7,
    # 7 -> 8: the plans' headline: capacity ratio columns, the equal-KV gain renamed
    7: _plans_8,
    # 8 -> 9: windows.buckets, the bucket counts of the keep_buckets histograms
    8: _buckets_9,
}


def _sqlite_only(conn: Connection, step: Callable[[], object]) -> None:
    if conn.dialect.name == "sqlite":
        step()


def _raw(conn: Connection) -> sqlite3.Connection:
    return cast(sqlite3.Connection, conn.connection.driver_connection)


def _postgresql_only(conn: Connection, step: Callable[[], object]) -> None:
    if conn.dialect.name == "postgresql":
        step()


_PG_MIGRATE_LOCK = 0x6B7673636F7065  # pg_advisory_xact_lock key ("kvscope")
_WINDOW_KEY = ("source", "series_key", "start")
_WINDOW_COLUMNS = ("source", "signal", "labels", "series_key", "start", *WINDOW_VALUE_COLUMNS[2:])
_STAGING = "kvscope_windows_in"
_STAGING_DDL = (
    f"CREATE TEMPORARY TABLE IF NOT EXISTS {_STAGING} ON COMMIT DELETE ROWS AS "
    f"SELECT {', '.join(_WINDOW_COLUMNS)} FROM windows WITH NO DATA"
)
_STAGING_COPY = f"COPY {_STAGING} ({', '.join(_WINDOW_COLUMNS)}) FROM STDIN"


_SQLITE_BUSY_S = 30.0  # how long a connection waits for another one's lock


def _wal(cursor: Any, patience_s: float) -> None:
    """Put the database in WAL mode, waiting out other connections doing the same.

    Switching a fresh file to WAL needs an exclusive lock, and SQLite answers "database is
    locked" at once instead of calling the busy handler when another connection holds it
    (two collectors, or a collector and ``kvscope plan``, opening a new file together).
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


__all__ = ["MIGRATIONS", "EngineRecord", "PlanRecord", "Store", "TargetRecord", "redact"]


def redact(url: str) -> str:
    """The URL with its password replaced by ***, even when it does not parse."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


class Store(Inventory, PlanStore, FrameReader, HandoffStore, RetentionStore):
    """kvscope's SQL store; see the module docstring. Use as a context manager or call close()."""

    def __init__(self, url: str, *, batch_size: int = 5_000) -> None:
        self.url = redact(url)
        if batch_size < 1:
            raise StoreError(f"{self.url}: batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self._schema_ok = False
        self._series_cache: dict[tuple[str, Labels], tuple[str, str]] = {}
        self._labels_cache: dict[str, Labels] = {}
        self._upsert: dict[bool, str] = {}
        self._partitions = partitions.DayPartitions()  # PostgreSQL: the days made
        self._pack_hour: dict[str, float] = {}  # each source's newest hour written
        parsed = self._parse(url)
        self.dialect = parsed.get_backend_name()
        try:
            self._engine = self._create_engine(parsed)
            with self._engine.connect():
                pass
        except (SQLAlchemyError, OSError) as exc:
            raise StoreError(f"cannot open database {self.url}: {_reason(exc)}") from exc
        self._insert = sqlite.insert if self.dialect == "sqlite" else postgresql.insert

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

    # -- plumbing ---------------------------------------------------------------------------

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release every pooled connection."""
        self._engine.dispose()

    @contextmanager
    def _tx(self, action: str, *, write: bool = False) -> Iterator[Connection]:
        """One transaction; database errors become StoreError naming the action and the URL."""
        try:
            with self._engine.connect() as conn:
                if write:
                    conn.execution_options(kvscope_write=True)
                with conn.begin():
                    yield conn
        except (SQLAlchemyError, self._engine.dialect.loaded_dbapi.Error) as exc:
            raise StoreError(f"{action} failed on {self.url}: {_reason(exc)}") from exc

    def _read_version(self, conn: Connection) -> int | None:
        if not inspect(conn).has_table(SchemaVersionRow.__tablename__):
            return None
        version = conn.scalar(select(func.max(SchemaVersionRow.version)))
        return None if version is None else int(version)

    def _require_schema(self) -> None:
        if self._schema_ok:
            return
        with self._tx("schema check") as conn:
            version = self._read_version(conn)
        if version != SCHEMA_VERSION:
            raise StoreError(self._version_message(version))
        self._schema_ok = True

    def _version_message(self, version: int | None) -> str:
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

    # -- schema -----------------------------------------------------------------------------

    def migrate(self) -> int:
        """Create or upgrade the schema (idempotent, safe to race); return the version."""
        with self._tx("migrate", write=True) as conn:
            if self.dialect == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATE_LOCK})
            version = self._read_version(conn)
            if version is not None and version > SCHEMA_VERSION:
                raise StoreError(self._version_message(version))
            if self.dialect == "postgresql":  # windows, window_blocks: partitioned, made by
                # collector.partitions (a schema 6 store's window_blocks: by its migration)
                missing = [p for p in partitions.PARENTS if not inspect(conn).has_table(p)]
                tables = [
                    t for t in Base.metadata.sorted_tables if t.name not in partitions.PARENTS
                ]
                Base.metadata.create_all(conn, tables=tables, checkfirst=True)
                for parent in missing:
                    partitions.create(conn, parent)
            else:
                Base.metadata.create_all(conn, checkfirst=True)
            for step in range(SCHEMA_VERSION if version is None else version, SCHEMA_VERSION):
                if step not in MIGRATIONS:
                    raise StoreError(f"{self.url}: no upgrade path from schema version {step}")
                MIGRATIONS[step](conn)
            conn.execute(delete(SchemaVersionRow))
            conn.execute(
                insert(SchemaVersionRow).values(
                    id=1, version=SCHEMA_VERSION, migrated_at=time.time()
                )
            )
        self._schema_ok = True
        return SCHEMA_VERSION

    def schema_version(self) -> int | None:
        """The version the database is at (None: no kvscope schema)."""
        with self._tx("schema check") as conn:
            return self._read_version(conn)

    # -- windows ----------------------------------------------------------------------------

    def _series(self, signal: str, labels: Labels) -> tuple[str, str]:
        cached = self._series_cache.get((signal, labels))
        if cached is None:
            if len(self._series_cache) > 200_000:
                self._series_cache.clear()
            cached = (labels_json(labels), series_key(signal, labels))
            self._series_cache[(signal, labels)] = cached
        return cached

    def _upsert_sql(self, keep_fuller: bool = False) -> str:
        """The Core upsert, compiled once: executemany for SQLite, from staging for PostgreSQL
        (``keep_fuller``: a stored row built from more samples is left as it is)."""
        if keep_fuller not in self._upsert:
            table = cast(Table, WindowRow.__table__)
            stmt: Any
            if self.dialect == "sqlite":
                stmt = sqlite.insert(table)
            else:
                staging = Table(
                    _STAGING, MetaData(), *(Column(c, table.c[c].type) for c in _WINDOW_COLUMNS)
                )
                # Sorted by key: concurrent writers lock rows in the same order (no deadlock).
                rows = select(*staging.c).order_by(*(staging.c[k] for k in _WINDOW_KEY))
                stmt = postgresql.insert(table).from_select(list(_WINDOW_COLUMNS), rows)
            stmt = stmt.on_conflict_do_update(
                index_elements=list(_WINDOW_KEY),
                set_={name: stmt.excluded[name] for name in WINDOW_VALUE_COLUMNS},
                where=table.c.samples <= stmt.excluded.samples if keep_fuller else None,
            )
            compiled = stmt.compile(dialect=self._engine.dialect, column_keys=list(_WINDOW_COLUMNS))
            if self.dialect == "sqlite" and tuple(compiled.positiontup or ()) != _WINDOW_COLUMNS:
                raise StoreError(f"unexpected window upsert parameters: {compiled.positiontup}")
            self._upsert[keep_fuller] = str(compiled)
        return self._upsert[keep_fuller]

    def write_windows(self, windows: Iterable[Window], *, keep_fuller: bool = False) -> int:
        """Upsert windows on (source, series_key, start); return how many were written.

        Idempotent: writing the same windows again updates the rows in place; a key repeated
        within one call keeps its last window. One transaction per batch of ``batch_size``; NaN
        values are stored as NULL (unknown) on both backends.

        ``keep_fuller``: a stored window built from more samples than the one written is kept
        (the direct collector's rule: a partial version of a window, e.g. the part after a
        restart that had no checkpoint to resume from, never replaces a fuller one; the
        same window written again, a spool replay, still replaces it).

        The statement is SQLAlchemy Core's insert().on_conflict_do_update(), compiled once and
        fed plain tuples (SQLite: the driver's executemany; PostgreSQL: COPY to a staging
        table): SQLAlchemy's per-row parameter processing alone cost half the throughput.
        """
        self._require_schema()
        sql = self._upsert_sql(keep_fuller)
        fix_nan = self.dialect != "sqlite"  # SQLite turns NaN into NULL by itself
        cache = self._series_cache
        isfinite = math.isfinite
        written = 0
        batch: list[tuple[Any, ...]] = []
        for w in windows:
            ident = cache.get((w.signal, w.labels)) or self._series(w.signal, w.labels)
            if not isfinite(w.start):
                raise StoreError(f"window {w.source} {w.signal} has a non-finite start: {w.start}")
            row: tuple[Any, ...] = (
                w.source, w.signal, ident[0], ident[1], w.start, w.length_s, w.kind, w.samples,
                w.delta, w.rate, w.resets, w.mean, w.min, w.max, w.last, w.p50, w.p90, w.p99,
                w.sum_delta, _buckets_blob(w) if w.bucket_counts else None,
            )  # fmt: skip
            if fix_nan:
                row = tuple(None if isinstance(x, float) and math.isnan(x) else x for x in row)
            batch.append(row)
            if len(batch) >= self.batch_size:
                written += self._write_batch(sql, batch)
                batch = []
        if batch:
            written += self._write_batch(sql, batch)
        return written

    def _write_batch(self, sql: str, rows: list[tuple[Any, ...]]) -> int:
        newest: dict[str, float] = {}
        for row in rows:
            if newest.get(row[0], -math.inf) < row[4]:
                newest[row[0]] = row[4]
        if self.dialect == "sqlite":
            hour_of = store_blocks.hour_of
            with self._tx(f"writing {len(rows)} windows", write=True) as conn:
                # executemany upserts row by row: a key repeated in a batch keeps its last row.
                conn.exec_driver_sql(sql, rows)
                # the packs of the hours written are no longer whole (collector.store_blocks)
                unpacked = {(row[0], hour_of(row[4])) for row in rows}
                store_blocks_sqlite.unpack(_raw(conn), unpacked)
        else:
            # One statement may touch a row once: keep the last row per key.
            unique = list({(row[0], row[3], row[4]): row for row in rows}.values())
            days = self._days(unique)
            for part in store_blocks_pg.split(unique):  # each locks at most WRITE_HOURS hours
                self._write_pg(sql, part, days)
        self._pack_reached(newest)
        return len(rows)

    def _write_pg(self, sql: str, rows: list[tuple[Any, ...]], days: set[int]) -> None:
        """One transaction of a PostgreSQL write (rows unique by key), its days' partitions
        made first; the packs of the (source, hour)s written dropped under their locks."""
        hour_of = store_blocks.hour_of
        for attempt in (1, 2):
            self._make_days(days)
            try:
                with self._tx(f"writing {len(rows)} windows", write=True) as conn:
                    # COPY into a session-local staging table, then one INSERT ... SELECT ... ON
                    # CONFLICT DO UPDATE: ~2x psycopg's executemany (benchmarks/bench_store.py).
                    with conn.connection.driver_connection.cursor() as cursor:  # type: ignore[union-attr]
                        cursor.execute(_STAGING_DDL)
                        with cursor.copy(_STAGING_COPY) as copy:
                            for row in rows:
                                copy.write_row(row)
                    conn.exec_driver_sql(sql)
                    # after the upsert: the locks are held from here to the commit only
                    store_blocks_pg.unpack(conn, sorted({(r[0], hour_of(r[4])) for r in rows}))
                return
            except StoreError as exc:
                # a day another process's prune dropped after this one made it: made again
                if attempt == 2 or not _no_partition(exc):
                    raise
                self._partitions.forget(days)

    def _pack_reached(self, newest: dict[str, float]) -> None:
        """Pack the complete hours of the sources whose writes reached a new hour,
        LOOKBACK_S back (collector.store_blocks): an older hour a late write unpacked too.
        SQLite: one transaction; PostgreSQL: one per source, under the hours' locks."""
        due = store_blocks.due_hours(newest, self._pack_hour)
        if not due:
            return
        what = f"packing the windows of {len(due)} source(s)"
        if self.dialect == "sqlite":
            with self._tx(what, write=True) as conn:
                raw = _raw(conn)
                for source, lo in sorted(due.items()):
                    store_blocks_sqlite.pack_source(raw, source, lo, self._pack_hour[source])
            return
        for source, lo in sorted(due.items()):
            with self._tx(what, write=True) as conn:
                hours = store_blocks_pg.hours_to_pack(conn, source, lo, self._pack_hour[source])
                store_blocks_pg.pack_hours(conn, source, hours[-store_blocks_pg.PACK_HOURS :])

    def pack_windows(self) -> int:
        """Pack every complete hour not packed yet (each source's newest hour stays rows);
        return the windows packed. SQLite: one transaction; PostgreSQL: one per source and
        PACK_HOURS hours, under their locks (writers may go on meanwhile)."""
        self._require_schema()
        if self.dialect == "sqlite":
            with self._tx("packing windows", write=True) as conn:
                return store_blocks_sqlite.pack_all(_raw(conn))
        with self._tx("listing the sources to pack") as conn:
            names = store_blocks_pg.sources(conn)
        packed = 0
        for source in names:
            with self._tx(f"listing the hours of {source} to pack") as conn:
                chunks = store_blocks_pg.chunks_to_pack(conn, source)
            for hours in chunks:
                with self._tx(f"packing the windows of {source}", write=True) as conn:
                    packed += store_blocks_pg.pack_hours(conn, source, hours)
        return packed

    def _days(self, rows: Iterable[tuple[Any, ...]]) -> set[int]:
        """The UTC days of the rows' starts and the day after the newest (made ahead, so the
        first write after midnight finds its partition made)."""
        days = set()
        day_s, limit = partitions.DAY_S, partitions.MAX_ABS_START
        for row in rows:
            start = row[4]
            if not abs(start) < limit:
                partitions.check_start(start, f"window {row[0]} {row[1]}")
            days.add(int(start // day_s))
        days.add(max(days) + 1)
        return days

    def _make_days(self, days: set[int]) -> None:
        missing = self._partitions.missing(days)
        if missing:
            what = f"making the partitions of windows for {len(missing)} day(s)"
            with self._tx(what, write=True) as conn:
                partitions.make_days(conn, missing)
            self._partitions.add(missing)

    def _labels(self, raw: str) -> Labels:
        labels = self._labels_cache.get(raw)
        if labels is None:
            if len(self._labels_cache) > 200_000:
                self._labels_cache.clear()
            labels = tuple(sorted(json.loads(raw).items()))
            self._labels_cache[raw] = labels
        return labels

    def read_windows(
        self,
        *,
        signals: Sequence[str] | None = None,
        sources: Sequence[str] | None = None,
        cluster: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> list[Window]:
        """Windows with ``since <= start < until``, ordered by source, signal, start, labels.

        ``cluster`` keeps the sources registered in that cluster as a target or an engine.
        One Window object per row: for millions of windows use :meth:`read_frame`.
        """
        return self._read_windows(signals, sources, cluster, since, until, buckets_only=False)

    def read_buckets(
        self,
        *,
        signals: Sequence[str] | None = None,
        sources: Sequence[str] | None = None,
        cluster: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> list[Window]:
        """The windows that kept their bucket counts (``bucket_counts`` not empty: the
        catalogue's keep_buckets histograms, core.catalog BUCKET_SIGNALS, the default
        ``signals``), filtered and ordered as :meth:`read_windows`."""
        if signals is None:
            from core.catalog import BUCKET_SIGNALS

            signals = sorted(BUCKET_SIGNALS)
        return self._read_windows(signals, sources, cluster, since, until, buckets_only=True)

    def sum_buckets(
        self,
        *,
        signals: Sequence[str] | None = None,
        sources: Sequence[str] | None = None,
        cluster: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> list[BucketSum]:
        """The bucket counts of the windows :meth:`read_buckets` would return, summed per
        series and bucket layout (a series whose layout changed has one BucketSum per
        layout), sorted by source, signal, labels and last window; without a Window object
        per window (collector/store_buckets.py)."""
        self._require_schema()
        if signals is None:
            from core.catalog import BUCKET_SIGNALS

            signals = sorted(BUCKET_SIGNALS)
        w = WindowRow
        query = (
            select(w.source, w.signal, w.labels, w.start, w.buckets)
            .where(
                w.buckets.is_not(None),
                *window_filters(
                    signals=signals, sources=sources, cluster=cluster, since=since, until=until
                ),
            )
            .order_by(w.source, w.signal, w.start, w.labels)
        )
        summer = BucketSummer()
        with self._tx("reading bucket counts") as conn:
            for source, signal, labels, start, blob in conn.execute(query):
                try:
                    summer.add(source, signal, labels, start, bytes(blob or b""))
                except ValueError as exc:
                    raise StoreError(
                        f"{self.url}: window {source} {signal} at {start}: unreadable buckets: "
                        f"{exc}"
                    ) from exc
        out = [
            BucketSum(source, signal, self._labels(labels), bounds, counts, n, first, last)
            for source, signal, labels, bounds, counts, n, first, last in summer.sums()
        ]
        return sorted(out, key=lambda b: (b.source, b.signal, b.labels, b.last))

    def _read_windows(
        self,
        signals: Sequence[str] | None,
        sources: Sequence[str] | None,
        cluster: str | None,
        since: float | None,
        until: float | None,
        *,
        buckets_only: bool,
    ) -> list[Window]:
        self._require_schema()
        w = WindowRow
        query = select(
            w.source, w.signal, w.labels, w.start, w.length_s, w.kind, w.samples, w.delta,
            w.rate, w.resets, w.mean, w.min, w.max, w.last, w.p50, w.p90, w.p99, w.sum_delta,
            w.buckets,
        ).where(
            *window_filters(
                signals=signals, sources=sources, cluster=cluster, since=since, until=until
            )
        )  # fmt: skip
        if buckets_only:
            query = query.where(w.buckets.is_not(None))
        query = query.order_by(w.source, w.signal, w.start, w.labels)
        with self._tx("reading windows") as conn:
            rows = conn.execute(query).all()
        cache = self._labels_cache
        out = []
        for r in rows:
            labels = cache.get(r[2]) or self._labels(r[2])
            blob = r[18]
            if blob is None:
                out.append(Window(r[0], r[1], labels, *r[3:18]))  # type: ignore[arg-type]
                continue
            try:
                bounds, counts = decode_buckets(bytes(blob))
            except ValueError as exc:
                raise StoreError(
                    f"{self.url}: window {r[0]} {r[1]} at {r[3]}: unreadable buckets: {exc}"
                ) from exc
            out.append(Window(r[0], r[1], labels, *r[3:18], bounds, counts))  # type: ignore[arg-type,call-arg]
        return out


def _buckets_blob(w: Window) -> bytes:
    """The ``buckets`` column of a window that kept its bucket counts."""
    try:
        return encode_buckets(w.bucket_bounds, w.bucket_counts)
    except ValueError as exc:
        raise StoreError(f"window {w.source} {w.signal} at {w.start}: {exc}") from exc


def _no_partition(exc: StoreError) -> bool:
    """Whether a write failed for want of a partition (SQLSTATE 23514, check_violation)."""
    cause = getattr(exc.__cause__, "orig", exc.__cause__)
    return getattr(cause, "sqlstate", None) == "23514" and "no partition" in str(cause)


def _reason(exc: BaseException) -> str:
    """The driver's own message (one line), without SQLAlchemy's boilerplate."""
    orig = getattr(exc, "orig", None)
    message = str(orig if orig is not None else exc)
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("(Background on this error")]
    return "; ".join(lines) or type(exc).__name__
