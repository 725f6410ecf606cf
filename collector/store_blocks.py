"""Packed hours: each series' windows of one source-hour kept as one BLOB of float64.

Reading 12.75 M windows (100 engines × 7 days) as rows costs a Python object per value on
SQLite (1.83 µs a row of the plan's columns, 23 s of CPU) and ~1 µs of the server's CPU per
row on PostgreSQL (benchmarks/bench_plan.py). ``window_blocks`` (collector/models.py,
schema 6; on PostgreSQL from schema 7, partitioned by day) keeps a copy of the windows of
every complete UTC hour, one row per (source, hour, series) whose ``data`` is
BLOCK_COLUMNS × n float64 (row-major, NaN for NULL, rows in start order; only the columns
whose bit is set in ``columns``, the others being NULL in every row). ``numpy.frombuffer``
reads a few thousand blocks at a time joined together as one 2-D array: ~212 k blobs
instead of 12.75 M rows. ``windows`` stays the table of record: every other reader and every
write use it. The values are little-endian on SQLite and big-endian on PostgreSQL, where the server
packs them with ``float8send``: swapping them there costs ~1 µs of the server's CPU a value
(tens of seconds a pack of the bench store) where the reader's swap, done in the copy it
makes anyway, costs ~0.05 s a plan (:data:`BYTE_ORDER`).

The promise, kept in ``packed_hours``: a (source, hour) row there means the blocks of that
hour hold every window of the source that starts in it. A window write deletes the row and
the blocks of the hours it touches in its own transaction, so a re-written window is never
read twice or stale; the hour is read from ``windows`` until it is packed again. Blocks
without their ``packed_hours`` row are never read (retention withdraws the promise before it
drops the blocks). The store packs a source's complete hours when a write of it reaches a
newer hour (:data:`LOOKBACK_S` back at most); ``Store.pack_windows`` packs them all.

How each backend keeps the promise when several processes write:

* SQLite (collector/store_blocks_sqlite.py) serializes writers: packing an hour reads its
  rows and writes its blocks in one write transaction, no write can slip in between.
* PostgreSQL (collector/store_blocks_pg.py): a transaction-scoped advisory lock per
  (source, hour), taken by writers in shared mode and by packers in exclusive mode, always
  in the order of the keys (no deadlock); a pack either sees a write's rows or the write
  deletes the pack after it. The packing itself is one ``INSERT … SELECT`` on the server.

This module holds what both share: the format, the hours, and the statements that read the
promise and the blocks (SQLAlchemy Core, compiled for either); collector/store_blocks_decode.py
turns the blocks read into a frame's columns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, and_, func, select

from collector.models import ClusterRow, EngineRow, PackedHourRow, TargetRow, WindowBlockRow
from collector.store_columns import Series, compiled_sql

if TYPE_CHECKING:
    import numpy.typing as npt

    from collector.store_columns import IntArray

BLOCK_S = 3_600.0
BLOCK_COLUMNS = ("start", "length_s", "samples", "delta", "rate", "resets", "mean", "min", "max",
                 "last", "p50", "p90", "p99", "sum_delta")  # fmt: skip
# how far back a write's first sight of a source packs its complete hours (a restart)
LOOKBACK_S = 48 * BLOCK_S
SEP = "\x1f"  # never raw in a series key (hex), a kind, or labels JSON (escapes controls)
BYTE_ORDER = {"sqlite": "<", "postgresql": ">"}  # of the float64 in ``data``, per backend
# One block as read: source, signal, kind, labels, rows, column bitmask, data.
Block = tuple[str, str, str, str, int, int, bytes]
Frame = tuple[list[Series], "IntArray", dict[str, "npt.NDArray[Any]"]]


def hour_of(start: float) -> float:
    """The UTC hour (epoch s) a window starting at ``start`` is packed in."""
    return math.floor(start / BLOCK_S) * BLOCK_S


def due_hours(newest: dict[str, float], seen: dict[str, float]) -> dict[str, float]:
    """The sources whose writes reached a newer hour than ``seen`` (updated), each with the
    start of the hours to pack (LOOKBACK_S before that hour, which stays rows)."""
    due = {}
    for source, start in newest.items():
        hour = hour_of(start)
        last = seen.get(source)
        if last is None or hour > last:
            due[source] = hour - LOOKBACK_S
            seen[source] = hour
    return due


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


def wanted_sources(
    conn: Connection, sources: Sequence[str] | None, cluster: str | None
) -> list[str] | None:
    """The sources a read keeps (sorted; None: every source): ``sources``, narrowed to the
    targets and engines registered in ``cluster``."""
    wanted = None if sources is None else sorted(set(sources))
    if cluster is not None:
        in_cluster = select(ClusterRow.id).where(ClusterRow.name == cluster)
        names = {
            *conn.scalars(select(TargetRow.name).where(TargetRow.cluster_id.in_(in_cluster))),
            *conn.scalars(select(EngineRow.source).where(EngineRow.cluster_id.in_(in_cluster))),
        }
        wanted = sorted(names if wanted is None else names & set(wanted))
    return wanted


def covered(
    conn: Connection, wanted: Sequence[str] | None, since: float | None, until: float | None
) -> dict[str, list[float]]:
    """Packed hours by source (sorted) that overlap [since, until)."""
    p = PackedHourRow
    query = select(p.source, p.hour).where(*_hours(p.source, p.hour, wanted, since, until))
    out: dict[str, list[float]] = {}
    for source, hour in conn.execute(query):
        out.setdefault(str(source), []).append(float(hour))
    for hours in out.values():
        hours.sort()
    return out


def block_sql(
    conn: Connection,
    wanted: Sequence[str] | None,
    signals: Sequence[str] | None,
    since: float | None,
    until: float | None,
) -> tuple[str, Any]:
    """The SQL and parameters (for the driver) of the blocks of the packed hours (a Block
    per row) that may hold windows of the read; blocks without a promise are left out."""
    b = WindowBlockRow
    columns = (b.source, b.signal, b.kind, b.labels, b.n, b.columns, b.data)
    return compiled_sql(conn, _blocks(columns, wanted, signals, since, until))


def block_rows(
    conn: Connection,
    wanted: Sequence[str] | None,
    signals: Sequence[str] | None,
    since: float | None,
    until: float | None,
) -> int:
    """The rows the blocks of :func:`block_sql` hold (their ``n``: no data read)."""
    query = _blocks((func.coalesce(func.sum(WindowBlockRow.n), 0),), wanted, signals, since, until)
    return int(conn.execute(query).scalar_one())


def _blocks(
    columns: Sequence[Any],
    wanted: Sequence[str] | None,
    signals: Sequence[str] | None,
    since: float | None,
    until: float | None,
) -> Any:
    b, p = WindowBlockRow, PackedHourRow
    query = select(*columns).select_from(b).join(p, and_(p.source == b.source, p.hour == b.hour))
    if signals is not None:
        query = query.where(b.signal.in_(list(signals)))
    return query.where(*_hours(b.source, b.hour, wanted, since, until))


def _hours(
    source: Any, hour: Any, wanted: Sequence[str] | None, since: float | None, until: float | None
) -> list[Any]:
    out = []
    if wanted is not None:
        out.append(source.in_(list(wanted)))
    if since is not None:
        out.append(hour >= hour_of(since))
    if until is not None:
        out.append(hour < until)
    return out
