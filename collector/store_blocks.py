"""Packed hours (SQLite): each series' windows of one source-hour kept as one BLOB of float64.

Python's sqlite3 makes an object per value it hands back: 1.83 µs a row of the plan's
columns, 23 s of CPU for the 12.75 M windows of 100 engines × 7 days, before any conversion
(benchmarks/bench_plan.py). ``window_blocks`` (collector/models.py, schema 6) keeps a copy
of the windows of every complete UTC hour, one row per (source, hour, series) whose ``data``
is BLOCK_COLUMNS × n little-endian float64 (row-major, NaN for NULL, rows in start order);
``numpy.frombuffer`` reads a whole store's blocks joined together as one 2-D array, ~60× fewer
objects crossing the driver. ``windows`` stays the table of record: every other reader and
every write use it.

The promise, kept in ``packed_hours``: a (source, hour) row there means the blocks of that
hour hold every window of the source that starts in it. A window write deletes the row and the
blocks of the hours it touches in its own transaction (collector/store.py), so a re-written
window is never read twice or stale; the hour is read from ``windows`` until it is packed
again. Packing (:func:`pack_source`) reads an hour's rows and writes its blocks and its
``packed_hours`` row in one write transaction (SQLite serializes writers: no write can slip
in between). The store packs a source's complete hours when a write of it reaches a newer
hour (:data:`LOOKBACK_S` back at most); migration 5 -> 6 packs the whole store.

PostgreSQL has the tables (one schema) but leaves them empty: its binary COPY already reads
columns without a Python object per value (collector/store_frame_pg.py).
"""

from __future__ import annotations

import itertools
import math
import sqlite3
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from collector.store_columns import Series, dtype_of

if TYPE_CHECKING:
    import numpy.typing as npt

    from collector.store_columns import IntArray

BLOCK_S = 3_600.0
BLOCK_COLUMNS = ("start", "length_s", "samples", "delta", "rate", "resets", "mean", "min", "max",
                 "last", "p50", "p90", "p99", "sum_delta")  # fmt: skip
# how far back a write's first sight of a source packs its complete hours (a restart)
LOOKBACK_S = 48 * BLOCK_S
SEP = "\x1f"  # never raw in a series key (hex), a kind, or labels JSON (escapes controls)

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


def hour_of(start: float) -> float:
    """The UTC hour (epoch s) a window starting at ``start`` is packed in."""
    return math.floor(start / BLOCK_S) * BLOCK_S


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


def _marks(values: Sequence[str]) -> str:
    return ", ".join("?" * len(values))


def covered(
    raw: sqlite3.Connection, wanted: Sequence[str] | None, since: float | None, until: float | None
) -> dict[str, list[float]]:
    """Packed hours by source (sorted) that overlap [since, until)."""
    sql = "SELECT source, hour FROM packed_hours WHERE 1 = 1"
    params: list[object] = []
    if wanted is not None:
        sql += f" AND source IN ({_marks(wanted)})"
        params += list(wanted)
    if since is not None:
        sql += " AND hour >= ?"
        params.append(hour_of(since))
    if until is not None:
        sql += " AND hour < ?"
        params.append(until)
    out: dict[str, list[float]] = {}
    for source, hour in raw.execute(sql, params):
        out.setdefault(str(source), []).append(float(hour))
    for hours in out.values():
        hours.sort()
    return out


def uncovered(
    hours: Sequence[float], since: float | None, until: float | None
) -> list[tuple[float, float]]:
    """The parts of [since, until) (±inf when None) outside the packed ``hours`` (sorted)."""
    lo = -math.inf if since is None else since
    hi = math.inf if until is None else until
    out: list[tuple[float, float]] = []
    at = lo
    for hour in hours:
        if hour > at:
            out.append((at, min(hour, hi)))
        at = max(at, hour + BLOCK_S)
    if at < hi:
        out.append((at, hi))
    return [(a, b) for a, b in out if a < b]


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
        sql += f" AND +signal IN ({_marks(signals)})"
        extra = tuple(signals)
    out = []
    for source in all_sources:
        for a, b in uncovered(cover.get(source, []), since, until):
            out.append((sql, (source, a, b, *extra)))
    return out


def read_blocks(
    raw: sqlite3.Connection,
    wanted: Sequence[str] | None,
    *,
    signals: Sequence[str] | None,
    since: float | None,
    until: float | None,
    numeric: Sequence[str],
    tail: tuple[list[Series], IntArray, dict[str, npt.NDArray[Any]]],
) -> tuple[list[Series], IntArray, dict[str, npt.NDArray[Any]]]:
    """The packed windows with since <= start < until, then the rows of ``tail`` (read from
    ``windows``): series, each row's series code, and the ``numeric`` columns."""
    import numpy as np

    sql = "SELECT source, signal, kind, labels, n, columns, data FROM window_blocks WHERE 1 = 1"
    params: list[object] = []
    if signals is not None:
        sql += f" AND signal IN ({_marks(signals)})"
        params += list(signals)
    if wanted is not None:
        sql += f" AND source IN ({_marks(wanted)})"
        params += list(wanted)
    if since is not None:
        sql += " AND hour >= ?"
        params.append(hour_of(since))
    if until is not None:
        sql += " AND hour < ?"
        params.append(until)
    tail_series, tail_sid, tail_nums = tail
    ids: dict[Series, int] = {}
    codes: list[int] = []
    counts: list[int] = []
    masks: list[int] = []
    datas: list[bytes] = []
    for source, signal, kind, labels, n, mask, data in raw.execute(sql, params):
        key = (source, signal, kind, labels)
        code = ids.get(key)
        if code is None:
            code = ids[key] = len(ids)
        codes.append(code)
        counts.append(n)
        masks.append(mask)
        datas.append(data)
    n_blocks = np.asarray(counts, dtype=np.int64)
    packed = int(n_blocks.sum())
    total = packed + len(tail_sid)
    nums: dict[str, npt.NDArray[Any]] = {
        name: np.full(total, np.nan) if dtype_of(name) is np.float64 else np.zeros(total, np.int64)
        for name in numeric
    }
    offsets = np.cumsum(n_blocks) - n_blocks  # each block's first row
    by_mask = np.asarray(masks, dtype=np.int64)
    for mask in np.unique(by_mask).tolist():
        which = np.flatnonzero(by_mask == mask)
        present = [i for i in range(len(BLOCK_COLUMNS)) if mask >> i & 1]
        table = np.frombuffer(b"".join([datas[b] for b in which.tolist()]), dtype="<f8")
        table = table.reshape(-1, len(present))
        sizes = n_blocks[which]
        at = np.repeat(offsets[which] - (np.cumsum(sizes) - sizes), sizes)
        at += np.arange(len(table), dtype=np.int64)  # each packed row's place in the frame
        for j, i in enumerate(present):
            name = BLOCK_COLUMNS[i]
            if name in nums:
                nums[name][at] = table[:, j]
    del datas
    series = list(ids)
    lut = np.empty(len(tail_series), dtype=np.int64)
    for j, s in enumerate(tail_series):
        code = ids.get(s)
        if code is None:
            code = ids[s] = len(series)
            series.append(s)
        lut[j] = code
    sid = np.concatenate([np.repeat(np.asarray(codes, dtype=np.int64), n_blocks), lut[tail_sid]])
    for name in numeric:
        nums[name][packed:] = tail_nums[name]
    if since is not None or until is not None:
        lo = -math.inf if since is None else since
        hi = math.inf if until is None else until
        start = nums["start"]
        inside = (start >= lo) & (start < hi)
        if not inside.all():
            keep = np.flatnonzero(inside)
            sid = sid[keep]
            nums = {name: values[keep] for name, values in nums.items()}
    return series, sid, nums
