"""PostgreSQL's ``windows``: range-partitioned on ``start``, one partition per UTC day.

The partitioned table has the model's columns (collector.models.WindowRow) with a 64-bit
``id`` (a sequence, no longer unique alone: PostgreSQL wants every unique key of a
partitioned table to hold the partition key, so the primary key is (id, start) and the
windows' key (source, start, series_key) already holds it) and the model's indexes, the BRIN
index on ``start`` among them, made on the parent so that every partition gets them.

Partitions are named ``windows_pYYYYMMDD`` and hold [day, day + 1) in epoch seconds. The
writer makes the days of the rows it is about to write, and the day after the newest, before
writing them (:class:`DayPartitions`: once per day per Store, under an advisory lock so that
collectors racing for the same day both succeed). A partition is made as a free-standing
table then attached, which locks the parent in SHARE UPDATE EXCLUSIVE mode (reads and writes
go on) where ``CREATE TABLE … PARTITION OF`` would lock it exclusively. There is no DEFAULT
partition: a catch-all would hide a writer that failed to make its day, could not be dropped
whole by retention, and would have to be scanned (and emptied of the day) before each new
day's partition could be attached; a row without its day's partition is an error instead.

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

from collector.errors import StoreError
from collector.models import WindowRow

DAY_S = 86_400
PARENT = "windows"
_EPOCH = datetime.date(1970, 1, 1)
MAX_ABS_START = 2.0**53  # |start| beyond this has no exact day bounds in a float8 range
_PARTITION_LOCK = 0x6B76730070617274  # pg_advisory_xact_lock key: making partitions
_PRUNE_LOCK = 0x6B76730064726F70  # pg_advisory_lock key: dropping partitions
_BOUND = re.compile(r"FOR VALUES FROM \((.+)\) TO \((.+)\)")


def _partitioned_table() -> Table:
    """The ``windows`` table as PostgreSQL holds it (see the module docstring)."""
    model = cast(Table, WindowRow.__table__)
    columns = [
        Column("id", BigInteger, primary_key=True, autoincrement=True)
        if c.name == "id"
        else Column(c.name, c.type, nullable=c.nullable, primary_key=c.name == "start")
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
        PARENT, MetaData(), *columns, *uniques, *indexes, postgresql_partition_by="RANGE (start)"
    )


PARTITIONED = _partitioned_table()


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


def partition_name(day: int) -> str:
    """``windows_pYYYYMMDD`` (``windows_pdN`` / ``windows_pdmN`` outside years 1-9999)."""
    try:
        return f"{PARENT}_p{_EPOCH + datetime.timedelta(days=day):%Y%m%d}"
    except OverflowError:
        return f"{PARENT}_pd{day}" if day >= 0 else f"{PARENT}_pdm{-day}"


def is_partitioned(conn: Connection) -> bool:
    """Whether ``windows`` (as the search path finds it) is a partitioned table."""
    return bool(
        conn.exec_driver_sql(
            "SELECT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = "
            f"to_regclass('{PARENT}'))"
        ).scalar()
    )


def create(conn: Connection) -> None:
    """Create the partitioned ``windows`` (no partition yet: the writer makes them)."""
    PARTITIONED.create(conn)


def _schema(conn: Connection) -> str:
    return str(
        conn.exec_driver_sql(
            "SELECT relnamespace::regnamespace::text FROM pg_class "
            f"WHERE oid = '{PARENT}'::regclass"
        ).scalar_one()
    )


def make_days(conn: Connection, days: Iterable[int]) -> list[str]:
    """Make and attach the partitions of ``days`` that are missing, in the caller's
    transaction, serialised with other writers by an advisory lock; the names made."""
    conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PARTITION_LOCK})")
    attached = {p.name for p in partitions(conn)}
    schema = _schema(conn)
    made = []
    for day in sorted(set(days)):
        name = partition_name(day)
        if name in attached:
            continue
        lo, hi = day * DAY_S, (day + 1) * DAY_S  # exact in float8 for any |start| < 2**53
        # a table of that name that is not attached is what a prune interrupted between its
        # detach and its drop left: it holds that day's rows, so it is attached again
        conn.exec_driver_sql(
            f'CREATE TABLE IF NOT EXISTS {schema}."{name}" (LIKE {schema}.{PARENT} '
            "INCLUDING DEFAULTS INCLUDING STORAGE)"
        )
        conn.exec_driver_sql(
            f'ALTER TABLE {schema}.{PARENT} ATTACH PARTITION {schema}."{name}" '
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


def partitions(conn: Connection) -> list[Partition]:
    """The partitions of ``windows``, oldest first (none when it is not partitioned)."""
    rows = conn.exec_driver_sql(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), i.inhdetachpending "
        "FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        f"WHERE i.inhparent = to_regclass('{PARENT}')"
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


def drop_partitions_before(engine: Engine, cutoff: float) -> tuple[list[Partition], int]:
    """Detach (concurrently) and drop every partition wholly older than ``cutoff``; return
    them and the rows they held. One prune at a time per database (an advisory lock); a
    detach an earlier prune left pending is finished first."""
    with engine.connect() as raw:
        conn = raw.execution_options(isolation_level="AUTOCOMMIT")
        conn.exec_driver_sql(f"SELECT pg_advisory_lock({_PRUNE_LOCK})")
        try:
            schema = _schema(conn)
            dropped, rows = [], 0
            for part in wholly_before(partitions(conn), cutoff):
                qualified = f'{schema}."{part.name}"'
                how = "FINALIZE" if part.detach_pending else "CONCURRENTLY"
                conn.exec_driver_sql(
                    f"ALTER TABLE {schema}.{PARENT} DETACH PARTITION {qualified} {how}"
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
    names = ", ".join(c.name for c in PARTITIONED.columns)
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
