"""Turn raw demand observations into the regular series the forecast models see.

Decides the modelling cadence (hourly with a daily season from 2 full days, else the
coarsest of 15/5/1 min giving >= 72 points), averages raw points into UTC-aligned buckets,
interpolates gaps of <= 3 buckets, drops history before a longer gap, clips negatives to 0
and requires >= 24 points (InsufficientHistory otherwise).

Rules: planner/forecast/METHODS.md#data
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from core.errors import InsufficientHistory, KvscopeError
from core.records import Window
from store.frame import windows_frame

if TYPE_CHECKING:
    import numpy.typing as npt

    FloatArray = npt.NDArray[np.float64]
    IntArray = npt.NDArray[np.int64]

DAY_S = 86_400.0
SEASONAL_MIN_SPAN_S = 2 * DAY_S  # two full days: the ETS heuristic needs two full cycles
SEASONAL_CADENCE_S = 3_600.0
SEASONAL_PERIOD = 24  # hours per day
FINE_CADENCES_S = (900.0, 300.0, 60.0)  # coarsest first
TARGET_POINTS = 72
MAX_FILL_BUCKETS = 3
MIN_POINTS = 24
AGGREGATIONS = ("mean", "max")


class SeriesError(KvscopeError):
    """The demand series itself is unusable (index type, values, windows); says what and where."""


@dataclass(frozen=True, slots=True, eq=False)
class Prepared:
    """A regular, gap-free series ready for the models (values in the caller's units)."""

    start: float  # epoch seconds of the first bucket's start
    cadence_s: float
    values: FloatArray
    seasonal_period: int | None
    native_cadence_s: float
    raw_points: int
    notes: tuple[str, ...] = field(default=())

    @property
    def times(self) -> FloatArray:
        return self.start + self.cadence_s * np.arange(len(self.values), dtype=np.float64)

    @property
    def end(self) -> float:
        """End of the last bucket: the forecast origin."""
        return self.start + self.cadence_s * len(self.values)


def to_epoch_arrays(series: pd.Series) -> tuple[FloatArray, FloatArray, list[str]]:
    """Sorted epoch-second times and float values; non-finite values are dropped (gaps)."""
    notes: list[str] = []
    if not isinstance(series, pd.Series):
        raise SeriesError(f"expected a pandas Series, got {type(series).__name__}")
    idx = series.index
    if isinstance(idx, pd.DatetimeIndex):
        if idx.tz is None:
            notes.append("timestamps without a time zone were taken as UTC")
            idx = idx.tz_localize("UTC")
        t = (idx.tz_convert("UTC").as_unit("ns").asi8 / 1e9).astype(np.float64)
    elif pd.api.types.is_numeric_dtype(idx.dtype):
        t = np.asarray(idx, dtype=np.float64)
    else:
        raise SeriesError(
            f"series index must be a DatetimeIndex or epoch seconds, got {idx.dtype} "
            f"(first label {idx[0]!r})"
            if len(idx)
            else "series index must be a DatetimeIndex or epoch seconds"
        )
    try:
        v = np.asarray(pd.to_numeric(series, errors="raise"), dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise SeriesError(f"series values must be numeric: {exc}") from exc
    keep = np.isfinite(t) & np.isfinite(v)
    if int((~keep).sum()):
        notes.append(f"{int((~keep).sum())} non-finite points treated as missing")
    t, v = t[keep], v[keep]
    order = np.argsort(t, kind="stable")
    t, v = t[order], v[order]
    negative = v < 0
    if negative.any():
        notes.append(
            f"{int(negative.sum())} negative values (min {v.min():.6g}) clipped to 0: "
            "demand is non-negative"
        )
        v = np.where(negative, 0.0, v)
    return t, v, notes


def choose_cadence(native_s: float, span_s: float) -> tuple[float, int | None]:
    """Modelling cadence and seasonal period (None: no seasonality) for this history."""
    if native_s > SEASONAL_CADENCE_S:
        return float(round(native_s)), None
    if span_s >= SEASONAL_MIN_SPAN_S:
        return SEASONAL_CADENCE_S, SEASONAL_PERIOD
    for cadence in FINE_CADENCES_S:
        if cadence >= native_s * 0.999 and span_s / cadence >= TARGET_POINTS:
            return cadence, None
    allowed = [c for c in FINE_CADENCES_S if c >= native_s * 0.999]
    return (min(allowed) if allowed else SEASONAL_CADENCE_S), None


def _bucket(
    t: FloatArray, v: FloatArray, cadence: float, native: float, agg: str
) -> tuple[float, FloatArray, list[str]]:
    notes: list[str] = []
    b = np.floor(t / cadence).astype(np.int64)
    b0 = int(b[0])
    rel = b - b0
    nb = int(rel[-1]) + 1
    counts = np.bincount(rel, minlength=nb).astype(np.float64)
    if agg == "max":
        out = np.full(nb, -np.inf)
        np.maximum.at(out, rel, v)
    else:
        out = np.bincount(rel, weights=v, minlength=nb) / np.maximum(counts, 1.0)
    out = np.where(counts > 0, out, np.nan)
    expected = cadence / native
    first, last = 0, nb
    if expected > 1.5:
        if counts[0] < 0.5 * expected:
            first = 1
        if nb - 1 > first and counts[-1] < 0.5 * expected:
            last = nb - 1
        if first or last < nb:
            notes.append("partial first/last bucket (< half its raw points) dropped")
    return (b0 + first) * cadence, out[first:last], notes


def _runs_of_nan(values: FloatArray) -> list[tuple[int, int]]:
    """(start, length) of every run of NaN."""
    runs: list[tuple[int, int]] = []
    i, n = 0, len(values)
    while i < n:
        if math.isnan(values[i]):
            j = i
            while j < n and math.isnan(values[j]):
                j += 1
            runs.append((i, j - i))
            i = j
        else:
            i += 1
    return runs


def rebucket(series: pd.Series, cadence_s: float, *, agg: str = "mean") -> dict[float, float]:
    """``series`` in the UTC-aligned buckets of a given cadence, as :func:`prepare` forms them
    (the ``agg`` of the raw points in each; a partial first/last bucket dropped), without
    choosing the cadence, filling gaps or asking for a length: {bucket start: value}, empty
    buckets left out. The closed loop (planner/plan/outcome.py) puts later demand on the
    buckets of a stored forecast this way."""
    if not (cadence_s > 0 and math.isfinite(cadence_s)):
        raise SeriesError(f"cadence must be a positive number of seconds, got {cadence_s!r}")
    if agg not in AGGREGATIONS:
        raise SeriesError(f"agg must be one of {', '.join(AGGREGATIONS)}, got {agg!r}")
    t, v, _ = to_epoch_arrays(series)
    if not len(t):
        return {}
    diffs = np.diff(t)
    diffs = diffs[diffs > 0]
    native = float(np.median(diffs)) if diffs.size else cadence_s
    start, values, _ = _bucket(t, v, cadence_s, native, agg)
    return {
        start + i * cadence_s: float(x) for i, x in enumerate(values.tolist()) if math.isfinite(x)
    }


def prepare(series: pd.Series, *, what: str, agg: str = "mean") -> Prepared:
    """Check, resample and gap-fill ``series``; raise InsufficientHistory when too short."""
    t, v, notes = to_epoch_arrays(series)
    if len(t) < 3:
        raise InsufficientHistory(f"{what} forecast", MIN_POINTS, len(t))
    raw_points = len(t)
    after_gap = ""
    while True:
        diffs = np.diff(t)
        diffs = diffs[diffs > 0]
        if diffs.size == 0:
            raise InsufficientHistory(f"{what} forecast (all points at one time)", MIN_POINTS, 1)
        native = float(np.median(diffs))
        span = float(t[-1] - t[0] + native)
        cadence, period = choose_cadence(native, span)
        label = f"{what} forecast at {cadence:g} s cadence{after_gap}"
        start, values, bucket_notes = _bucket(t, v, cadence, native, agg)
        long_runs = [r for r in _runs_of_nan(values) if r[1] > MAX_FILL_BUCKETS]
        if not long_runs:
            break
        gap_start, gap_len = long_runs[-1]
        cut = start + (gap_start + gap_len) * cadence
        dropped = int((t < cut).sum())
        notes.append(
            f"history before a {gap_len * cadence / 3600:.1f} h gap ending at epoch {cut:.0f} "
            f"dropped ({dropped} raw points); only the latest contiguous stretch is modelled"
        )
        t, v = t[t >= cut], v[t >= cut]
        after_gap = f" after a {gap_len * cadence / 3600:.1f} h gap"
        if len(t) < 3:
            raise InsufficientHistory(f"{label}{after_gap}", MIN_POINTS, len(t))
    notes.extend(bucket_notes)
    if len(values) < MIN_POINTS:
        raise InsufficientHistory(label, MIN_POINTS, len(values))
    missing = np.isnan(values)
    if missing.any():
        idx = np.arange(len(values))
        values = values.copy()
        values[missing] = np.interp(idx[missing], idx[~missing], values[~missing])
        notes.append(
            f"{int(missing.sum())} empty buckets (gaps of <= {MAX_FILL_BUCKETS}) filled by "
            "linear interpolation"
        )
    return Prepared(
        start=start,
        cadence_s=cadence,
        values=values.astype(np.float64),
        seasonal_period=period,
        native_cadence_s=native,
        raw_points=raw_points,
        notes=tuple(notes),
    )


def demand_series_from_windows(
    windows: Iterable[Window],
    *,
    signal: str = "kv_cache_usage_ratio",
    capacity_tokens: float | Mapping[str, float] | None = None,
) -> pd.Series:
    """Cluster-level demand from Window records (pure: no store access).

    Per series a window's value is its mean (gauge/ratio), rate (counter) or delta / length_s
    (histogram), times ``capacity_tokens`` when given (one number, or per Window.source); series
    are summed per window start, a missing window inside a series' lifetime interpolated, 0
    outside it. Returns a Series indexed by window start (epoch s), named after the signal;
    :func:`demand_series_from_frame` does the same from ``Store.read_frame``'s frame.
    Rules: planner/forecast/METHODS.md#data
    """
    mine = [w for w in windows if w.signal == signal]
    frame = windows_frame(mine, FRAME_COLUMNS)
    return demand_series_from_frame(frame, signal=signal, capacity_tokens=capacity_tokens)


# The Store.read_frame columns demand_series_from_frame reads.
FRAME_COLUMNS = ("source", "signal", "labels", "kind", "start", "length_s", "delta", "rate",
                 "mean")  # fmt: skip


def demand_series_from_frame(
    frame: pd.DataFrame | None,
    *,
    signal: str = "kv_cache_usage_ratio",
    capacity_tokens: float | Mapping[str, float] | None = None,
) -> pd.Series:
    """:func:`demand_series_from_windows` from a ``Store.read_frame`` frame (FRAME_COLUMNS;
    NaN = unknown): the same series from the same windows. A frame without a ``signal``
    column is that signal's; a value column it lacks (the signal's kinds never use) or no
    frame at all reads as unknown."""
    if frame is None:
        frame = pd.DataFrame({"source": [], "labels": [], "kind": [], "start": []})
    if "signal" in frame.columns:
        rows = np.flatnonzero((frame["signal"] == signal).to_numpy(dtype=bool))
    else:
        rows = np.arange(len(frame), dtype=np.int64)

    def col(name: str) -> FloatArray:
        if name not in frame.columns:
            return np.full(rows.size, np.nan)
        out: FloatArray = frame[name].to_numpy(dtype=np.float64, na_value=np.nan)[rows]
        return out

    kind = frame["kind"].take(rows)

    def of_kind(*names: str) -> npt.NDArray[np.bool_]:
        out: npt.NDArray[np.bool_] = kind.isin(names).to_numpy(dtype=bool)
        return out

    delta, length = col("delta"), col("length_s")
    with np.errstate(invalid="ignore", divide="ignore"):
        per_s = np.where(np.isnan(delta) | ~(length > 0), np.nan, delta / length)
    value = np.where(of_kind("counter"), col("rate"), per_s)  # a histogram: observations/s
    value = np.where(of_kind("gauge", "ratio"), col("mean"), value)
    keep = np.isfinite(value)
    rows, value = rows[keep], value[keep]
    if rows.size == 0:
        raise SeriesError(f"no windows of signal {signal!r} with a value")
    start = col("start")
    src_codes, src_names = _codes(frame["source"], rows)
    if isinstance(capacity_tokens, Mapping):
        missing = [i for i, s in enumerate(src_names.tolist()) if s not in capacity_tokens]
        if missing:
            at = int(np.flatnonzero(np.isin(src_codes, missing))[0])
            raise SeriesError(
                f"capacity_tokens has no entry for source {src_names[src_codes[at]]!r} "
                f"(signal {signal}, window start {start[at]:.0f})"
            )
        per_source = [float(capacity_tokens[s]) for s in src_names.tolist()]
        value = value * np.asarray(per_source, dtype=np.float64)[src_codes]
    elif capacity_tokens is not None:
        value = value * capacity_tokens
    # Series key "source|k=v,…" (labels in name order), built once per distinct series.
    lab_codes, lab_texts = _codes(frame["labels"], rows)
    width = max(len(lab_texts), 1)
    pair_codes, pairs = pd.factorize(src_codes.astype(np.int64) * width + lab_codes)
    keys = [
        f"{src_names[p // width]}|"
        + ",".join(f"{k}={v}" for k, v in json.loads(lab_texts[p % width]).items())
        for p in pairs.tolist()
    ]
    wide = _wide(start, pair_codes, keys, value)
    if wide is None:  # several windows of one series at one start (or no start): their mean
        series = np.asarray(keys, dtype=object)[pair_codes]
        long = pd.DataFrame({"start": start, "series": series.tolist(), "value": value})
        wide = long.pivot_table(index="start", columns="series", values="value", aggfunc="mean")
    wide = wide.interpolate(method="index", limit_area="inside").fillna(0.0)
    out = wide.sum(axis=1).astype(np.float64)
    out.index = out.index.astype(np.float64)
    out.name = signal
    return out


def _codes(column: pd.Series, rows: IntArray) -> tuple[IntArray, npt.NDArray[np.object_]]:
    """(code per row, the values by code) of ``column``'s values at ``rows``, equal values
    one code: a categorical column's own codes when no value is missing (no string made
    per row), else ``pd.factorize``."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        codes = column.cat.codes.to_numpy()[rows].astype(np.int64)
        if not (codes < 0).any():
            n = len(column.cat.categories)
            used = np.flatnonzero(np.bincount(codes, minlength=n))
            dense = np.full(n, -1, dtype=np.int64)
            dense[used] = np.arange(used.size)
            names = np.asarray(column.cat.categories, dtype=object)[used]
            return dense[codes], names
    codes, uniques = pd.factorize(column.take(rows).to_numpy(dtype=object))
    return np.asarray(codes, dtype=np.int64), np.asarray(uniques, dtype=object)


def _wide(
    start: FloatArray, codes: IntArray, keys: list[str], value: FloatArray
) -> pd.DataFrame | None:
    """``pivot_table(index="start", columns="series", values="value", aggfunc="mean")`` of
    the rows (series key ``keys[codes]``) when each (start, series) holds one row: then
    the mean is the value itself. None when one holds several or a start is missing."""
    if np.isnan(start).any():
        return None
    # pd.factorize(start, sort=True), the sort on the uniques alone: half its time
    row, at = pd.factorize(start)
    by_start = np.argsort(at, kind="stable")
    rank_of = np.empty(by_start.size, dtype=np.int64)
    rank_of[by_start] = np.arange(by_start.size)
    row, at = rank_of[row], at[by_start]
    rank = np.argsort(np.asarray(keys, dtype=object), kind="stable")
    col = np.empty(rank.size, dtype=np.int64)
    col[rank] = np.arange(rank.size)
    size = at.size * rank.size
    cell = row.astype(np.int64) * rank.size + col[codes]
    once = (
        np.bincount(cell, minlength=size).max(initial=0) <= 1
        if size <= 4 * cell.size  # a dense count is cheap next to the table itself
        else pd.Index(cell).is_unique
    )
    if not once:
        return None
    values = np.full(size, np.nan)
    values[cell] = value
    names = pd.Index([keys[i] for i in rank.tolist()], name="series")
    return pd.DataFrame(
        values.reshape(at.size, rank.size),
        index=pd.Index(np.asarray(at, dtype=np.float64), name="start"),
        columns=names,
    )
