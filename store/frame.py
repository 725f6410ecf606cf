"""Columnar window reads: ``Store.read_frame`` hands windows back as one pandas DataFrame.

Series found once, their chunks decoded a layout at a time with numpy, labels decoded once
per series. Columns FRAME_COLUMNS (Categoricals for the text ones, int64 counts, float64
with NaN for unknown), rows in read_windows' order unless ``ordered=False``;
:func:`windows_frame` builds the same frame from Window records.

Columns: store/DESIGN.md#frame
"""

from __future__ import annotations

import json
import operator
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, Connection, or_, select

from core.catalog import ENGINE_LABEL
from core.errors import StoreError
from core.records import Window
from store.columns import INT_COLUMNS, RankFn, Series
from store.tables import ClusterRow, EngineRow, SeriesRow, TargetRow, labels_json

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pandas as pd

    from store.columns import IntArray

CATEGORY_COLUMNS = ("source", "signal", "labels", "engine", "model_name", "kind")
FLOAT_COLUMNS = ("start", "length_s", "delta", "rate", "mean", "min", "max", "last", "p50",
                 "p90", "p99", "sum_delta")  # fmt: skip
FRAME_COLUMNS = ("source", "signal", "labels", "engine", "model_name", "start", "length_s",
                 "kind", "samples", "delta", "rate", "resets", "mean", "min", "max", "last",
                 "p50", "p90", "p99", "sum_delta")  # fmt: skip
_FROM_LABELS = {"engine": ENGINE_LABEL, "model_name": "model_name"}


def series_filters(
    *,
    signals: Sequence[str] | None = None,
    sources: Sequence[str] | None = None,
    cluster: str | None = None,
) -> list[ColumnElement[bool]]:
    """WHERE conditions on ``series`` of a window read (every read shares them)."""
    w = SeriesRow
    out: list[ColumnElement[bool]] = []
    if signals is not None:
        out.append(w.signal.in_(list(signals)))
    if sources is not None:
        out.append(w.source.in_(list(sources)))
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
    import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)

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
    import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)
    import pandas as pd  # noqa: PLC0415 - start-up: pandas (~0.23 s) off `import store.store`; only the planner reads frames

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
    import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)
    import pandas as pd  # noqa: PLC0415 - start-up: pandas (~0.23 s) off `import store.store`; only the planner reads frames

    if sid.size == 0:
        return np.zeros(0, dtype=np.int64)
    src = np.asarray(ranks("source", [s[0] for s in series]), dtype=np.int64)
    sig = np.asarray(ranks("signal", [s[1] for s in series]), dtype=np.int64)
    lab = np.asarray(ranks("labels", [s[3] for s in series]), dtype=np.int64)
    n_lab = int(lab.max()) + 1
    srcsig = src * (int(sig.max()) + 1) + sig
    quick = _series_order(srcsig, sid, start)
    if quick is not None:
        return quick
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


def _series_order(
    srcsig: IntArray, sid: IntArray, start: npt.NDArray[np.float64]
) -> IntArray | None:
    """sort_order when no two series read share a (source, signal) rank and each series'
    starts rise in row order: the rows by that rank, stable (None: not so)."""
    import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)

    counts = np.bincount(sid, minlength=srcsig.size)
    used = np.flatnonzero(counts)
    if np.unique(srcsig[used]).size != used.size or not (np.isfinite(start).all() and start.all()):
        return None
    by_rank = used[np.argsort(srcsig[used])]
    rank = np.zeros(srcsig.size, dtype=np.int64)
    rank[by_rank] = np.arange(used.size)
    order = _stable_argsort(rank[sid], used.size)
    rising = np.diff(start[order]) >= 0
    rising[np.cumsum(counts[by_rank])[:-1] - 1] = True  # one series' last row, next's first
    return order if rising.all() else None


def _stable_argsort(keys: IntArray, top: int) -> IntArray:
    """np.argsort(keys, kind="stable") of keys in [0, top): a radix sort when they fit 16 bits."""
    import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)

    small = keys.astype(np.uint16) if top <= 1 << 16 else keys
    order: IntArray = np.argsort(small, kind="stable")
    return order


def python_ranks(_what: str, values: Sequence[str]) -> list[int]:
    """Dense ranks in code-point order (SQLite's BINARY collation compares UTF-8 bytes)."""
    order = {v: i for i, v in enumerate(sorted(set(values)))}
    return [order[v] for v in values]


def pg_ranks(conn: Connection) -> RankFn:
    """Dense ranks by the database's own text order (the collation read_windows sorts by)."""

    def ranks(_what: str, values: Sequence[str]) -> list[int]:
        distinct = sorted(set(values))
        rows = conn.exec_driver_sql(
            "SELECT v FROM unnest(%(v)s::text[]) AS u(v) ORDER BY v", {"v": distinct}
        ).all()
        order = {str(r[0]): i for i, r in enumerate(rows)}
        return [order[v] for v in values]

    return ranks
