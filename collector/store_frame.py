"""Columnar window reads: ``Store.read_frame`` hands windows back as one pandas DataFrame.

``read_windows`` makes a frozen Window per row: right for thousands of windows, minutes for the
~12 M windows of 100 engines × 7 days of 1-minute windows. ``read_frame`` runs one statement
with only the columns asked for and fills numpy arrays chunk by chunk:

* Both backends, packed hours (collector/store_blocks.py; SQLite from schema 6, PostgreSQL
  from 7): each complete source-hour of a series is one BLOB of float64 read with
  ``numpy.frombuffer``, ~60× fewer objects through SQLite's driver and ~60× fewer rows for
  PostgreSQL's server to send; only what no pack covers (the hours still written, or
  re-written since) is read as rows, as below. ``packed=False`` reads every window as a row.
* SQLite rows: the driver's ``fetchmany``; a row names its series by one short text (series key,
  kind, source) that is factorized per chunk, and the signal and labels come from one point
  look-up per series. The driver still makes a Python object per value: that is this
  backend's floor (1.8 µs a row of the plan's columns here, before any conversion;
  benchmarks/bench_plan.py measures it). When most rows match (estimated from a few rowid
  slices), the table is scanned rather than reached through the signal or source index.
* PostgreSQL rows (collector/store_frame_pg.py): ``COPY (SELECT …) TO STDOUT (FORMAT BINARY)``
  where the server packs each column of a block of rows into one bytea of fixed-width
  values (a NULL left out, a bit per row saying so), read with ``numpy.frombuffer``: no
  Python object per window; a scan's blocks come in two COPYs at once, in one snapshot.

Labels are decoded once per distinct series, never per row.

Columns (FRAME_COLUMNS; ``columns=`` picks a subset, kept in this order): ``source``,
``signal``, ``labels``, ``engine``, ``model_name``, ``kind`` are pandas Categoricals (labels:
the canonical JSON text the store keeps; engine / model_name: those labels, NaN when absent);
``samples`` and ``resets`` are int64; the rest float64 with NaN for NULL (unknown).
Rows come in read_windows' order (source, signal, start, labels; text in the database's
collation) unless ``ordered=False``. :func:`windows_frame` builds the same frame from Window
records.
"""

from __future__ import annotations

import itertools
import json
import operator
import sqlite3
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import ColumnElement, Connection, func, or_, select

from collector import store_blocks, store_blocks_pg, store_blocks_sqlite
from collector.models import ClusterRow, EngineRow, TargetRow, WindowRow, labels_json
from collector.store_blocks_decode import Packs
from collector.store_columns import (
    INT_COLUMNS,
    Series,
    compiled_sql,
    dtype_of,
    first_positions,
)
from collector.store_frame_pg import pg_ranks, read_postgres
from core.catalog import ENGINE_LABEL
from core.errors import StoreError
from core.records import Window

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pandas as pd

    from collector.store_blocks import Frame
    from collector.store_columns import IntArray, RankFn

CATEGORY_COLUMNS = ("source", "signal", "labels", "engine", "model_name", "kind")
FLOAT_COLUMNS = ("start", "length_s", "delta", "rate", "mean", "min", "max", "last", "p50",
                 "p90", "p99", "sum_delta")  # fmt: skip
FRAME_COLUMNS = ("source", "signal", "labels", "engine", "model_name", "start", "length_s",
                 "kind", "samples", "delta", "rate", "resets", "mean", "min", "max", "last",
                 "p50", "p90", "p99", "sum_delta")  # fmt: skip
_FROM_LABELS = {"engine": ENGINE_LABEL, "model_name": "model_name"}
_SEP = store_blocks.SEP
_CHUNK = 65_536  # rows per fetchmany (SQLite)
_SAMPLES, _SLICE = 16, 1024  # id slices that estimate how many rows match (SQLite)


def window_filters(
    *,
    signals: Sequence[str] | None = None,
    sources: Sequence[str] | None = None,
    cluster: str | None = None,
    since: float | None = None,
    until: float | None = None,
) -> list[ColumnElement[bool]]:
    """WHERE conditions of a window read (read_windows and read_frame share them)."""
    w = WindowRow
    out: list[ColumnElement[bool]] = []
    if signals is not None:
        out.append(w.signal.in_(list(signals)))
    if sources is not None:
        out.append(w.source.in_(list(sources)))
    if since is not None:
        out.append(w.start >= since)
    if until is not None:
        out.append(w.start < until)
    if cluster is not None:
        in_cluster = select(ClusterRow.id).where(ClusterRow.name == cluster)
        out.append(
            or_(
                w.source.in_(select(TargetRow.name).where(TargetRow.cluster_id.in_(in_cluster))),
                w.source.in_(select(EngineRow.source).where(EngineRow.cluster_id.in_(in_cluster))),
            )
        )  # fmt: skip
    return out


def frame_columns(columns: Iterable[str] | None) -> tuple[str, ...]:
    """The asked columns in FRAME_COLUMNS order; a StoreError names an unknown one."""
    if columns is None:
        return FRAME_COLUMNS
    wanted = set(columns)
    unknown = sorted(wanted - set(FRAME_COLUMNS))
    if unknown:
        raise StoreError(f"unknown frame column(s) {unknown}; known: {', '.join(FRAME_COLUMNS)}")
    return tuple(c for c in FRAME_COLUMNS if c in wanted)


def windows_frame(windows: Iterable[Window], columns: Iterable[str] | None = None) -> pd.DataFrame:
    """The frame Store.read_frame would return for these Window records, in their order."""
    import numpy as np

    cols = frame_columns(columns)
    rows = list(windows)
    ids: dict[tuple[str, str, str, object], int] = {}
    series: list[Series] = []
    texts: dict[object, str] = {}
    sid = np.empty(len(rows), dtype=np.int64)
    for i, w in enumerate(rows):
        key = (w.source, w.signal, w.kind, w.labels)
        code = ids.get(key)
        if code is None:
            text = texts.get(w.labels)
            if text is None:
                text = texts[w.labels] = labels_json(w.labels)
            code = ids[key] = len(series)
            series.append((w.source, w.signal, w.kind, text))
        sid[i] = code
    nums: dict[str, npt.NDArray[Any]] = {}
    for name in ("start", *(c for c in cols if c in FLOAT_COLUMNS or c in INT_COLUMNS)):
        values = list(map(operator.attrgetter(name), rows))
        nums[name] = np.asarray(values, dtype=np.int64 if name in INT_COLUMNS else np.float64)
    return assemble(series, sid, nums, cols, order=None)


def assemble(
    series: Sequence[Series],
    sid: IntArray,
    nums: dict[str, npt.NDArray[Any]],
    columns: Sequence[str],
    order: IntArray | None,
) -> pd.DataFrame:
    """The frame from per-series identities, each row's series code and numeric columns
    (rows in ``order`` when given: the columns of ``nums`` are then consumed, each one's
    memory taking the next one's rows, so that one new column is made, not one per column:
    fresh memory is what a big read costs most on this project's VM)."""
    import numpy as np
    import pandas as pd

    if order is not None:
        sid = sid[order]
    per_series: dict[str, list[str | None]] = {
        "source": [s[0] for s in series],
        "signal": [s[1] for s in series],
        "kind": [s[2] for s in series],
        "labels": [s[3] for s in series],
    }
    if any(c in _FROM_LABELS for c in columns):
        texts = [s[3] for s in series]
        decoded = {text: json.loads(text) for text in set(texts)}
        for col, label in _FROM_LABELS.items():
            per_series[col] = [decoded[t].get(label) for t in texts]
    data: dict[str, Any] = {}
    spare: npt.NDArray[Any] | None = None  # a column whose rows are all in the frame already
    for col in columns:
        if col in CATEGORY_COLUMNS:
            cats = sorted({v for v in per_series[col] if v is not None})
            index: dict[str | None, int] = {v: i for i, v in enumerate(cats)}
            lut = np.asarray([index.get(v, -1) for v in per_series[col]] + [-1], dtype=np.int64)
            data[col] = pd.Categorical.from_codes(
                lut[sid] if len(sid) else np.zeros(0, dtype=np.int64),
                categories=pd.Index(cats, dtype=object),
            )
        elif order is None:
            data[col] = nums[col]
        else:
            values = nums[col]
            reuse = spare is not None and spare.nbytes == values.nbytes == 8 * values.size
            if spare is None or not reuse or np.may_share_memory(spare, values):
                out = np.empty_like(values)
            else:
                out = spare.view(values.dtype)
            data[col] = np.take(values, order, out=out)
            spare = values if values.flags.c_contiguous else None
    # copy=False: the arrays were made for this frame; no copy into one 2-D block either.
    return pd.DataFrame(data, columns=list(columns), copy=False)


def sort_order(
    series: Sequence[Series], sid: IntArray, start: npt.NDArray[np.float64], ranks: RankFn
) -> IntArray:
    """Row order of read_windows: source, signal, start, labels (text ranks from ``ranks``)."""
    import numpy as np
    import pandas as pd

    if sid.size == 0:
        return np.zeros(0, dtype=np.int64)
    src = np.asarray(ranks("source", [s[0] for s in series]), dtype=np.int64)
    sig = np.asarray(ranks("signal", [s[1] for s in series]), dtype=np.int64)
    lab = np.asarray(ranks("labels", [s[3] for s in series]), dtype=np.int64)
    n_lab = int(lab.max()) + 1
    srcsig = src * (int(sig.max()) + 1) + sig
    codes, uniques = pd.factorize(start)
    start_rank = np.empty(len(uniques), dtype=np.int64)
    start_rank[np.argsort(np.asarray(uniques), kind="stable")] = np.arange(len(uniques))
    n_start = max(len(uniques), 1)
    if (int(srcsig.max()) + 1) * n_start * n_lab < 2**62:
        key = (srcsig[sid] * n_start + start_rank[codes]) * n_lab + lab[sid]
        order: IntArray = np.argsort(key, kind="stable")
        return order
    fallback: IntArray = np.lexsort((lab[sid], start, srcsig[sid]))
    return fallback


def _python_ranks(_what: str, values: Sequence[str]) -> list[int]:
    """Dense ranks in code-point order (SQLite's BINARY collation compares UTF-8 bytes)."""
    order = {v: i for i, v in enumerate(sorted(set(values)))}
    return [order[v] for v in values]


class FrameReader:
    """Store.read_frame (mixed into Store; see the module docstring)."""

    if TYPE_CHECKING:
        dialect: str

        def _tx(
            self, action: str, *, write: bool = False
        ) -> AbstractContextManager[Connection]: ...

        def _require_schema(self) -> None: ...

    def read_frame(
        self,
        *,
        signals: Sequence[str] | None = None,
        sources: Sequence[str] | None = None,
        cluster: str | None = None,
        since: float | None = None,
        until: float | None = None,
        columns: Iterable[str] | None = None,
        ordered: bool = True,
        packed: bool = True,
    ) -> pd.DataFrame:
        """Windows with ``since <= start < until`` as one DataFrame (module docstring).

        Same filters as read_windows; ``columns`` picks frame columns (all by default);
        ``ordered=False`` skips the sort into read_windows' order (the rows are the same).
        ``packed=False`` reads every window's row, never the packed hours: the same frame,
        the read path before schema 6 (SQLite) or 7 (PostgreSQL; benchmarks/bench_plan.py's
        baselines).
        """
        import numpy as np

        cols = frame_columns(columns)
        self._require_schema()
        conds = window_filters(
            signals=signals, sources=sources, cluster=cluster, since=since, until=until
        )
        numeric = ["start", *(c for c in cols if c != "start" and c not in CATEGORY_COLUMNS)]
        with self._tx("reading windows as a frame") as conn:
            ranks: RankFn = _python_ranks
            if self.dialect == "postgresql":  # one snapshot for the packs and the rows
                conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                ranks = pg_ranks(conn)
            if packed:
                series, sid, nums = _read_packed(
                    conn, conds, signals=signals, sources=sources, cluster=cluster, since=since,
                    until=until, numeric=numeric,
                )  # fmt: skip
            elif self.dialect == "postgresql":
                series, sid, nums = read_postgres(conn, conds, numeric)
            else:
                # The index a signal or source filter would use pays only for a few rows.
                narrow = dict(signals=signals) if signals is not None else dict(sources=sources)
                if signals is None and sources is None:
                    scan = False  # no index applies
                else:
                    scan = _mostly_matches(conn, window_filters(**narrow, since=since, until=until))
                series, sid, nums = _read_sqlite(conn, conds, numeric, scan=scan)
            order = sort_order(series, sid, nums["start"], ranks) if ordered else None
        if order is not None and np.array_equal(order, np.arange(order.size)):
            order = None
        return assemble(series, sid, nums, cols, order)


def _mostly_matches(conn: Connection, conds: list[ColumnElement[bool]]) -> bool:
    """True when over 1/6 of the table's rows match: a table scan then beats the rows'
    index look-ups (measured on 1.3 M windows: index 4.5 µs/row, scan 3.7 µs/row).

    Estimated from _SAMPLES slices of _SLICE table ids spread over the table (rowid
    ranges: a few thousand rows looked at, not the millions a count would pass over); the
    choice only picks the access path, never which rows are read."""
    lo, hi = conn.exec_driver_sql(  # one min or max per SELECT: a seek, not a scan
        "SELECT (SELECT min(id) FROM windows), (SELECT max(id) FROM windows)"
    ).one()
    if lo is None:
        return False
    total = int(hi) - int(lo) + 1
    w = WindowRow
    if total <= _SAMPLES * _SLICE:
        ranges = [(int(lo), int(hi))]
    else:
        step = (total - _SLICE) // (_SAMPLES - 1)
        ranges = [(int(lo) + i * step, int(lo) + i * step + _SLICE - 1) for i in range(_SAMPLES)]
    looked = match = 0
    for a, b in ranges:
        stmt = select(func.count()).select_from(w).where(w.id >= a, w.id <= b, *conds)
        sql, params = compiled_sql(conn, stmt)  # NOT INDEXED: the rowid range, not the
        found = conn.exec_driver_sql(_not_indexed(sql), params).scalar()  # signal index
        match += int(found or 0)
        looked += b - a + 1
    return match * 6 > looked


def _not_indexed(sql: str) -> str:
    """A window query that reads the table by rowid (ranges) rather than an index."""
    if sql.count("\nFROM windows") != 1:  # pragma: no cover - the statements of this module
        raise StoreError(f"unexpected window query: {sql}")
    return sql.replace("\nFROM windows", "\nFROM windows NOT INDEXED")


def _read_sqlite(
    conn: Connection, conds: list[ColumnElement[bool]], numeric: Sequence[str], *, scan: bool
) -> tuple[list[Series], IntArray, dict[str, npt.NDArray[Any]]]:
    w = WindowRow
    key = (w.series_key + _SEP + w.kind + _SEP + w.source).label("k")
    stmt = select(key, *(w.__table__.c[c] for c in numeric)).where(*conds)
    sql, params = compiled_sql(conn, stmt)
    if scan:
        sql = _not_indexed(sql)
    raw = conn.connection.driver_connection
    return _read_rows(cast(sqlite3.Connection, raw), [(sql, params)], numeric)


def _read_packed(
    conn: Connection,
    conds: list[ColumnElement[bool]],
    *,
    signals: Sequence[str] | None,
    sources: Sequence[str] | None,
    cluster: str | None,
    since: float | None,
    until: float | None,
    numeric: Sequence[str],
) -> Frame:
    """The packed hours' blocks (collector/store_blocks.py), then the rows of what no pack
    covers (the hours still written, or re-written since their pack): on SQLite one read by
    the unique index per source and range, on PostgreSQL the COPY read of ``conds`` without
    the packed hours (collector/store_frame_pg.py)."""
    wanted = store_blocks.wanted_sources(conn, sources, cluster)
    cover = store_blocks.covered(conn, wanted, since, until)
    packed = store_blocks.block_rows(conn, wanted, signals, since, until)
    sql, params = store_blocks.block_sql(conn, wanted, signals, since, until)
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SET LOCAL jit = off")  # compiling costs more than it saves here
        rest = read_postgres(conn, conds, numeric, packed=(cover, since, until, packed))
        packs = Packs(numeric, store_blocks.BYTE_ORDER["postgresql"], packed, rest)
        packs.add(store_blocks_pg.read_blocks(conn, sql, params))
    else:
        raw = cast(sqlite3.Connection, conn.connection.driver_connection)
        present = store_blocks_sqlite.sources(raw)
        if wanted is not None:
            keep = set(wanted)
            present = [s for s in present if s in keep]
        statements = store_blocks_sqlite.row_statements(
            cover, present, signals=signals, since=since, until=until, numeric=numeric
        )
        rest = _read_rows(raw, statements, numeric)
        packs = Packs(numeric, store_blocks.BYTE_ORDER["sqlite"], packed, rest)
        packs.add(raw.execute(sql, params))
    return packs.frame(since, until)


def _read_rows(
    raw: sqlite3.Connection, statements: Sequence[tuple[str, Any]], numeric: Sequence[str]
) -> tuple[list[Series], IntArray, dict[str, npt.NDArray[Any]]]:
    """Rows of ``statements`` (each: the series key text, then ``numeric``) as columns."""
    import numpy as np

    width = 1 + len(numeric)  # the series key, then the numeric columns
    ids: dict[str, int] = {}
    first_start: list[float] = []
    sid_parts: list[IntArray] = []
    parts: dict[str, list[npt.NDArray[Any]]] = {c: [] for c in numeric}
    for sql, params in statements:
        cursor = raw.cursor()
        cursor.execute(sql, params)
        _chunks(cursor, width, numeric, ids, first_start, sid_parts, parts)
        cursor.close()
    series: list[Series] = []
    look = "SELECT signal, labels FROM windows WHERE source = ? AND start = ? AND series_key = ?"
    for text, start_of in zip(ids, first_start, strict=True):
        series_key, kind, source = text.split(_SEP, 2)
        found = raw.execute(look, (source, start_of, series_key)).fetchone()
        if found is None:  # pragma: no cover - the row was just read in this transaction
            raise StoreError(f"series {series_key} of {source} vanished while reading")
        series.append((source, str(found[0]), kind, str(found[1])))
    return (
        series,
        _concat(sid_parts, np.int64),
        {c: _concat(parts[c], dtype_of(c)) for c in numeric},
    )


def _chunks(  # noqa: PLR0917 - the running state of _read_rows, passed along
    cursor: sqlite3.Cursor,
    width: int,
    numeric: Sequence[str],
    ids: dict[str, int],
    first_start: list[float],
    sid_parts: list[IntArray],
    parts: dict[str, list[npt.NDArray[Any]]],
) -> None:
    import numpy as np
    import pandas as pd

    while rows := cursor.fetchmany(_CHUNK):
        # One object array of the chunk, its values flattened in C (np.fromiter over the
        # chained tuples: half the cost of np.array(rows), which inspects every tuple as a
        # possible nested sequence), then a cast per column: None -> NaN, floats exact.
        flat = itertools.chain.from_iterable(rows)
        chunk = np.fromiter(flat, dtype=object, count=len(rows) * width).reshape(-1, width)
        del rows
        codes, uniques = pd.factorize(chunk[:, 0])
        start = chunk[:, 1].astype(np.float64)
        first = first_positions(codes)
        lut = np.empty(len(uniques), dtype=np.int64)
        for j, text in enumerate(uniques.tolist()):
            code = ids.get(text)
            if code is None:
                code = ids[text] = len(first_start)
                first_start.append(float(start[first[j]]))
            lut[j] = code
        sid_parts.append(lut[codes])
        parts["start"].append(start)
        for j, name in enumerate(numeric[1:], start=2):
            parts[name].append(chunk[:, j].astype(dtype_of(name)))


def _concat(parts: list[npt.NDArray[Any]], dtype: Any) -> npt.NDArray[Any]:
    import numpy as np

    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
