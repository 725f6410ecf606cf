"""The windows a plan reads, by signal, with only the columns each statistic needs.

:class:`WindowTable` holds per signal the rows `kvscope plan` still reads after building its
frame (a ``Store.read_frame`` frame of that signal: categorical source/labels/kind, float64
values, NaN = unknown, in read_windows' order) and, for every signal, how many windows each
source has and their span. A long frame of many signals (or Window records, converted by
``store.frame.windows_frame``) is split by signal: both give the same numbers.

Sums that must equal a loop over Window records (``total += w.delta`` in row order) use
:func:`seq_sum`: numpy's ``sum`` adds pairwise and would differ in the last bits.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from core.records import Window
from store.frame import windows_frame

if TYPE_CHECKING:
    import numpy.typing as npt

    FloatArray = npt.NDArray[np.float64]
    IntArray = npt.NDArray[np.int64]

# The frame columns the plan uses (Store.read_frame(columns=PLAN_COLUMNS)); model_name
# gives each engine its model group (planner/frames/groups.py).
PLAN_COLUMNS = ("source", "signal", "labels", "engine", "model_name", "kind", "start",
                "length_s", "delta", "rate", "mean", "max", "last", "p50", "p90", "p99",
                "sum_delta")  # fmt: skip


def seq_sum(values: FloatArray) -> float:
    """``0.0 + v[0] + v[1] + …`` left to right, as a Python loop adds (not pairwise)."""
    if values.size == 0:
        return 0.0
    return float(np.cumsum(np.concatenate(([0.0], values)))[-1])


def names(column: pd.Series) -> set[str]:
    """The distinct values of a frame column as strings (one hash pass, no Python loop)."""
    return {str(v) for v in column.unique()}


def weighted_median_array(v: FloatArray, w: FloatArray) -> float | None:
    """plan_observe.weighted_median of arrays: the same pairs, order and running sum as its
    loop (finite values with weight > 0, sorted by value then weight), vectorized."""
    keep = np.isfinite(v) & (w > 0)
    v, w = v[keep], w[keep]
    order = np.argsort(v)  # distinct values (a plan's latencies): the pairs' order already
    if v.size > 1 and (np.diff(v[order]) == 0).any():  # ties: by weight, then position
        order = np.lexsort((w, v))  # as sorting (value, weight) pairs
    v, w = v[order], w[order]
    run = np.cumsum(w)  # left to right, as the loop adds
    if v.size == 0 or not run[-1] > 0:
        return None
    at = np.flatnonzero(run >= run[-1] / 2)
    return float(v[at[0]] if at.size else v[-1])


class WindowTable:
    """The windows of a plan by signal: each signal's rows (in read_windows' order, with
    the columns its consumers read) and how many windows each source has and when."""

    def __init__(self, frame: pd.DataFrame | None = None) -> None:
        self.parts: dict[str, pd.DataFrame] = {}
        # one row per (signal, source): windows, first start, last end
        self.summary = pd.DataFrame(
            {"signal": [], "source": [], "windows": [], "first": [], "last": []}
        ).astype({"windows": "int64", "first": "float64", "last": "float64"})
        if frame is not None and len(frame):
            signal = frame["signal"].astype(str).to_numpy(dtype=object)
            for name in sorted(set(signal.tolist())):
                self.add(name, frame[signal == name].reset_index(drop=True))

    @classmethod
    def of(cls, windows: Sequence[Window] | pd.DataFrame | WindowTable) -> WindowTable:
        """The table of a frame, of Window records (converted), or the table itself."""
        if isinstance(windows, WindowTable):
            return windows
        if isinstance(windows, pd.DataFrame):
            return cls(windows)
        return cls(windows_frame(windows, PLAN_COLUMNS))

    def add(self, signal: str, rows: pd.DataFrame, keep: Iterable[str] | None = None) -> None:
        """Count one signal's rows (read_frame's columns) and keep ``keep`` of its columns
        (all when None; none when empty: the signal is only counted)."""
        if not len(rows):
            return
        counted = _count(rows)
        counted.insert(0, "signal", signal)
        self.summary = pd.concat([self.summary, counted], ignore_index=True)
        cols = list(rows.columns) if keep is None else [c for c in rows.columns if c in set(keep)]
        if cols:
            part = rows[cols]
            for name in ("source", "labels", "kind", "signal"):
                if name in part.columns and not isinstance(part[name].dtype, pd.CategoricalDtype):
                    part = part.assign(**{name: part[name].astype("category")})
            self.parts[signal] = part

    def __len__(self) -> int:
        return int(self.summary["windows"].sum())

    def drop_rows(self) -> None:
        """Forget the kept rows; the counts (len, sources, span) stay."""
        self.parts.clear()

    @property
    def sources(self) -> set[str]:
        """Every source with a window of any signal."""
        return {str(s) for s in self.summary["source"]}

    def sources_of(self, signals: Iterable[str]) -> set[str]:
        """The sources with a window of one of these signals."""
        wanted = self.summary["signal"].isin(list(signals))
        return {str(s) for s in self.summary["source"][wanted]}

    def span(self) -> tuple[float, float]:
        """(first window start, last window end); NaN when there is no window."""
        if not len(self.summary):
            return math.nan, math.nan
        return float(self.summary["first"].min()), float(self.summary["last"].max())

    def part(self, signal: str) -> pd.DataFrame | None:
        """The kept rows of one signal (read_windows' order), None when it has none."""
        return self.parts.get(signal)

    def rows(self, signal: str, sources: Iterable[str] | None = None) -> IntArray:
        """Positions in the signal's part of its rows (of these sources)."""
        part = self.parts.get(signal)
        if part is None:
            return np.zeros(0, dtype=np.int64)
        if sources is None:
            return np.arange(len(part), dtype=np.int64)
        src = part["source"]
        known = np.append(np.isin(src.cat.categories.astype(str), list(sources)), False)
        out: IntArray = np.flatnonzero(known[src.cat.codes.to_numpy()])
        return out

    def values(self, signal: str, column: str, rows: IntArray | None = None) -> FloatArray:
        """A float column of the signal's rows (all, or these positions); NaN = unknown."""
        part = self.parts.get(signal)
        if part is None:
            return np.zeros(0, dtype=np.float64)
        out: FloatArray = part[column].to_numpy(dtype=np.float64, na_value=np.nan)
        return out if rows is None else out[rows]

    def codes(self, signal: str, name: str, rows: IntArray | None = None) -> IntArray:
        """Category codes of the signal's ``source`` or ``labels`` (-1 = missing)."""
        part = self.parts.get(signal)
        if part is None:
            return np.zeros(0, dtype=np.int64)
        out: IntArray = part[name].cat.codes.to_numpy().astype(np.int64)
        return out if rows is None else out[rows]

    def names(self, signal: str) -> list[str]:
        """The signal's ``source`` categories (what its source codes stand for)."""
        part = self.parts.get(signal)
        return [] if part is None else [str(c) for c in part["source"].cat.categories]

    def restrict(self, sources: Iterable[str]) -> WindowTable:
        """The windows of these sources only (unused categories dropped)."""
        wanted = set(sources)
        out = WindowTable()
        out.summary = self.summary[self.summary["source"].isin(wanted)].reset_index(drop=True)
        for signal, part in self.parts.items():
            sub = part.iloc[self.rows(signal, wanted)].reset_index(drop=True)
            for name in ("source", "labels", "kind", "signal"):
                if name in sub.columns:
                    sub = sub.assign(**{name: sub[name].cat.remove_unused_categories()})
            if len(sub):
                out.parts[signal] = sub
        return out


def _count(rows: pd.DataFrame) -> pd.DataFrame:
    """Per source (by name): its windows, first start and last end (NaN skipped), from the
    categorical source's codes."""
    source = rows["source"]
    start = rows["start"].to_numpy(dtype=np.float64)
    end = start + rows["length_s"].to_numpy(dtype=np.float64)
    if not isinstance(source.dtype, pd.CategoricalDtype) or (source.cat.codes < 0).any():
        text = source.astype(str).to_numpy(dtype=object)
        by = pd.DataFrame({"source": text, "first": start, "last": end}).groupby(
            "source", sort=True
        )
        return pd.DataFrame(
            {"windows": by.size(), "first": by["first"].min(), "last": by["last"].max()}
        ).reset_index()
    codes = source.cat.codes.to_numpy().astype(np.intp)
    width = len(source.cat.categories)
    windows = np.bincount(codes, minlength=width)
    first, last = np.full(width, np.nan), np.full(width, np.nan)
    np.fmin.at(first, codes, start)
    np.fmax.at(last, codes, end)
    cats = [str(c) for c in source.cat.categories]
    at = sorted((i for i in range(width) if windows[i]), key=cats.__getitem__)
    return pd.DataFrame(
        {
            "source": np.asarray([cats[i] for i in at], dtype=object),
            "windows": windows[at].astype(np.int64),
            "first": first[at],
            "last": last[at],
        }
    )
