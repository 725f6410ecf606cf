"""Schema 9 -> 10: every window of ``windows`` moved into ``series``, ``head`` and ``chunks``.

The series are made in one statement (one per (source, series_key)); the rows are read in
the unique index's order (source, start, series_key), a source-hour at a time: the newest
hour of each source goes to the head as rows, every older hour to one chunk per series.
Then ``windows``, its packed copy ``window_blocks`` and ``packed_hours`` are dropped. It runs
in the migration's transaction: a failure leaves the store at schema 9, every window kept.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sqlalchemy import Connection, insert, inspect, text

from store import chunks, partitions
from store.tables import ChunkRow, HeadRow

_OLD = ("windows", "window_blocks", "packed_hours")
_VALUES = ("start", "length_s", "samples", "delta", "rate", "resets", "mean", "min", "max",
           "last", "p50", "p90", "p99", "sum_delta")  # fmt: skip
_BATCH = 2_000  # chunks or head rows per INSERT


def move_windows(conn: Connection) -> None:
    """The step (module docstring)."""
    tables = set(inspect(conn).get_table_names())
    if "windows" in tables:
        _move(conn)
    for name in _OLD:
        if name in tables:
            conn.execute(text(f"DROP TABLE {name}"))


def _move(conn: Connection) -> None:
    conn.execute(
        text(
            "INSERT INTO series (source, key, signal, labels, kind) "
            "SELECT source, series_key, min(signal), min(labels), min(kind) FROM windows "
            "GROUP BY source, series_key"
        )
    )
    ids = {(str(s), str(k)): int(i) for i, s, k in conn.execute(
        text("SELECT id, source, key FROM series")
    )}  # fmt: skip
    newest = {str(s): chunks.hour_of(float(t)) for s, t in conn.execute(
        text("SELECT source, max(start) FROM windows GROUP BY source")
    )}  # fmt: skip
    has_buckets = "buckets" in {c["name"] for c in inspect(conn).get_columns("windows")}
    sink = _Sink(conn)
    group: dict[int, list[tuple[Any, ...]]] = {}
    at: tuple[str, float] | None = None
    for source, key, row in _rows(conn, has_buckets):
        here = (source, chunks.hour_of(row[0]))
        if here != at:
            if at is not None:
                sink.put(group, at[1] >= newest[at[0]])
            group, at = {}, here
        group.setdefault(ids[(source, key)], []).append(row)
    if at is not None:
        sink.put(group, at[1] >= newest[at[0]])
    sink.flush()


def _rows(conn: Connection, has_buckets: bool) -> Iterator[tuple[str, str, tuple[Any, ...]]]:
    cols = ", ".join((*_VALUES, "buckets" if has_buckets else "NULL"))
    query = text(
        f"SELECT source, series_key, {cols} FROM windows ORDER BY source, start, series_key"
    )
    result = conn.execute(query.execution_options(stream_results=True, yield_per=10_000))
    for r in result:
        yield str(r[0]), str(r[1]), tuple(r[2:])


class _Sink:
    """Batches of chunks and head rows, inserted as they fill (PostgreSQL: the chunks'
    day partitions made first)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.chunks: list[dict[str, Any]] = []
        self.head: list[dict[str, Any]] = []
        self.days: set[int] = set()

    def put(self, group: dict[int, list[tuple[Any, ...]]], open_hour: bool) -> None:
        for sid, rows in group.items():
            if open_hour:
                self.head += [dict(zip(("series_id", *_VALUES, "buckets"), (sid, *r), strict=True))
                              for r in rows]  # fmt: skip
            else:
                hour = chunks.hour_of(rows[0][0])
                self.chunks.append({"series_id": sid, "hour": hour, "n": len(rows),
                                    "data": chunks.encode(rows)})  # fmt: skip
        if len(self.chunks) >= _BATCH or len(self.head) >= _BATCH:
            self.flush()

    def flush(self) -> None:
        if self.chunks:
            if self.conn.dialect.name == "postgresql":
                days = {int(c["hour"] // partitions.DAY_S) for c in self.chunks} - self.days
                if days:
                    partitions.make_days(self.conn, days)
                    self.days |= days
            self.conn.execute(insert(ChunkRow), self.chunks)
            self.chunks = []
        if self.head:
            self.conn.execute(insert(HeadRow), self.head)
            self.head = []
