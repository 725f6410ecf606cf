"""Packed hours on PostgreSQL (collector/store_blocks.py): locks, packing on the server, and
the read of the blocks.

Several processes write one PostgreSQL at once (sharded collectors, Prometheus mode) while
another may pack, so the promise of ``packed_hours`` is kept by a transaction-scoped advisory
lock per (source, hour), keyed by ``hashtextextended(source, hour)``:

* a writer upserts its rows, then takes the locks of the (source, hour)s it wrote in *shared*
  mode (writers never wait for each other) and, in a later statement (so that its snapshot
  is taken once it holds them), deletes their packs (:func:`unpack`);
* a packer takes the locks of the hours it packs in *exclusive* mode and then, in a later
  statement, reads their rows and writes their blocks and their ``packed_hours`` rows
  (:func:`pack_hours`).

Either the packer holds the lock first, commits, and the writer deletes the new pack, or the
writer does, and the packer's statement, which starts after the writer's commit, reads the
written rows. Both take their locks in the order of the keys, a transaction at most
:data:`WRITE_HOURS` or :data:`PACK_HOURS` of them (each one is an entry of the server's shared
lock table, 6,400 by default: a larger write is split, :func:`split`). Packers also take
:data:`PRUNE_KEY` in shared mode, which retention's last sweep takes exclusively
(collector/retention.py), so that no pack built from rows a prune deleted outlives the prune.

Packing is set-based, one ``INSERT … SELECT`` on the server per chunk of hours: per (source,
hour, series key) a window function ORs the columns that hold a value, and ``string_agg`` of
each row's ``float8send`` values (in start order) makes the block, big-endian
(store_blocks.BYTE_ORDER). The migration to schema 7 packs an existing store the same way,
without the locks (no writer of schema 7 runs before it commits).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy import Connection

from collector.models import WindowRow
from collector.store_blocks import BLOCK_COLUMNS, BLOCK_S, Block, hour_of

WRITE_HOURS = 256  # (source, hour)s a writer's transaction locks at most
PACK_HOURS = 48  # and a packer's (LOOKBACK_S: a source's due hours in one)
PRUNE_KEY = 0x6B7673007061636B  # pg_advisory_xact_lock key: packers (shared) vs retention
_WORK_MEM = "64MB"  # a pack's sort of a source's PACK_HOURS of rows, in memory
_FETCH = 4_096  # blocks per round trip of the read
_NULLABLE = {c.name for c in WindowRow.__table__.columns if c.nullable}
_PAIRS = "unnest(%(s)s::text[], %(h)s::float8[]) AS u(source, hour)"
_S = int(BLOCK_S)
_HOUR = f"floor(w.start / {_S}) * {_S}"  # store_blocks.hour_of, exactly


def _lock_sql(mode: str) -> str:
    return (
        f"SELECT {mode}(k) FROM (SELECT DISTINCT hashtextextended(u.source, u.hour::int8) AS k "
        f"FROM {_PAIRS}) AS d ORDER BY k"  # a volatile function runs after the sort
    )


_LOCK_SHARED = _lock_sql("pg_advisory_xact_lock_shared")
_LOCK_EXCLUSIVE = _lock_sql("pg_advisory_xact_lock")
_UNPACK = (  # the blocks go with their promise (orphan blocks are never read)
    f"WITH gone AS (DELETE FROM packed_hours AS p USING {_PAIRS} "
    "WHERE p.source = u.source AND p.hour = u.hour RETURNING p.source, p.hour) "
    "DELETE FROM window_blocks AS b USING gone WHERE b.source = gone.source "
    "AND b.hour = gone.hour"
)
_HOURS = (  # the hours of a source's windows in [lo, end), by one index seek each
    f"WITH RECURSIVE h(x) AS (SELECT (SELECT floor(min(start) / {_S}) * {_S} FROM windows "
    "WHERE source = %(s)s AND start >= %(lo)s AND start < %(end)s) UNION ALL "
    f"SELECT (SELECT floor(min(start) / {_S}) * {_S} FROM windows WHERE source = %(s)s "
    f"AND start >= h.x + {_S} AND start < %(end)s) FROM h WHERE h.x IS NOT NULL) "
    "SELECT x FROM h WHERE x IS NOT NULL AND NOT EXISTS (SELECT 1 FROM packed_hours AS p "
    "WHERE p.source = %(s)s AND p.hour = h.x) ORDER BY x"
)
SOURCES = (  # every distinct source, by index seeks (a loose index scan): CTE s(x)
    "WITH RECURSIVE s(x) AS (SELECT min(source) FROM windows UNION ALL "
    "SELECT (SELECT min(source) FROM windows WHERE source > s.x) FROM s WHERE s.x IS NOT NULL) "
)
_ORPHANS = (  # blocks a prune left without their promise: in the way of the new ones
    "DELETE FROM window_blocks AS b WHERE b.source = %(s)s AND b.hour = ANY(%(h)s::float8[]) "
    "AND NOT EXISTS (SELECT 1 FROM packed_hours AS p WHERE p.source = b.source "
    "AND p.hour = b.hour)"
)


def _value(column: str) -> str:
    if column not in _NULLABLE:
        return f"float8send(r.{column}::float8)"
    return f"float8send(coalesce(r.{column}, 'NaN'))"


def _pack_sql(where: str) -> str:
    """The statement that packs the hours of source ``%(s)s``'s windows ``w`` matching
    ``where`` that have no ``packed_hours`` row: their blocks and promises inserted, the
    windows packed returned. A column's bit is set when a row of the block holds a number
    (not NULL, not NaN), as store_blocks_sqlite.pack_hour decides; the columns that cannot be
    NULL always are. One sort of the rows (hour, series key, start) serves the window
    function, the grouping and each block's order."""
    always = sum(1 << i for i, c in enumerate(BLOCK_COLUMNS) if c not in _NULLABLE)
    bits = " | ".join(
        f"CASE WHEN w.{c} <> 'NaN' THEN {1 << i} ELSE 0 END"
        for i, c in enumerate(BLOCK_COLUMNS)
        if c in _NULLABLE
    )
    row = " || ".join(
        _value(c)
        if c not in _NULLABLE
        else f"CASE WHEN r.mask & {1 << i} <> 0 THEN {_value(c)} ELSE ''::bytea END"
        for i, c in enumerate(BLOCK_COLUMNS)
    )
    rows = (
        f"SELECT w.*, {_HOUR} AS hour, bit_or({bits}) OVER (PARTITION BY {_HOUR}, w.series_key "
        "ORDER BY w.start ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS mask "
        f"FROM windows AS w WHERE w.source = %(s)s AND ({where}) AND NOT EXISTS "
        f"(SELECT 1 FROM packed_hours AS p WHERE p.source = w.source AND p.hour = {_HOUR})"
    )
    return (
        "WITH blocks AS (INSERT INTO window_blocks (source, hour, series_key, signal, labels, "
        "kind, n, columns, data) SELECT %(s)s, r.hour, r.series_key, min(r.signal), "
        f"min(r.labels), min(r.kind), count(*), min(r.mask) | {always}, "
        f"string_agg({row}, ''::bytea ORDER BY r.start) FROM ({rows}) AS r "
        "GROUP BY r.hour, r.series_key RETURNING source, hour, n), "
        "marks AS (INSERT INTO packed_hours (source, hour) SELECT DISTINCT source, hour "
        "FROM blocks) SELECT coalesce(sum(n), 0) FROM blocks"
    )


_PACK_HOURS = _pack_sql(f"w.start >= %(lo)s AND w.start < %(hi)s AND {_HOUR} = ANY(%(h)s)")


def _pairs(pairs: Sequence[tuple[str, float]]) -> dict[str, list[Any]]:
    return {"s": [s for s, _ in pairs], "h": [h for _, h in pairs]}


def unpack(conn: Connection, pairs: Sequence[tuple[str, float]]) -> None:
    """Drop the packs of these (source, hour)s, after taking their locks in shared mode
    (inside the writing transaction, after its rows are written)."""
    if pairs:
        params = _pairs(pairs)
        conn.exec_driver_sql(_LOCK_SHARED, params)
        conn.exec_driver_sql(_UNPACK, params)


def split(rows: list[tuple[Any, ...]]) -> list[list[tuple[Any, ...]]]:
    """Window rows (source first, start fifth) in parts of at most WRITE_HOURS (source,
    hour)s each, which their transactions lock; the rows as they are when there are fewer."""
    if len({(r[0], hour_of(r[4])) for r in rows}) <= WRITE_HOURS:
        return [rows]
    parts: list[list[tuple[Any, ...]]] = []
    seen: set[tuple[str, float]] = set()
    for row in sorted(rows, key=lambda r: (r[0], r[4])):
        pair = (row[0], hour_of(row[4]))
        if pair not in seen:
            if len(seen) == WRITE_HOURS or not parts:
                parts.append([])
                seen = set()
            seen.add(pair)
        parts[-1].append(row)
    return parts


def hours_to_pack(conn: Connection, source: str, lo: float | None, before: float) -> list[float]:
    """The hours of ``source`` from ``lo`` (None: its first window) up to the hour of
    ``before`` (excluded: it may still be written) that have windows and no pack."""
    params = {"s": source, "lo": -math.inf if lo is None else hour_of(lo), "end": hour_of(before)}
    return [float(r[0]) for r in conn.exec_driver_sql(_HOURS, params)]


def chunks_to_pack(conn: Connection, source: str) -> list[list[float]]:
    """Every complete hour of ``source`` without a pack (its newest hour stays rows), in
    chunks of at most PACK_HOURS (a transaction's)."""
    newest = conn.exec_driver_sql(
        "SELECT max(start) FROM windows WHERE source = %(s)s", {"s": source}
    ).scalar()
    hours = [] if newest is None else hours_to_pack(conn, source, None, float(newest))
    return [hours[i : i + PACK_HOURS] for i in range(0, len(hours), PACK_HOURS)]


def pack_hours(conn: Connection, source: str, hours: Sequence[float], *, lock: bool = True) -> int:
    """Pack these hours of ``source`` (at most PACK_HOURS) under their exclusive locks, in the
    caller's transaction; return the windows packed (hours packed meanwhile are skipped).
    ``lock=False``: the migration's, which no writer of this schema can run beside."""
    if not hours:
        return 0
    if len(hours) > PACK_HOURS:
        raise ValueError(f"{len(hours)} hours to pack in one transaction (at most {PACK_HOURS})")
    if lock:
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock_shared({PRUNE_KEY})")
        conn.exec_driver_sql(_LOCK_EXCLUSIVE, _pairs([(source, h) for h in hours]))
    conn.exec_driver_sql(f"SET LOCAL work_mem = '{_WORK_MEM}'")
    params = {"s": source, "h": list(hours), "lo": min(hours), "hi": max(hours) + BLOCK_S}
    conn.exec_driver_sql(_ORPHANS, params)
    return int(conn.exec_driver_sql(_PACK_HOURS, params).scalar_one())


def sources(conn: Connection) -> list[str]:
    """Every source with a window."""
    return [
        str(r[0]) for r in conn.exec_driver_sql(SOURCES + "SELECT x FROM s WHERE x IS NOT NULL")
    ]


def pack_existing(conn: Connection) -> int:
    """Schema 6 -> 7: every complete hour of every source packed (each one's newest hour
    stays rows) as Store.pack_windows packs them, but in the migration's transaction and
    without the locks (module docstring); the windows packed."""
    return sum(
        pack_hours(conn, source, chunk, lock=False)
        for source in sources(conn)
        for chunk in chunks_to_pack(conn, source)
    )


def read_blocks(conn: Connection, sql: str, params: Any) -> Iterator[Block]:
    """The blocks of ``sql`` (store_blocks.block_sql), a few thousand per round trip (a
    server-side cursor, binary: the data as sent, no hex); the next few thousand are fetched
    in a thread while these are used (the server works meanwhile)."""
    raw = conn.connection.driver_connection
    with (
        raw.cursor(name="kvscope_blocks", binary=True) as cursor,  # type: ignore[union-attr]
        ThreadPoolExecutor(max_workers=1) as fetcher,
    ):
        cursor.itersize = _FETCH
        cursor.execute(sql, params or None)
        pending = fetcher.submit(cursor.fetchmany, _FETCH)
        while rows := pending.result():
            pending = fetcher.submit(cursor.fetchmany, _FETCH)
            yield from rows
