"""PostgreSQL's ``windows`` and ``window_blocks``: range-partitioned, one partition per UTC day.

``windows`` is partitioned on ``start``, ``window_blocks`` (the packed hours,
collector/store_blocks.py) on ``hour``. Each partitioned table has its model's columns
(collector.models.WindowRow / WindowBlockRow) with a 64-bit ``id`` (a sequence, no longer
unique alone: PostgreSQL wants every unique key of a partitioned table to hold the partition
key, so the primary key is (id, start) or (id, hour), and the models' unique keys already
hold it) and the model's indexes, the BRIN index on ``windows.start`` among them, made on the
parent so that every partition gets them. The packs' ``data`` is compressed with lz4 where
the server has it (a read decompresses ~2× faster than pglz, for a few % more space).

Partitions are named ``windows_pYYYYMMDD`` (``window_blocks_pYYYYMMDD``) and hold [day, day + 1)
in epoch seconds. The writer makes the days of the rows it is about to write, and the day
after the newest, before writing them (:class:`DayPartitions`: once per day per Store, under an
advisory lock so that collectors racing for the same day both succeed); each day is made for
both tables at once, so a day's packs always have their partition. A partition is made as a
free-standing table then attached, which locks the parent in SHARE UPDATE EXCLUSIVE mode
(reads and writes go on) where ``CREATE TABLE … PARTITION OF`` would lock it exclusively. There
is no DEFAULT partition: a catch-all would hide a writer that failed to make its day, could not
be dropped whole by retention, and would have to be scanned (and emptied of the day) before
each new day's partition could be attached; a row without its day's partition is an error
instead.

Retention (:func:`drop_partitions_before`) detaches the partitions wholly older than a
cutoff ``CONCURRENTLY`` (PostgreSQL 14 or newer: writers and readers are never blocked, the
detach waits for the queries that still see the partition), counts their rows and drops
them; the rows of the day at the cutoff are left to collector.retention's batched deletes.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

from sqlalchemy import BigInteger, Column, Connection, Engine, Index, MetaData, Table, text
from sqlalchemy import UniqueConstraint as Unique

from collector.models import WindowBlockRow, WindowRow
from core.errors import StoreError

DAY_S = 86_400
PARENT = "windows"
BLOCKS = "window_blocks"
PARENTS = (PARENT, BLOCKS)  # windows first: retention drops a day's rows before its packs
_EPOCH = datetime.date(1970, 1, 1)
MAX_ABS_START = 2.0**53  # |start| beyond this has no exact day bounds in a float8 range
_PARTITION_LOCK = 0x6B76730070617274  # pg_advisory_xact_lock key: making partitions
_PRUNE_LOCK = 0x6B76730064726F70  # pg_advisory_lock key: dropping partitions
_BOUND = re.compile(r"FOR VALUES FROM \((.+)\) TO \((.+)\)")


def _partitioned_table(model: Table, key: str) -> Table:
    """``model``'s table as PostgreSQL holds it, partitioned on ``key`` (module docstring)."""
    columns = [
        Column("id", BigInteger, primary_key=True, autoincrement=True)
        if c.name == "id"
        else Column(c.name, c.type, nullable=c.nullable, primary_key=c.name == key)
        for c in model.columns
    ]
    uniques = [
        Unique(*c.columns.keys(), name=c.name) for c in model.constraints if isinstance(c, Unique)
    ]
    indexes = [
        Index(ix.name, *(c.name for c in ix.columns), unique=ix.unique, **ix.dialect_kwargs)
        for ix in model.indexes
    ]
    return Table(
        model.name, MetaData(), *columns, *uniques, *indexes,
        postgresql_partition_by=f"RANGE ({key})",
    )  # fmt: skip


PARTITIONED = _partitioned_table(cast(Table, WindowRow.__table__), "start")
PARTITIONED_BLOCKS = _partitioned_table(cast(Table, WindowBlockRow.__table__), "hour")
_LZ4 = (  # whether the server was built with lz4 (the setting lists it only then)
    "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
)


def day_of(start: float) -> int:
    """The UTC day (days since 1970-01-01) a window start falls in (``//`` is exact)."""
    return int(start // DAY_S)


def check_start(start: float, what: str) -> None:
    """Refuse a start no day partition can hold exactly (|start| >= 2**53 s)."""
    if not abs(start) < MAX_ABS_START:
        raise StoreError(
            f"{what} starts at {start}, outside what PostgreSQL's day partitions of windows hold "
            f"(|start| < 2**53 s)"
        )


def partition_name(day: int, parent: str = PARENT) -> str:
    """``windows_pYYYYMMDD`` (``windows_pdN`` / ``windows_pdmN`` outside years 1-9999), or
    the same of ``parent``."""
    try:
        return f"{parent}_p{_EPOCH + datetime.timedelta(days=day):%Y%m%d}"
    except OverflowError:
        return f"{parent}_pd{day}" if day >= 0 else f"{parent}_pdm{-day}"


def is_partitioned(conn: Connection, parent: str = PARENT) -> bool:
    """Whether ``parent`` (as the search path finds it) is a partitioned table."""
    return bool(
        conn.exec_driver_sql(
            "SELECT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = "
            f"to_regclass('{parent}'))"
        ).scalar()
    )


def create(conn: Connection, parent: str = PARENT) -> None:
    """Create the partitioned ``parent`` (no partition yet: the writer makes them)."""
    if parent == PARENT:
        PARTITIONED.create(conn)
        return
    PARTITIONED_BLOCKS.create(conn)
    if conn.exec_driver_sql(_LZ4).scalar():
        conn.exec_driver_sql(f"ALTER TABLE {BLOCKS} ALTER COLUMN data SET COMPRESSION lz4")


def partition_blocks(conn: Connection) -> None:
    """Schema 6 -> 7 on PostgreSQL: ``window_blocks`` (which schema 6 left empty there)
    made again partitioned, any pack promised before withdrawn (the blocks were never
    written), and its partitions of the days ``windows`` has made."""
    if not is_partitioned(conn, BLOCKS):
        conn.exec_driver_sql(f"DROP TABLE {BLOCKS}")
        conn.exec_driver_sql("DELETE FROM packed_hours")
        create(conn, BLOCKS)
    make_days(conn, (p.day for p in partitions(conn) if p.day is not None))


def _schema(conn: Connection) -> str:
    return str(
        conn.exec_driver_sql(
            "SELECT relnamespace::regnamespace::text FROM pg_class "
            f"WHERE oid = '{PARENT}'::regclass"
        ).scalar_one()
    )


def make_days(conn: Connection, days: Iterable[int]) -> list[str]:
    """Make and attach the partitions of ``days`` that are missing, of both tables, in the
    caller's transaction, serialised with other writers by an advisory lock; the names made."""
    conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PARTITION_LOCK})")
    schema = _schema(conn)
    wanted = sorted(set(days))
    made = []
    for parent in PARENTS:
        attached = {p.name for p in partitions(conn, parent)}
        for day in wanted:
            name = partition_name(day, parent)
            if name in attached:
                continue
            lo, hi = day * DAY_S, (day + 1) * DAY_S  # exact in float8 for any |start| < 2**53
            # a table of that name that is not attached is what a prune interrupted between
            # its detach and its drop left: it holds that day's rows, so it is attached again
            conn.exec_driver_sql(
                f'CREATE TABLE IF NOT EXISTS {schema}."{name}" (LIKE {schema}.{parent} '
                "INCLUDING DEFAULTS INCLUDING STORAGE INCLUDING COMPRESSION)"
            )
            conn.exec_driver_sql(
                f'ALTER TABLE {schema}.{parent} ATTACH PARTITION {schema}."{name}" '
                f"FOR VALUES FROM ({lo}) TO ({hi})"
            )
            made.append(name)
    return made


class DayPartitions:
    """The days whose partition one Store knows to exist (so a write checks a set, not the
    catalog); a day is forgotten when a prune drops it or a write finds it missing."""

    def __init__(self) -> None:
        self.made: set[int] = set()

    def missing(self, days: set[int]) -> set[int]:
        return days - self.made

    def add(self, days: Iterable[int]) -> None:
        self.made.update(days)

    def forget(self, days: Iterable[int]) -> None:
        self.made.difference_update(days)


@dataclass(frozen=True, slots=True)
class Partition:
    """One partition of ``windows``: its name and [lo, hi) bounds (±inf: MINVALUE /
    MAXVALUE; a DEFAULT partition someone added has lo = hi = nan and is never dropped)."""

    name: str
    lo: float
    hi: float
    detach_pending: bool = False

    @property
    def day(self) -> int | None:
        """The UTC day, when the partition is one of the day partitions kvscope makes."""
        if self.hi - self.lo == DAY_S and self.lo % DAY_S == 0:
            return int(self.lo // DAY_S)
        return None


def _bound(raw: str) -> float:
    raw = raw.strip().strip("'")
    return {"MINVALUE": -math.inf, "MAXVALUE": math.inf}.get(raw) or float(raw)


def partitions(conn: Connection, parent: str = PARENT) -> list[Partition]:
    """The partitions of ``parent``, oldest first (none when it is not partitioned)."""
    rows = conn.exec_driver_sql(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), i.inhdetachpending "
        "FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        f"WHERE i.inhparent = to_regclass('{parent}')"
    ).all()
    out = []
    for name, bound, pending in rows:
        match = _BOUND.fullmatch(str(bound))
        lo, hi = (_bound(match[1]), _bound(match[2])) if match else (math.nan, math.nan)
        out.append(Partition(str(name), lo, hi, bool(pending)))
    return sorted(out, key=lambda p: (p.lo, p.name))


def wholly_before(parts: Iterable[Partition], cutoff: float) -> list[Partition]:
    """The partitions whose every row started before ``cutoff``."""
    return [p for p in parts if p.hi <= cutoff]


def count_rows(conn: Connection, parts: Iterable[Partition]) -> int:
    return sum(
        int(conn.exec_driver_sql(f'SELECT count(*) FROM "{p.name}"').scalar_one()) for p in parts
    )


def drop_partitions_before(
    engine: Engine, cutoff: float, parent: str = PARENT
) -> tuple[list[Partition], int]:
    """Detach (concurrently) and drop every partition of ``parent`` wholly older than
    ``cutoff``; return them and the rows they held. One prune at a time per database (an
    advisory lock); a detach an earlier prune left pending is finished first."""
    with engine.connect() as raw:
        conn = raw.execution_options(isolation_level="AUTOCOMMIT")
        conn.exec_driver_sql(f"SELECT pg_advisory_lock({_PRUNE_LOCK})")
        try:
            schema = _schema(conn)
            dropped, rows = [], 0
            for part in wholly_before(partitions(conn, parent), cutoff):
                qualified = f'{schema}."{part.name}"'
                how = "FINALIZE" if part.detach_pending else "CONCURRENTLY"
                conn.exec_driver_sql(
                    f"ALTER TABLE {schema}.{parent} DETACH PARTITION {qualified} {how}"
                )
                # detached: no writer can add to it any more, so the count is exact
                rows += int(conn.exec_driver_sql(f"SELECT count(*) FROM {qualified}").scalar_one())
                conn.exec_driver_sql(f"DROP TABLE {qualified}")
                dropped.append(part)
            return dropped, rows
        finally:
            conn.exec_driver_sql(f"SELECT pg_advisory_unlock({_PRUNE_LOCK})")


def partition_existing(conn: Connection) -> None:
    """Schema 4 -> 5 on PostgreSQL: turn an unpartitioned ``windows`` into the partitioned
    one in the migration's transaction, keeping every row and its id: the old table, its
    indexes and its sequence are renamed ``*_v4``, the partitioned table and the partitions
    of the days present are made, the rows copied, the new sequence set where the old one
    was, the old table dropped and the new one analysed (autovacuum never analyses a
    partitioned parent)."""
    if is_partitioned(conn):
        return
    old = f"{PARENT}_v4"
    schema = _schema(conn)
    sequence = conn.exec_driver_sql(f"SELECT pg_get_serial_sequence('{PARENT}', 'id')").scalar()
    conn.exec_driver_sql(f"ALTER TABLE {schema}.{PARENT} RENAME TO {old}")
    indexes = conn.exec_driver_sql(
        "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        f"WHERE i.indrelid = '{schema}.{old}'::regclass"
    ).scalars()
    for index in list(indexes):  # index (and constraint) names are unique per schema
        conn.exec_driver_sql(f'ALTER INDEX {schema}."{index}" RENAME TO "{index}_v4"')
    if sequence is not None:
        conn.exec_driver_sql(f"ALTER SEQUENCE {sequence} RENAME TO {old}_id_seq")
    create(conn)
    found = conn.exec_driver_sql(
        # floor(start / DAY) may round up to the next day just before midnight: corrected
        f"SELECT DISTINCT d - (start < d * {DAY_S})::int, abs(start) >= {MAX_ABS_START} "
        f"FROM (SELECT start, floor(start / {DAY_S}) AS d FROM {schema}.{old}) AS s"
    ).all()
    if any(far for _, far in found):
        raise StoreError(
            "windows holds rows with |start| >= 2**53 s, which no day partition holds: delete "
            "them (DELETE FROM windows WHERE abs(start) >= 2^53), then migrate again"
        )
    make_days(conn, (int(day) for day, _ in found))
    # the columns the old table has: a later schema's (windows.buckets, schema 9) are added
    # by their own step, which runs after this one; here they stay NULL
    have = set(
        conn.exec_driver_sql(
            "SELECT attname FROM pg_attribute WHERE attnum > 0 AND NOT attisdropped AND "
            f"attrelid = '{schema}.{old}'::regclass"
        ).scalars()
    )
    names = ", ".join(c.name for c in PARTITIONED.columns if c.name in have)
    conn.exec_driver_sql(
        f"INSERT INTO {schema}.{PARENT} ({names}) SELECT {names} FROM {schema}.{old}"
    )
    if sequence is not None:
        conn.exec_driver_sql(
            f"SELECT setval(pg_get_serial_sequence('{PARENT}', 'id'), last_value, is_called) "
            f"FROM {schema}.{old}_id_seq"
        )
    conn.exec_driver_sql(f"DROP TABLE {schema}.{old}")
    conn.execute(text(f"ANALYZE {PARENT}"))
