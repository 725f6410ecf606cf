"""Window reads: the series asked for, then their chunks and head rows, as columns.

:meth:`WindowReader.columns` is the one read every public read builds on: it finds the
series (``series`` filtered by signal, source and cluster), reads the chunks of both tiers
(1-minute hours, 5-minute days) that overlap [since, until) and the head rows in it, in one
transaction (one snapshot on PostgreSQL), decodes the chunks a layout at a time
(store/chunks.py) and keeps the windows with ``since <= start < until``. read_frame,
read_windows, read_buckets and sum_buckets shape its answer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BigInteger,
    ClauseElement,
    ColumnElement,
    Connection,
    Executable,
    any_,
    bindparam,
    func,
    select,
)
from sqlalchemy.dialects.postgresql import ARRAY

from core.catalog import BUCKET_SIGNALS
from core.errors import StoreError
from core.records import BucketSum, Labels, Window
from store import chunks
from store.buckets import BucketSummer, decode_buckets
from store.columns import Series, dtype_of
from store.db import Database
from store.frame import (
    CATEGORY_COLUMNS,
    assemble,
    frame_columns,
    pg_ranks,
    python_ranks,
    series_filters,
    sort_order,
)
from store.tables import Chunk5mRow, ChunkRow, HeadRow, SeriesRow

if TYPE_CHECKING:
    import numpy.typing as npt
    import pandas as pd

    from store.columns import IntArray, RankFn

_NUMERIC = chunks.COLUMNS  # start first
DAY_S = 86_400.0


@dataclass
class Read:
    """Windows as columns: the series, each row's series index, the numeric columns and,
    when asked for, each row's bucket BLOB (None: none)."""

    series: list[Series]
    sid: IntArray
    nums: dict[str, npt.NDArray[Any]]
    blobs: list[bytes | None] | None
    ranks: RankFn


class WindowReader:
    """The reads of windows (module docstring)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._labels: dict[str, Labels] = {}

    def columns(
        self,
        *,
        signals: Sequence[str] | None,
        sources: Sequence[str] | None,
        cluster: str | None,
        since: float | None,
        until: float | None,
        numeric: Sequence[str],
        blobs: bool = False,
        only_buckets: bool = False,
    ) -> Read:
        """The windows asked for (module docstring); ``numeric`` holds ``start``."""
        self.db.require_schema()
        conds = series_filters(signals=signals, sources=sources, cluster=cluster)
        with self.db.tx("reading windows") as conn:
            ranks: RankFn = python_ranks
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                ranks = pg_ranks(conn)
            found = conn.execute(
                select(SeriesRow.id, SeriesRow.source, SeriesRow.signal, SeriesRow.kind,
                       SeriesRow.labels).where(*conds).order_by(SeriesRow.id)
            ).all()  # fmt: skip
            series = [(str(r[1]), str(r[2]), str(r[3]), str(r[4])) for r in found]
            index = {int(r[0]): i for i, r in enumerate(found)}
            head_cols = ["series_id", *numeric, *(["buckets"] if blobs else [])]
            chunk_rows: Sequence[Any] = []
            head_rows: Sequence[Any] = []
            if index:  # no series, no windows: the head is not scanned for none
                chunk_rows, head_rows = _fetch(conn, conds, since, until,
                                               only_buckets=only_buckets,
                                               head_columns=head_cols,
                                               ids=list(index))  # fmt: skip
            ranks = _ranked(ranks, series)  # the database's order, read in this transaction
        return self._decode(series, index, chunk_rows, head_rows, numeric, since, until,
                            blobs, ranks)  # fmt: skip

    def _decode(  # noqa: PLR0917, PLR0913 - the parts of one read
        self,
        series: list[Series],
        index: dict[int, int],
        chunk_rows: Sequence[Any],
        head_rows: Sequence[Any],
        numeric: Sequence[str],
        since: float | None,
        until: float | None,
        blobs: bool,
        ranks: RankFn,
    ) -> Read:
        import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)

        datas = [bytes(r[1]) for r in chunk_rows]
        try:
            chunk_of, cols = chunks.decode_many(datas, numeric, spare=len(head_rows))
        except ValueError as exc:
            raise StoreError(f"{self.db.url}: an unreadable chunk: {exc}") from exc
        sid = np.empty(chunk_of.size + len(head_rows), dtype=np.int64)
        np.take(self._series_index(index, chunk_rows), chunk_of, out=sid[: chunk_of.size])
        blob_list: list[bytes | None] | None = None
        if blobs:
            blob_list = [b for data in datas for b in chunks.blobs_of(data)]
        if head_rows:
            sid[chunk_of.size :] = self._series_index(index, head_rows)
            width = len(numeric)
            extra = np.array([r[1 : 1 + width] for r in head_rows], dtype=np.float64)
            for j, name in enumerate(numeric):
                cols[name][chunk_of.size :] = extra.reshape(-1, width)[:, j]
            if blob_list is not None:
                blob_list += [None if r[-1] is None else bytes(r[-1]) for r in head_rows]
        if since is not None or until is not None:
            start = cols["start"]
            keep = np.ones(start.size, dtype=bool)
            if since is not None:
                keep &= start >= since
            if until is not None:
                keep &= start < until
            if not keep.all():
                sid = sid[keep]
                cols = {k: v[keep] for k, v in cols.items()}
                if blob_list is not None:
                    blob_list = [b for b, k in zip(blob_list, keep.tolist(), strict=True) if k]
        nums = {k: v.astype(dtype_of(k)) if dtype_of(k) is not np.float64 else v
                for k, v in cols.items()}  # fmt: skip
        return Read(series, sid, nums, blob_list, ranks)

    def _series_index(self, index: dict[int, int], rows: Sequence[Any]) -> IntArray:
        """The series index of each row (its first value: the series id)."""
        import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)

        ids = np.fromiter((r[0] for r in rows), np.int64, len(rows))
        known = np.fromiter(index, np.int64, len(index))  # ascending: found by id
        at = np.searchsorted(known, ids)
        if at.size and not np.array_equal(known[np.minimum(at, known.size - 1)], ids):
            raise StoreError(f"{self.db.url}: a window of an unknown series")
        out: IntArray = at.astype(np.int64)
        return out

    def frame(
        self,
        *,
        signals: Sequence[str] | None = None,
        sources: Sequence[str] | None = None,
        cluster: str | None = None,
        since: float | None = None,
        until: float | None = None,
        columns: Iterable[str] | None = None,
        ordered: bool = True,
    ) -> pd.DataFrame:
        """Store.read_frame (store/DESIGN.md#frame)."""
        import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)

        cols = frame_columns(columns)
        numeric = ["start", *(c for c in cols if c != "start" and c not in CATEGORY_COLUMNS)]
        got = self.columns(signals=signals, sources=sources, cluster=cluster, since=since,
                           until=until, numeric=numeric)  # fmt: skip
        order = sort_order(got.series, got.sid, got.nums["start"], got.ranks) if ordered else None
        if order is not None and np.array_equal(order, np.arange(order.size)):
            order = None
        return assemble(got.series, got.sid, got.nums, cols, order)

    def windows(
        self,
        *,
        signals: Sequence[str] | None,
        sources: Sequence[str] | None,
        cluster: str | None,
        since: float | None,
        until: float | None,
        only_buckets: bool = False,
    ) -> list[Window]:
        """Store.read_windows / read_buckets: Window records in read_windows' order."""
        import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)

        got = self.columns(signals=signals, sources=sources, cluster=cluster, since=since,
                           until=until, numeric=_NUMERIC, blobs=True,
                           only_buckets=only_buckets)  # fmt: skip
        order = sort_order(got.series, got.sid, got.nums["start"], got.ranks)
        assert got.blobs is not None
        values = {k: v[order].tolist() for k, v in got.nums.items()}
        nan = np.isnan
        out = []
        for i, row in enumerate(order.tolist()):
            blob = got.blobs[row]
            if only_buckets and blob is None:
                continue
            source, signal, kind, text = got.series[int(got.sid[row])]
            v = [values[k][i] for k in _NUMERIC]
            v = [None if isinstance(x, float) and nan(x) else x for x in v]
            extra: tuple[Any, ...] = ()
            if blob is not None:
                try:
                    extra = decode_buckets(blob)
                except ValueError as exc:
                    raise StoreError(f"{self.db.url}: window {source} {signal} at {v[0]}: "
                                     f"unreadable buckets: {exc}") from exc  # fmt: skip
            out.append(
                Window(
                    source,
                    signal,
                    self.labels(text),
                    v[0],
                    v[1],
                    kind,  # type: ignore[arg-type]
                    int(v[2]),
                    v[3],
                    v[4],
                    int(v[5] or 0),
                    *v[6:],
                    *extra,
                )
            )
        return out

    def sum_buckets(
        self,
        *,
        signals: Sequence[str] | None,
        sources: Sequence[str] | None,
        cluster: str | None,
        since: float | None,
        until: float | None,
    ) -> list[BucketSum]:
        """Store.sum_buckets: each series' bucket counts summed per layout."""
        if signals is None:
            signals = sorted(BUCKET_SIGNALS)
        got = self.columns(signals=signals, sources=sources, cluster=cluster, since=since,
                           until=until, numeric=["start"], blobs=True,
                           only_buckets=True)  # fmt: skip
        order = sort_order(got.series, got.sid, got.nums["start"], got.ranks)
        assert got.blobs is not None
        summer = BucketSummer()
        starts = got.nums["start"]
        for row in order.tolist():
            blob = got.blobs[row]
            if blob is None:
                continue
            source, signal, _kind, text = got.series[int(got.sid[row])]
            try:
                summer.add(source, signal, text, float(starts[row]), blob)
            except ValueError as exc:
                raise StoreError(f"{self.db.url}: window {source} {signal} at "
                                 f"{starts[row]}: unreadable buckets: {exc}") from exc  # fmt: skip
        out = [
            BucketSum(source, signal, self.labels(labels), bounds, counts, n, first, last)
            for source, signal, labels, bounds, counts, n, first, last in summer.sums()
        ]
        return sorted(out, key=lambda b: (b.source, b.signal, b.labels, b.last))

    def labels(self, text: str) -> Labels:
        """The label set of a canonical labels JSON text (cached)."""
        labels = self._labels.get(text)
        if labels is None:
            if len(self._labels) > 200_000:
                self._labels.clear()
            labels = self._labels[text] = tuple(sorted(json.loads(text).items()))
        return labels


def _fetch(
    conn: Connection,
    conds: list[ColumnElement[bool]],
    since: float | None,
    until: float | None,
    *,
    only_buckets: bool,
    head_columns: Sequence[str],
    ids: Sequence[int],
) -> tuple[Sequence[Any], Sequence[Any]]:
    """The chunks (series id, data) of both tiers overlapping [since, until) and the head
    rows in it (``head_columns``), of the series ``conds`` select (``ids``, as read in this
    transaction). PostgreSQL is given the ids as one array: with the subquery its planner
    scanned every day partition (in parallel) and sorted, instead of each partition's
    primary key (series_id, hour) merged in order. The head (keyed by start first) is
    scanned whole: there the array is unnested, a hash semi-join, not ``= ANY``, which
    compares each row with every id (37 against 10 ms a signal on 100 engines' head)."""
    in_head: Callable[[Any], ColumnElement[bool]]
    if conn.dialect.name == "postgresql":
        array = bindparam("series_ids", list(ids), type_=ARRAY(BigInteger))
        wanted: Any = any_(array)
        of: Callable[[Any], ColumnElement[bool]] = lambda column: column == wanted  # noqa: E731
        unnested = select(func.unnest(array)).scalar_subquery()
        in_head = lambda column: column.in_(unnested)  # noqa: E731
    else:
        wanted = select(SeriesRow.id).where(*conds).scalar_subquery()
        of = in_head = lambda column: column.in_(wanted)
    c = ChunkRow
    where: list[ColumnElement[bool]] = [of(c.series_id)] if conds else []
    if since is not None:
        where.append(c.hour >= chunks.hour_of(since))
    if until is not None:
        where.append(c.hour < until)
    chunk_rows = _raw_rows(
        conn, select(c.series_id, c.data).where(*where).order_by(c.series_id, c.hour)
    )
    t = Chunk5mRow  # the downsampled tier: a chunk a series and day
    twhere: list[ColumnElement[bool]] = [of(t.series_id)] if conds else []
    if since is not None:
        twhere.append(t.day >= math.floor(since / DAY_S) * DAY_S)
    if until is not None:
        twhere.append(t.day < until)
    chunk_rows += _raw_rows(
        conn, select(t.series_id, t.data).where(*twhere).order_by(t.series_id, t.day)
    )
    h = HeadRow
    cols = [h.__table__.c[name] for name in head_columns]
    hwhere: list[ColumnElement[bool]] = [in_head(h.series_id)] if conds else []
    if since is not None:
        hwhere.append(h.start >= since)
    if until is not None:
        hwhere.append(h.start < until)
    if only_buckets:
        hwhere.append(h.buckets.is_not(None))
    head_rows = _raw_rows(conn, select(*cols).where(*hwhere))
    return chunk_rows, head_rows


def _raw_rows(conn: Connection, query: Executable) -> list[Any]:
    """The rows of a query as the DBAPI cursor returns them, fetched at once (no Row
    object per row). On PostgreSQL in binary format: a chunk's bytea crosses as its bytes,
    not as hex text the server writes and the client parses (half the time of the plan's
    fetch), with the same Python values."""
    if conn.dialect.name == "postgresql" and isinstance(query, ClauseElement):
        compiled = query.compile(dialect=conn.dialect,
                                 compile_kwargs={"render_postcompile": True})  # fmt: skip
        cursor = conn.connection.driver_connection.cursor(binary=True)  # type: ignore[union-attr]
        try:
            cursor.execute(str(compiled), compiled.params)
            return list(cursor.fetchall())
        finally:
            cursor.close()
    result = conn.execute(query)
    try:
        return list(result.cursor.fetchall())
    finally:
        result.close()


def _ranked(ranks: RankFn, series: Sequence[Series]) -> RankFn:
    """``ranks`` of the series' sources, signals and labels asked now, answered later."""
    fields = {"source": 0, "signal": 1, "labels": 3}
    known: dict[str, dict[str, int]] = {}
    for what, j in fields.items():
        values = sorted({s[j] for s in series})
        known[what] = dict(zip(values, ranks(what, values), strict=True)) if values else {}

    def answer(what: str, values: Sequence[str]) -> list[int]:
        return [known[what][v] for v in values]

    return answer
