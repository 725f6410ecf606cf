"""Window writes: idempotent upserts into the head, late writes into their hour's chunk,
and the sealing of closed hours into chunks.

A window goes to the ``head`` table (one row, unique on series and start) unless its
series-hour already has a chunk: then the chunk is read, the window put in it (replacing
one of the same start) and written back in the same transaction. When a write reaches a
newer hour of a source, the source's head rows of older hours move into chunks (merged
with a chunk already there) in one transaction: a window is in the head or in a chunk,
never both. Writers of one source are serialised: SQLite has one writer at a time; on
PostgreSQL each transaction takes an advisory lock per source it touches, in order.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from itertools import islice
from typing import Any

from sqlalchemy import Connection, func, select, tuple_
from sqlalchemy.dialects import postgresql, sqlite

from core.errors import StoreError
from core.records import Window
from store import chunks, partitions, sealing
from store.buckets import encode_buckets
from store.db import Database, no_partition
from store.partitions import DAY_S, MAX_ABS_START, check_start
from store.series import SeriesIds
from store.tables import ChunkRow, HeadRow, SeriesRow

HEAD_COLUMNS = ("series_id", *chunks.COLUMNS, "buckets")
_SOURCE_LOCK = 0x6B76  # pg_advisory_xact_lock(class, hashtext(source)): one source's writes
_STAGING = "kvscope_head_in"  # a session's temporary table the head's rows are copied into
# its columns (HEAD_COLUMNS) as a binary COPY sends them: samples and resets as int8, so that
# an integer out of the head's int4 range fails the insert, as a text COPY failed
_STAGING_TYPES = ["int4", *("int8" if c in ("samples", "resets") else "float8"
                            for c in chunks.COLUMNS), "bytea"]  # fmt: skip
_STAGING_DDL = (f"CREATE TEMPORARY TABLE IF NOT EXISTS {_STAGING} ("
                + ", ".join(f"{c} {t}" for c, t in zip(HEAD_COLUMNS, _STAGING_TYPES, strict=True))
                + ") ON COMMIT DELETE ROWS")  # fmt: skip
_LOOKUP = 500  # (series, hour) pairs per chunk look-up


def _refuse_start(w: Window) -> None:
    """A StoreError for a window whose start no store holds (not finite, or on PostgreSQL
    beyond what a day partition can; partitions.check_start)."""
    if not math.isfinite(w.start):
        raise StoreError(f"window {w.source} {w.signal} has a non-finite start: {w.start}")
    check_start(w.start, f"window {w.source} {w.signal}")


def _buckets_blob(w: Window) -> bytes:
    try:
        return encode_buckets(w.bucket_bounds, w.bucket_counts)
    except ValueError as exc:
        raise StoreError(f"window {w.source} {w.signal} at {w.start}: {exc}") from exc


def merge(
    old: Sequence[chunks.Row], new: Iterable[chunks.Row], keep_fuller: bool
) -> list[chunks.Row]:
    """The chunk rows of ``old`` with ``new`` put in (same start: replaced, unless
    ``keep_fuller`` and the stored one has more samples), in start order."""
    by_start = {r[0]: r for r in old}
    for r in new:
        have = by_start.get(r[0])
        if keep_fuller and have is not None and have[2] > r[2]:
            continue
        by_start[r[0]] = r
    return [by_start[s] for s in sorted(by_start)]


class WindowWriter:
    """Store.write_windows and the sealing of closed hours (module docstring)."""

    def __init__(self, db: Database, ids: SeriesIds, batch_size: int) -> None:
        self.db = db
        self.ids = ids
        self.batch_size = batch_size
        self.sealed_below: dict[str, float] = {}  # per source: its older hours are chunks
        self._upsert: dict[bool, str] = {}

    def write(self, windows: Iterable[Window], *, keep_fuller: bool = False) -> int:
        """Upsert windows; return how many were written (Store.write_windows)."""
        self.db.require_schema()
        written = 0
        todo = iter(windows)
        while batch := list(islice(todo, self.batch_size)):
            written += self._batch(batch, keep_fuller)
        return written

    def _batch(self, ws: list[Window], keep_fuller: bool) -> int:
        newest: dict[str, float] = {}
        rows, late, missing = self._rows(ws, newest)
        if missing:
            named = {(w.source, w.signal, w.labels, w.kind) for w in missing}
            with self.db.tx(f"naming {len(named)} series", write=True) as conn:
                self.ids.resolve(conn, named)
            more, more_late, unnamed = self._rows(missing, newest)
            if unnamed:
                raise StoreError(f"{len(unnamed)} series got no id in {self.db.url}")
            late += [len(rows) + i for i in more_late]
            rows += more
        self._locked_write(rows, late, keep_fuller, sorted(newest))
        due = {}
        for source, start in newest.items():
            hour = chunks.hour_of(start)
            if self.sealed_below.get(source, -math.inf) < hour:
                due[source] = hour
        if due:
            self.seal_many(due)
        return len(ws)

    def _rows(
        self, ws: list[Window], newest: dict[str, float]
    ) -> tuple[list[tuple[Any, ...]], list[int], list[Window]]:
        """The head rows (HEAD_COLUMNS) of the windows whose series have ids, the indexes of
        those maybe in a chunk already (their source sealed past them, or not known sealed),
        and the windows without a series id yet; ``newest``: each source's newest start."""
        bound = MAX_ABS_START if self.db.dialect == "postgresql" else math.inf
        ids, sealed, inf = self.ids.ids, self.sealed_below, math.inf
        rows: list[tuple[Any, ...]] = []
        late: list[int] = []
        missing: list[Window] = []
        for w in ws:  # one pass, attributes read once: the collector's per-window cost
            start, source = w.start, w.source
            if not -bound < start < bound:
                _refuse_start(w)
            sid = ids.get((source, w.signal, w.labels))
            if sid is None:
                missing.append(w)
                continue
            if start < sealed.get(source, inf):
                late.append(len(rows))
            if start > newest.get(source, -inf):
                newest[source] = start
            rows.append((sid, start, w.length_s, w.samples, w.delta, w.rate, w.resets, w.mean,
                         w.min, w.max, w.last, w.p50, w.p90, w.p99, w.sum_delta,
                         _buckets_blob(w) if w.bucket_counts else None))  # fmt: skip
        return rows, late, missing

    def _locked_write(
        self, rows: list[tuple[Any, ...]], late: list[int], keep_fuller: bool, sources: list[str]
    ) -> None:
        """In one transaction under the sources' locks: ``rows`` into the head, those of
        ``late`` whose series-hour has a chunk into the chunk instead."""
        hour_of = chunks.hour_of
        keys = {(rows[i][0], hour_of(rows[i][1])) for i in late}
        with self.db.tx(f"writing {len(rows)} windows", write=True) as conn:
            self._lock(conn, sources)
            have = self._chunks(conn, keys) if keys else {}
            into: dict[tuple[int, float], list[chunks.Row]] = {}
            chunked: set[int] = set()  # the rows put in a chunk
            if have:
                for i in late:
                    key = (rows[i][0], hour_of(rows[i][1]))
                    if key in have:
                        into.setdefault(key, []).append(rows[i][1:])
                        chunked.add(i)
            head = [r for i, r in enumerate(rows) if i not in chunked] if chunked else rows
            made = self._upsert_head(conn, head, keep_fuller) if head else None
            if into:
                self._put_chunks(conn, have, into, keep_fuller)
        if made is not None:  # committed: the staging table stays for the session
            made[_STAGING] = True

    def _lock(self, conn: Connection, sources: Iterable[str]) -> None:
        """PostgreSQL: the sources' advisory locks, taken in one statement, in name order."""
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(
                "SELECT pg_advisory_xact_lock(%(c)s, hashtext(s)) FROM "
                "(SELECT s FROM unnest(%(s)s::text[]) AS u(s) ORDER BY s) AS ordered",
                {"c": _SOURCE_LOCK, "s": sorted(set(sources))},
            )

    def _chunks(
        self, conn: Connection, keys: set[tuple[int, float]]
    ) -> dict[tuple[int, float], bytes]:
        """The stored chunks of these (series, hour)s."""
        out: dict[tuple[int, float], bytes] = {}
        ordered = sorted(keys)
        for i in range(0, len(ordered), _LOOKUP):
            part = ordered[i : i + _LOOKUP]
            found = conn.execute(
                select(ChunkRow.series_id, ChunkRow.hour, ChunkRow.data).where(
                    tuple_(ChunkRow.series_id, ChunkRow.hour).in_(part)
                )
            )
            for sid, hour, data in found:
                out[(int(sid), float(hour))] = bytes(data)
        return out

    def _put_chunks(
        self,
        conn: Connection,
        have: dict[tuple[int, float], bytes],
        into: dict[tuple[int, float], list[chunks.Row]],
        keep_fuller: bool,
    ) -> None:
        """Merge ``into``'s rows into the chunks (``have``: those stored already) and write
        them back."""
        self._upsert_chunks(conn, self._chunk_values(have, into, keep_fuller))

    @staticmethod
    def _chunk_values(
        have: dict[tuple[int, float], bytes],
        into: dict[tuple[int, float], list[chunks.Row]],
        keep_fuller: bool,
    ) -> list[dict[str, Any]]:
        """The chunk rows of ``into``'s rows merged into the stored chunks (``have``)."""
        values = []
        for key, new in sorted(into.items()):
            old = chunks.decode(have[key]) if key in have else []
            rows = merge(old, new, keep_fuller)
            try:
                data = chunks.encode(rows)
            except ValueError as exc:
                raise StoreError(f"series {key[0]} hour {key[1]:.0f}: {exc}") from exc
            values.append({"series_id": key[0], "hour": key[1], "n": len(rows), "data": data})
        return values

    @staticmethod
    def _upsert_chunks(conn: Connection, values: list[dict[str, Any]]) -> None:
        """Insert or replace chunk rows (series_id, hour, n, data), in the order given."""
        if not values:
            return
        insert = sqlite.insert if conn.dialect.name == "sqlite" else postgresql.insert
        stmt = insert(ChunkRow)
        stmt = stmt.on_conflict_do_update(
            index_elements=["series_id", "hour"],
            set_={"n": stmt.excluded.n, "data": stmt.excluded.data},
        )
        conn.execute(stmt, values)

    def _upsert_head(
        self, conn: Connection, rows: list[tuple[Any, ...]], keep_fuller: bool
    ) -> dict[Any, Any] | None:
        """Upsert head rows; on PostgreSQL, the connection's info when this transaction made
        its staging table (the caller marks it made once the transaction commits)."""
        sql = self._upsert_sql(conn, keep_fuller)
        if conn.dialect.name == "sqlite":
            conn.exec_driver_sql(sql, rows)  # executemany: a key repeated keeps its last row
            return None
        # one statement touches a row once; a NaN goes as NaN (every read takes it for
        # unknown, as NULL), which spares a Python test per value
        unique = {(r[0], r[1]): r for r in rows}
        info = conn.connection.info
        made = None if info.get(_STAGING) else info
        with conn.connection.driver_connection.cursor() as cursor:  # type: ignore[union-attr]
            if made is not None:
                cursor.execute(_STAGING_DDL)
            # binary: no float formatted as text here nor parsed on the server
            with cursor.copy(f"COPY {_STAGING} FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(_STAGING_TYPES)
                try:
                    for row in unique.values():
                        copy.write_row(row)
                except (TypeError, ValueError, OverflowError) as exc:  # as the server refused text
                    what = f"writing {len(rows)} windows failed on {self.db.url}"
                    raise StoreError(f"{what}: a value not of its column's type: {exc}") from exc
        conn.exec_driver_sql(sql)
        return made

    def _upsert_sql(self, conn: Connection, keep_fuller: bool) -> str:
        """The head upsert, made once: executemany of HEAD_COLUMNS tuples on SQLite, from a
        COPY-filled staging table on PostgreSQL (``keep_fuller``: a stored row of more
        samples stays)."""
        if keep_fuller not in self._upsert:
            sets = ", ".join(f"{c} = excluded.{c}" for c in HEAD_COLUMNS[2:])
            where = " WHERE head.samples <= excluded.samples" if keep_fuller else ""
            conflict = f"ON CONFLICT (start, series_id) DO UPDATE SET {sets}{where}"
            names = ", ".join(HEAD_COLUMNS)
            if conn.dialect.name == "sqlite":
                marks = ", ".join("?" * len(HEAD_COLUMNS))
                sql = f"INSERT INTO head ({names}) VALUES ({marks}) {conflict}"
            else:  # in key order: concurrent writers lock rows in the same order
                sql = (f"INSERT INTO head ({names}) SELECT {names} FROM {_STAGING} "
                       f"ORDER BY start, series_id {conflict}")  # fmt: skip
            self._upsert[keep_fuller] = sql
        return self._upsert[keep_fuller]

    def seal(self, source: str, below: float) -> int:
        """Move ``source``'s head rows that start before ``below`` into their hours' chunks;
        return how many windows moved."""
        return self.seal_many({source: below})

    def seal_many(self, below: dict[str, float]) -> int:
        """Seal each source's head rows before its ``below`` hour: the sources of one hour
        in one transaction (at an hour's turn, every source of a collector); the windows
        moved."""
        by_hour: dict[float, list[str]] = {}
        for source, hour in below.items():
            by_hour.setdefault(hour, []).append(source)
        moved = 0
        for hour, sources in sorted(by_hour.items()):
            for attempt in (1, 2):
                try:
                    with self.db.tx(f"sealing the hours of {len(sources)} source(s) before "
                                    f"{hour:.0f}", write=True) as conn:  # fmt: skip
                        self._lock(conn, sources)
                        moved += self._seal_rows(conn, sorted(sources), hour)
                    break
                except StoreError as exc:
                    # a day another process's prune dropped after this one made it: again
                    if attempt == 2 or not no_partition(exc):
                        raise
                    self.db.days.made.clear()
            for source in sources:
                self.sealed_below[source] = max(self.sealed_below.get(source, -math.inf), hour)
        if moved and self.db.dialect == "postgresql":
            self.db.vacuum("head")  # the sealed rows' space, for the next hour's rows
        return moved

    def seal_before(self, end: float) -> int:
        """Seal every source's head rows that start before ``end`` (the downsampling's
        days); the windows moved."""
        with self.db.tx("listing the head's old sources") as conn:
            names = conn.execute(
                select(SeriesRow.source).distinct()
                .join(HeadRow, HeadRow.series_id == SeriesRow.id)
                .where(HeadRow.start < end)
            ).scalars().all()  # fmt: skip
        return self.seal_many(dict.fromkeys((str(s) for s in names), end))

    def _seal_rows(self, conn: Connection, sources: list[str], below: float) -> int:
        """In ``conn``'s transaction: the sources' head rows before ``below`` into chunks
        (store/sealing.py takes them out as columns; each series-hour one chunk, merged with
        the chunk another writer may have made of it meanwhile)."""
        taken = sealing.take(conn, sources, below)
        if taken is None:
            return 0
        days = {int(h // DAY_S) for _, h in taken.keys}
        if conn.dialect.name == "postgresql" and self.db.days.missing(days):
            partitions.make_days(conn, days)
            self.db.days.add(days)
        have = self._chunks(conn, set(taken.keys))
        offsets = taken.offsets.tolist()
        try:
            data = chunks.encode_many(taken.values, offsets, taken.blobs)
        except ValueError as exc:  # a series-hour of 65,536 windows or more
            sizes = zip(taken.keys, offsets, offsets[1:], strict=False)
            sid, hour = next((k for k, lo, hi in sizes if hi - lo >= 65_536), taken.keys[0])
            raise StoreError(f"series {sid} hour {hour:.0f}: {exc}") from exc
        values = []
        for i, (key, chunk) in enumerate(zip(taken.keys, data, strict=True)):
            n = offsets[i + 1] - offsets[i]
            if key in have:  # merged with the stored chunk
                values += self._chunk_values(have, {key: taken.rows(i)}, keep_fuller=False)
            else:
                values.append({"series_id": key[0], "hour": key[1], "n": n, "data": chunk})
        self._upsert_chunks(conn, values)
        return int(taken.series.size)

    def seal_all(self) -> int:
        """Seal every source's hours older than its newest hour in the head."""
        self.db.require_schema()
        with self.db.tx("listing the head's sources") as conn:
            newest = conn.execute(
                select(SeriesRow.source, func.max(HeadRow.start))
                .join(HeadRow, HeadRow.series_id == SeriesRow.id)
                .group_by(SeriesRow.source)
            ).all()
        return self.seal_many({str(s): chunks.hour_of(float(t)) for s, t in newest})
