"""Packed hours on SQLite (collector/store_blocks.py): packing, unpacking, the rows no pack
covers.

SQLite serializes writers, so the promise needs no lock: :func:`pack_hour` reads an hour's
rows and writes its blocks and its ``packed_hours`` row in one write transaction, and a
window write drops the packs of the hours it touches (:func:`unpack`) in its own. The rows
are read by Python (one ``numpy.array`` per series), the blocks little-endian.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from collector.store_blocks import BLOCK_COLUMNS, BLOCK_S, hour_of, uncovered

_ROWS = (
    f"SELECT series_key, signal, labels, kind, {', '.join(BLOCK_COLUMNS)} FROM windows "
    "WHERE source = ? AND start >= ? AND start < ? ORDER BY series_key, start"
)
_SOURCES = (  # distinct sources by one index seek each (the unique index leads with source)
    "WITH RECURSIVE s(x) AS (SELECT (SELECT min(source) FROM windows) UNION ALL "
    "SELECT (SELECT min(source) FROM windows WHERE source > x) FROM s WHERE x IS NOT NULL) "
    "SELECT x FROM s WHERE x IS NOT NULL"
)
UNPACK_SQL = (
    "DELETE FROM packed_hours WHERE source = ? AND hour = ?",
    "DELETE FROM window_blocks WHERE source = ? AND hour = ?",
)


def unpack(raw: sqlite3.Connection, pairs: Iterable[tuple[str, float]]) -> None:
    """Drop the packs of these (source, hour)s (inside the writing transaction)."""
    todo = list(pairs)
    if todo:
        for sql in UNPACK_SQL:
            raw.executemany(sql, todo)


def sources(raw: sqlite3.Connection) -> list[str]:
    """Every source with a window."""
    return [str(r[0]) for r in raw.execute(_SOURCES)]


def pack_hour(raw: sqlite3.Connection, source: str, hour: float) -> int:
    """Pack one source-hour from its rows; return the windows packed (0: none, not marked)."""
    import numpy as np

    rows = raw.execute(_ROWS, (source, hour, hour + BLOCK_S)).fetchall()
    unpack(raw, [(source, hour)])
    if not rows:
        return 0
    blocks = []
    for key, group in itertools.groupby(rows, key=lambda r: r[0]):
        part = list(group)
        values = np.array([r[4:] for r in part], dtype="<f8")  # None -> NaN
        present = ~np.isnan(values).all(axis=0)  # a column NULL in every row is left out
        mask = sum(1 << i for i in np.flatnonzero(present).tolist())
        first = part[0]
        blocks.append((source, hour, key, first[1], first[2], first[3], len(part), mask,
                       np.ascontiguousarray(values[:, present]).tobytes()))  # fmt: skip
    raw.executemany(
        "INSERT INTO window_blocks (source, hour, series_key, signal, labels, kind, n, columns, "
        "data) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        blocks,
    )
    raw.execute("INSERT INTO packed_hours (source, hour) VALUES (?, ?)", (source, hour))
    return len(rows)


def pack_source(raw: sqlite3.Connection, source: str, lo: float | None, before: float) -> int:
    """Pack the hours of ``source`` from ``lo`` (None: its first window) up to the hour of
    ``before`` (excluded: that hour may still be written) that are not packed yet."""
    if lo is None:
        first = raw.execute("SELECT min(start) FROM windows WHERE source = ?", (source,)).fetchone()
        if first[0] is None:
            return 0
        lo = float(first[0])
    lo, end = hour_of(lo), hour_of(before)
    done = {
        float(r[0])
        for r in raw.execute(
            "SELECT hour FROM packed_hours WHERE source = ? AND hour >= ? AND hour < ?",
            (source, lo, end),
        )
    }
    packed = 0
    hour = lo
    while hour < end:
        if hour not in done:
            nxt = raw.execute(  # the next window at or after this hour: skips empty hours
                "SELECT min(start) FROM windows WHERE source = ? AND start >= ? AND start < ?",
                (source, hour, end),
            ).fetchone()[0]
            if nxt is None:
                break
            if hour_of(float(nxt)) != hour:
                hour = hour_of(float(nxt))
                continue
            packed += pack_hour(raw, source, hour)
        hour += BLOCK_S
    return packed


def pack_all(raw: sqlite3.Connection) -> int:
    """Pack every complete hour of every source (each source's newest hour stays rows)."""
    packed = 0
    for source in sources(raw):
        newest = raw.execute("SELECT max(start) FROM windows WHERE source = ?", (source,))
        packed += pack_source(raw, source, None, float(newest.fetchone()[0]))
    return packed


def row_statements(
    cover: dict[str, list[float]],
    all_sources: Sequence[str],
    *,
    signals: Sequence[str] | None,
    since: float | None,
    until: float | None,
    numeric: Sequence[str],
) -> list[tuple[str, tuple[Any, ...]]]:
    """The row reads of what no pack covers: per source, a start range by the unique
    index (``+signal``: never the signal index, which would walk every source's rows)."""
    sql = (
        f"SELECT series_key || char(31) || kind || char(31) || source, {', '.join(numeric)} "
        "FROM windows WHERE source = ? AND start >= ? AND start < ?"
    )
    extra: tuple[str, ...] = ()
    if signals is not None:
        sql += f" AND +signal IN ({', '.join('?' * len(signals))})"
        extra = tuple(signals)
    out = []
    for source in all_sources:
        for a, b in uncovered(cover.get(source, []), since, until):
            out.append((sql, (source, a, b, *extra)))
    return out
