"""PostgreSQL's ``chunks`` and ``chunks_5m``: range-partitioned on their time, one partition
per UTC day.

The writer makes a day's partitions before sealing its hours (:class:`DayPartitions`, under
an advisory lock), created free-standing then attached so reads and writes go on; no DEFAULT
partition. :func:`drop_partitions_before` detaches whole days ``CONCURRENTLY`` and drops
them.

Design: store/DESIGN.md#partitions
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

from sqlalchemy import Column, Connection, Engine, MetaData, Table

from core.errors import StoreError
from store.tables import Chunk5mRow, ChunkRow

DAY_S = 86_400
PARENT = "chunks"
PARENTS = ("chunks", "chunks_5m")
_EPOCH = datetime.date(1970, 1, 1)
MAX_ABS_START = 2.0**53  # |start| beyond this has no exact day bounds in a float8 range
_PARTITION_LOCK = 0x6B76730070617274  # pg_advisory_xact_lock key: making partitions
_PRUNE_LOCK = 0x6B76730064726F70  # pg_advisory_lock key: dropping partitions
_BOUND = re.compile(r"FOR VALUES FROM \((.+)\) TO \((.+)\)")


def _partitioned(model: Table, key: str) -> Table:
    return Table(
        model.name,
        MetaData(),
        *(Column(c.name, c.type, nullable=c.nullable, primary_key=c.primary_key)
          for c in model.columns),
        postgresql_partition_by=f"RANGE ({key})",
    )  # fmt: skip


PARTITIONED = {
    "chunks": _partitioned(cast(Table, ChunkRow.__table__), "hour"),
    "chunks_5m": _partitioned(cast(Table, Chunk5mRow.__table__), "day"),
}


def day_of(start: float) -> int:
    """The UTC day (days since 1970-01-01) a window start falls in (``//`` is exact)."""
    return int(start // DAY_S)


def check_start(start: float, what: str) -> None:
    """Refuse a start no day partition can hold exactly (|start| >= 2**53 s)."""
    if not abs(start) < MAX_ABS_START:
        raise StoreError(
            f"{what} starts at {start}, outside what PostgreSQL's day partitions of chunks hold "
            f"(|start| < 2**53 s)"
        )


def partition_name(day: int, parent: str = PARENT) -> str:
    """``chunks_pYYYYMMDD`` (``chunks_pdN`` / ``chunks_pdmN`` outside years 1-9999), or the
    same of ``parent``."""
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


def create(conn: Connection, parent: str) -> None:
    """Create the partitioned ``parent`` (no partition yet: the writers make them)."""
    PARTITIONED[parent].create(conn)


def _schema(conn: Connection) -> str:
    return str(
        conn.exec_driver_sql(
            "SELECT relnamespace::regnamespace::text FROM pg_class "
            f"WHERE oid = '{PARENT}'::regclass"
        ).scalar_one()
    )


def make_days(conn: Connection, days: Iterable[int]) -> list[str]:
    """Make and attach the partitions of ``days`` that are missing, in the
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
    """One partition of ``chunks``: its name and [lo, hi) bounds (±inf: MINVALUE /
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


WINDOWS_IN_CHUNKS = "coalesce(sum(n), 0)"  # the windows of a set of chunks


def count_windows(conn: Connection, parts: Iterable[Partition]) -> int:
    """The windows the chunks of these partitions hold."""
    return sum(
        int(conn.exec_driver_sql(f'SELECT {WINDOWS_IN_CHUNKS} FROM "{p.name}"').scalar_one())
        for p in parts
    )


def drop_partitions_before(
    engine: Engine, cutoff: float, parent: str = PARENT
) -> tuple[list[Partition], int]:
    """Detach (concurrently) and drop every partition of ``parent`` wholly older than
    ``cutoff``; return them and the windows they held. One prune at a time per database (an
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
                rows += int(
                    conn.exec_driver_sql(
                        f"SELECT {WINDOWS_IN_CHUNKS} FROM {qualified}"
                    ).scalar_one()
                )
                conn.exec_driver_sql(f"DROP TABLE {qualified}")
                dropped.append(part)
            return dropped, rows
        finally:
            conn.exec_driver_sql(f"SELECT pg_advisory_unlock({_PRUNE_LOCK})")
