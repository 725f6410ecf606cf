"""The analysis frame of planner/frames/frames.py built one signal at a time.

:class:`FrameBuilder` takes each signal's windows (a ``Store.read_frame`` frame of one
signal, with categorical ``source``/``engine``/``model_name``) and folds them into per-row
sums, counts and maxima at once, so only one signal's windows are held at a time. Rows are
keyed by (source, engine label or none, window start) as they arrive; :meth:`finish` joins
a source's series without an engine label to its only engine (as engine_frame does) and
returns the frame, equal to ``engine_frame`` of all the windows, and the sources it cannot
join exactly (a row given windows of one signal from both keys, or windows of unequal
lengths): their rows must be rebuilt from their windows with engine_frame.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING

from planner.frames.frames import _RATIO_WEIGHT, _RATIOS, _SIMPLE, COLUMNS, _dtype, add_derived
from planner.frames.groups import modes_and_groups

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pandas as pd

    FloatArray = npt.NDArray[np.float64]
    IntArray = npt.NDArray[np.int64]

_SHIFT = 32  # row key: pair id << _SHIFT | start id


def _roles(signal: str) -> list[tuple[str, str, str]]:
    """(accumulator, field, how) of the frame that this signal's windows feed."""
    out = [(col, field, how) for col, sig, field, how in _SIMPLE if sig == signal]
    for col, ratio, numer, denom in _RATIOS:
        if signal == ratio:
            out += [(f"{col}:w", "delta", "sum"), (col, "mean", "wmean")]
        if signal == numer:
            out.append((f"{col}:num", "delta", "sum"))
        if signal == denom:
            out.append((f"{col}:den", "delta", "sum"))
    return out


def fields_of(signal: str) -> set[str]:
    """The read_frame value columns the frame reads of this signal."""
    out = {"start", "length_s"}
    for _, field, how in _roles(signal):
        out |= {"rate", "delta"} if field == "rate" else {field}
        if how == "wmean":
            out.add("delta")
    return out


class FrameBuilder:
    """Per-row accumulators of the frame, filled signal by signal (module docstring)."""

    def __init__(self) -> None:
        import numpy as np
        import pandas as pd

        self.sources: dict[str, int] = {}
        self.engines: dict[str, int] = {}
        self.models: dict[str, int] = {}
        self.pairs: dict[tuple[int, int], int] = {}  # (source id, engine id or -1) -> pair
        self.starts = pd.Index(np.zeros(0, dtype=np.float64))
        self.keys = pd.Index(np.zeros(0, dtype=np.int64))
        self.acc: dict[str, FloatArray] = {}  # sums (or maxima) per row
        self.cnt: dict[str, IntArray] = {}  # windows counted in each
        self.length = np.zeros(0)  # Σ length_s per row, added window by window
        self.windows = np.zeros(0, dtype=np.int64)  # windows per row
        self.lo, self.hi = np.zeros(0), np.zeros(0)  # least and greatest length_s per row
        self.model_counts: Counter[tuple[int, bool, int]] = Counter()
        self.done: set[str] = set()

    def _ids(self, table: dict[str, int], values: object) -> IntArray:
        import numpy as np

        return np.asarray([table.setdefault(str(v), len(table)) for v in values], dtype=np.int64)

    def _grow(self, n: int) -> None:
        import numpy as np

        def more(a: npt.NDArray[np.generic], fill: float) -> npt.NDArray[np.generic]:
            return np.concatenate([a, np.full(n - a.size, fill, dtype=a.dtype)])

        for name, a in self.acc.items():
            self.acc[name] = more(a, -np.inf if name.endswith(":max") else 0.0)
        for name, c in self.cnt.items():
            self.cnt[name] = more(c, 0)
        self.length, self.windows = more(self.length, 0.0), more(self.windows, 0)
        self.lo, self.hi = more(self.lo, np.inf), more(self.hi, -np.inf)

    def _rows(self, part: pd.DataFrame) -> tuple[IntArray, IntArray]:
        """(row id, pair id) of each window, rows and pairs made as first seen."""
        import numpy as np
        import pandas as pd

        src, eng = part["source"].cat, part["engine"].cat
        s_id = self._ids(self.sources, src.categories)
        e_id = np.append(self._ids(self.engines, eng.categories), -1)
        width = len(e_id)
        e_code = eng.codes.to_numpy().astype(np.int64)
        e_code = np.where(e_code < 0, width - 1, e_code)
        combo = src.codes.to_numpy().astype(np.int64) * width + e_code
        lut = np.zeros(len(s_id) * width, dtype=np.int64)
        for c in _present(combo)[0].tolist():
            s, e = int(s_id[c // width]), int(e_id[c % width])
            lut[c] = self.pairs.setdefault((s, e), len(self.pairs))
        pair = lut[combo]
        start = part["start"].to_numpy(dtype=np.float64)
        at = self.starts.get_indexer(start)
        if (at < 0).any():
            self.starts = self.starts.append(pd.Index(pd.unique(start[at < 0])))
            at = self.starts.get_indexer(start)
        key = (pair << _SHIFT) | at.astype(np.int64)
        row = self.keys.get_indexer(key)
        if (row < 0).any():
            self.keys = self.keys.append(pd.Index(pd.unique(key[row < 0])))
            self._grow(len(self.keys))
            row = self.keys.get_indexer(key)
        return row.astype(np.int64), pair

    def add(self, signal: str, part: pd.DataFrame) -> None:
        """Fold one signal's windows (all of them, read_windows' order) into the rows."""
        import numpy as np

        if signal in self.done:
            raise ValueError(f"signal {signal!r} added twice")
        self.done.add(signal)
        if not len(part):
            return
        row, pair = self._rows(part)
        n = len(self.keys)
        length = part["length_s"].to_numpy(dtype=np.float64)
        np.add.at(self.length, row, length)  # window by window, as one bincount adds
        self.windows += np.bincount(row, minlength=n)
        np.minimum.at(self.lo, row, length)
        np.maximum.at(self.hi, row, length)
        self._count_models(part, pair)
        cols = {c: part[c].to_numpy(dtype=np.float64) for c in fields_of(signal) if c in part}
        for name, field, how in _roles(signal):
            if field == "rate":  # a counter without a rate: delta / length
                with np.errstate(invalid="ignore", divide="ignore"):
                    v = np.where(np.isnan(cols["rate"]), cols["delta"] / length, cols["rate"])
            else:
                v = cols[field]
            keep = ~np.isnan(v)
            idx = row[keep]
            self.cnt[name] = np.bincount(idx, minlength=n)
            if how == "max":
                res = np.full(n, -np.inf)
                np.maximum.at(res, idx, v[keep])
                self.acc[name + ":max"] = res
            elif how == "wmean":
                wt = np.where(np.isnan(cols["delta"]), 1.0, cols["delta"])[keep]
                self.acc[name + ":top"] = np.bincount(idx, weights=v[keep] * wt, minlength=n)
                self.acc[name + ":bottom"] = np.bincount(idx, weights=wt, minlength=n)
            else:
                self.acc[name] = np.bincount(idx, weights=v[keep], minlength=n)

    def _count_models(self, part: pd.DataFrame, pair: IntArray) -> None:
        """Windows per (pair, engine-labelled, model) for the group of each engine."""
        import numpy as np

        if "model_name" not in part.columns:
            return
        model = part["model_name"].cat
        m_id = self._ids(self.models, model.categories)
        m_code = model.codes.to_numpy().astype(np.int64)
        sel = m_code >= 0
        labelled = (part["engine"].cat.codes.to_numpy() >= 0)[sel]
        width = max(len(m_id), 1)
        keys, counts = _present((pair[sel] * 2 + labelled) * width + m_code[sel])
        for k, c in zip(keys.tolist(), counts.tolist(), strict=True):
            p, m = divmod(k, width)
            self.model_counts[(p // 2, bool(p % 2), int(m_id[m]))] += c


    def finish(self, meta: Mapping[str, object]) -> tuple[pd.DataFrame, set[str]]:
        """(the frame, the sources whose rows need engine_frame) (module docstring);
        ``meta`` maps a source (or ``"source/engine"``) to its engine record."""
        import numpy as np
        import pandas as pd

        if not len(self.keys):
            return pd.DataFrame({c: pd.Series(dtype=_dtype(c)) for c in COLUMNS}), set()
        n_pairs = len(self.pairs)
        p_src, p_eng = np.zeros(n_pairs, dtype=np.int64), np.zeros(n_pairs, dtype=np.int64)
        for (s, e), p in self.pairs.items():
            p_src[p], p_eng[p] = s, e
        key = self.keys.to_numpy()
        row_pair, row_start = key >> _SHIFT, key & ((1 << _SHIFT) - 1)
        # A series without an engine label joins its source's only engine.
        engines_of: dict[int, list[int]] = {}
        present = _present(row_pair)[0].tolist()
        for p in present:
            if p_eng[p] >= 0:
                engines_of.setdefault(int(p_src[p]), []).append(p)
        target = np.arange(n_pairs, dtype=np.int64)
        for p in present:
            only = engines_of.get(int(p_src[p]), [])
            if p_eng[p] < 0 and len(only) == 1:
                target[p] = only[0]
        final_pair = target[row_pair]
        of, final_key = pd.factorize((final_pair << _SHIFT) | row_start)
        of = of.astype(np.int64)
        merged = _Merge(of, len(final_key))
        inexact = merged.conflicts(self.cnt, self.lo, self.hi)
        cols: dict[str, object] = {}
        cols["window_s"] = merged.lengths(self.length, self.windows, self.lo)
        self.length = self.lo = self.hi = np.zeros(0)
        out = _columns(merged, self.acc, self.cnt)
        self.acc, self.cnt = {}, {}
        fp = np.asarray(final_key, dtype=np.int64) >> _SHIFT
        starts = self.starts.to_numpy()[np.asarray(final_key, dtype=np.int64) & ((1 << _SHIFT) - 1)]
        src_names = np.asarray([*self.sources, ""], dtype=object)
        eng_names = np.asarray([*self.engines, ""], dtype=object)
        n_eng = len(eng_names)
        eng_idx = np.where(p_eng[fp] < 0, n_eng - 1, p_eng[fp])
        key_of_row = p_src[fp] * n_eng + eng_idx
        pair_u, pair_model, models = self._pair_models(target, p_src, p_eng, n_eng)
        order = np.lexsort((starts, _ranks(eng_names)[eng_idx], _ranks(src_names)[p_src[fp]]))
        mode, group = modes_and_groups(src_names, eng_names, key_of_row, n_eng, meta, models,
                                       pair_u, pair_model, starts)  # fmt: skip
        cols |= {"source": src_names[p_src[fp]], "engine": eng_names[eng_idx], "start": starts,
                 "offload_mode": mode, "group": group}  # fmt: skip
        cols |= out
        data = {c: np.asarray(cols[c])[order] for c in COLUMNS}
        bad = {str(src_names[s]) for s in np.unique(p_src[fp[inexact]]).tolist()}
        return pd.DataFrame(data, copy=False), bad

    def _pair_models(
        self, target: IntArray, p_src: IntArray, p_eng: IntArray, n_eng: int
    ) -> tuple[IntArray, IntArray, list[str]]:
        """(engine keys, model code of each (-1: none), the model names by code): the most
        common model among a key's engine-labelled windows, else among all (frames.pair_models)."""
        import numpy as np

        models = sorted(self.models)
        rank = {self.models[m]: i for i, m in enumerate(models)}
        counts: dict[int, list[Counter[int]]] = {}
        for (p, labelled, m), c in self.model_counts.items():
            f = int(target[p])
            k = int(p_src[f]) * n_eng + (n_eng - 1 if p_eng[f] < 0 else int(p_eng[f]))
            counts.setdefault(k, [Counter(), Counter()])[int(labelled)][rank[m]] += c
        pairs = {int(p_src[p]) * n_eng + (n_eng - 1 if p_eng[p] < 0 else int(p_eng[p]))
                 for p in np.unique(target).tolist()}  # fmt: skip
        pair_u = np.asarray(sorted(pairs), dtype=np.int64)
        best = []
        for k in pair_u.tolist():
            by = counts.get(k, [Counter(), Counter()])
            use = by[1] if by[1] else by[0]
            top = max(use.values(), default=0)
            best.append(min(m for m, c in use.items() if c == top) if use else -1)
        return pair_u, np.asarray(best, dtype=np.int64), models


class _Merge:
    """Raw rows (a source's unlabelled series apart) onto the frame's rows."""

    def __init__(self, of: IntArray, n: int) -> None:
        import numpy as np

        self.of, self.n = of, n
        self.shared = np.bincount(of, minlength=n) > 1  # rows made of several raw rows

    def conflicts(self, cnt: Mapping[str, IntArray], lo: FloatArray, hi: FloatArray) -> IntArray:
        """Rows whose merge is not exact: one signal's windows in two raw rows, or windows of
        unequal lengths."""
        import numpy as np

        bad = np.zeros(self.n, dtype=bool)
        if not self.shared.any():
            return np.flatnonzero(bad)
        for c in cnt.values():
            bad |= np.bincount(self.of, weights=(c > 0).astype(float), minlength=self.n) > 1
        least, most = np.full(self.n, np.inf), np.full(self.n, -np.inf)
        np.minimum.at(least, self.of, lo)
        np.maximum.at(most, self.of, hi)
        bad |= self.shared & ~(least == most)
        return np.flatnonzero(bad)

    def total(self, a: FloatArray, c: IntArray) -> FloatArray:
        """Per row the value of the raw row that has windows (sums, or counts)."""
        import numpy as np

        out = np.zeros(self.n, dtype=a.dtype)
        has = c > 0
        out[self.of[has]] = a[has]
        return out

    def count(self, c: IntArray) -> IntArray:
        import numpy as np

        out: IntArray = np.bincount(self.of, weights=c, minlength=self.n).astype(np.int64)
        return out

    def most(self, a: FloatArray) -> FloatArray:
        import numpy as np

        out = np.full(self.n, -np.inf)
        np.maximum.at(out, self.of, a)
        return out

    def lengths(self, total: FloatArray, windows: IntArray, lo: FloatArray) -> FloatArray:
        """Mean window length per row: a merged row of k windows of one length L is
        L + L + … (k times, left to right, as engine_frame adds them)."""
        import numpy as np

        out = self.total(total, windows)
        k = self.count(windows)
        rows = np.flatnonzero(self.shared)
        if rows.size:
            length = np.full(self.n, np.inf)
            np.minimum.at(length, self.of, lo)
            step, kk, acc = length[rows], k[rows], np.zeros(rows.size)
            for j in range(1, int(kk.max()) + 1):
                acc = np.where(kk >= j, acc + step, acc)
            out[rows] = acc
        return out / k


def _columns(
    m: _Merge, acc: dict[str, FloatArray], cnt: dict[str, IntArray]
) -> dict[str, FloatArray]:
    """The frame's value columns from the merged accumulators (as frames.engine_frame)."""
    import numpy as np

    nan = np.full(m.n, np.nan)

    def agg(name: str, how: str) -> FloatArray:
        if name not in cnt:
            return nan
        raw = cnt.pop(name)
        c = m.count(raw)
        if how == "max":
            res = m.most(acc.pop(name + ":max"))
        else:
            res = m.total(acc.pop(name), raw)
            if how == "mean":
                res = res / np.maximum(c, 1)
        return np.where(c > 0, res, np.nan)

    out: dict[str, FloatArray] = {}
    for col, _, _, how in _SIMPLE:
        out[col] = agg(col, how)
    for col, _, _, _ in _RATIOS:
        w = agg(f"{col}:w", "sum")
        r = nan
        if col in cnt:
            c = cnt.pop(col)
            top, bottom = m.total(acc.pop(col + ":top"), c), m.total(acc.pop(col + ":bottom"), c)
            with np.errstate(invalid="ignore", divide="ignore"):
                r = np.where(bottom > 0, top / bottom, np.nan)
        d_num, d_den = agg(f"{col}:num", "sum"), agg(f"{col}:den", "sum")
        with np.errstate(invalid="ignore", divide="ignore"):
            fallback = np.where(d_den > 0, d_num / d_den, np.nan)
        out[col] = np.where(np.isnan(r), fallback, r)
        if col in _RATIO_WEIGHT:
            out[_RATIO_WEIGHT[col]] = np.where(np.isnan(w), d_den, w)
    add_derived(out)
    return out


def _ranks(names: npt.NDArray[np.object_]) -> IntArray:
    """Each name's rank in sorted order (the frame is sorted by source, engine, start)."""
    import numpy as np

    order = sorted(range(len(names)), key=lambda i: str(names[i]))
    out = np.empty(len(names), dtype=np.int64)
    out[order] = np.arange(len(names))
    return out


def _present(keys: IntArray) -> tuple[IntArray, IntArray]:
    """The distinct non-negative keys and how often each occurs (a bincount when dense)."""
    import numpy as np

    if keys.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    top = int(keys.max()) + 1
    if top <= 4 * keys.size + 1_000_000:
        counts = np.bincount(keys, minlength=top)
        at = np.flatnonzero(counts)
        return at.astype(np.int64), counts[at].astype(np.int64)
    uniq, cnt = np.unique(keys, return_counts=True)
    return uniq.astype(np.int64), cnt.astype(np.int64)
