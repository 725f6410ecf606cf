"""Windows -> one analysis frame per (source, engine, window start).

Builds the pandas DataFrame the fits read, one row per engine ``(source, engine label)`` and
window, from :class:`core.records.Window` records or an equivalent DataFrame. Series of one
signal on one engine and window are combined (counts added, means averaged or added);
a missing signal is a NaN column, never an error. ``group`` is the engine's model group.

Columns and rules: planner/frames/METHODS.md#frames
"""

from __future__ import annotations

import json
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from core.catalog import ENGINE_LABEL
from core.records import Window
from planner.frames.groups import modes_and_groups, pair_models

if TYPE_CHECKING:
    import numpy.typing as npt

# (output column, signal, field, how several series combine) — "sum", "mean", "max".
_SIMPLE: tuple[tuple[str, str, str, str], ...] = (
    ("preemptions", "preemptions_total", "delta", "sum"),
    ("prompt_tokens_per_s", "prompt_tokens_total", "rate", "sum"),
    ("output_tokens_per_s", "generation_tokens_total", "rate", "sum"),
    ("kv_util", "kv_cache_usage_ratio", "mean", "mean"),
    ("kv_util_max", "kv_cache_usage_ratio", "max", "max"),
    ("running", "requests_running", "mean", "mean"),
    ("waiting", "requests_waiting", "mean", "mean"),
    ("ttft_p50_s", "ttft_seconds", "p50", "mean"),
    ("ttft_p90_s", "ttft_seconds", "p90", "mean"),
    ("ttft_p99_s", "ttft_seconds", "p99", "mean"),
    ("ttft_count", "ttft_seconds", "delta", "sum"),
    ("_ttft_sum", "ttft_seconds", "sum_delta", "sum"),
    ("_e2e_count", "e2e_latency_seconds", "delta", "sum"),
    ("_e2e_sum", "e2e_latency_seconds", "sum_delta", "sum"),
    ("_prompt_count", "request_prompt_tokens", "delta", "sum"),
    ("_prompt_sum", "request_prompt_tokens", "sum_delta", "sum"),
    ("requests", "request_success_total", "delta", "sum"),
    ("l1_usage_bytes", "lmcache_l1_usage_bytes", "mean", "sum"),
    ("l1_usage_ratio", "lmcache_l1_usage_ratio", "mean", "mean"),
    ("l1_evicted_chunks", "lmcache_l1_evicted_chunks_total", "delta", "sum"),
    ("offload_cpu_usage_ratio", "offload_cpu_usage_ratio", "mean", "mean"),
)
# (output column, derived ratio signal, numerator counter, denominator counter)
_RATIOS: tuple[tuple[str, str, str, str], ...] = (
    ("prefix_hit_ratio", "prefix_cache_hit_ratio", "prefix_cache_hits_total",
     "prefix_cache_queries_total"),
    ("external_hit_ratio", "external_prefix_cache_hit_ratio", "external_prefix_cache_hits_total",
     "external_prefix_cache_queries_total"),
    ("lmcache_hit_ratio", "lmcache_hit_ratio", "lmcache_hit_tokens_total",
     "lmcache_requested_tokens_total"),
)  # fmt: skip
_RATIO_WEIGHT = {
    "prefix_hit_ratio": "prefix_queries",
    "lmcache_hit_ratio": "lmcache_requested_tokens",
}

SIGNALS: frozenset[str] = frozenset(
    [s for _, s, _, _ in _SIMPLE] + [x for r in _RATIOS for x in r[1:]]
)
_FIELDS = ("delta", "rate", "mean", "max", "p50", "p90", "p99", "sum_delta")
# The label (and Store.read_frame column) naming the served model (store/frame.py).
MODEL_LABEL = "model_name"
_TEXT_COLUMNS = ("source", "engine", "offload_mode", "group")
COLUMNS: tuple[str, ...] = (
    "source", "engine", "start", "window_s", "offload_mode", "group",
    "tokens_per_s", "prompt_tokens_per_s", "output_tokens_per_s", "preemptions",
    "kv_util", "kv_util_max", "running", "waiting", "prefix_hit_ratio", "prefix_queries",
    "external_hit_ratio", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "ttft_count",
    "e2e_mean_s", "prompt_tokens_mean", "requests",
    "lmcache_hit_ratio", "lmcache_requested_tokens", "l1_usage_bytes", "l1_usage_ratio",
    "l1_evicted_chunks", "offload_cpu_usage_ratio",
)  # fmt: skip


def _codes(values: object) -> tuple[npt.NDArray[np.int64], list[object]]:
    """Integer codes (-1 for missing) and the values they stand for (a categorical's own
    codes and categories: no hashing; else in order of appearance)."""
    if isinstance(values, pd.Series) and isinstance(values.dtype, pd.CategoricalDtype):
        cat = values.cat
        return cat.codes.to_numpy().astype("int64"), list(cat.categories)
    codes, uniques = pd.factorize(values)  # type: ignore[call-overload]
    return codes.astype("int64", copy=False), list(uniques)


def _dense(
    codes: npt.NDArray[np.int64], size: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Codes in ``[0, size)`` renumbered densely: (new code per element, old code per new code)."""
    present = np.bincount(codes, minlength=size) > 0
    new_of_old = np.cumsum(present) - 1
    return new_of_old[codes], np.flatnonzero(present)


def _table(
    windows: Sequence[Window] | pd.DataFrame,
) -> tuple[
    dict[str, npt.NDArray[np.float64]], dict[str, tuple[npt.NDArray[np.int64], list[object]]]
]:
    """Numeric columns (start, length_s, fields) and coded columns (source, engine, signal).

    A DataFrame input needs ``source``, ``signal``, ``start``, ``length_s`` and either an
    ``engine`` column or a ``labels`` column (Labels tuples); missing field columns are NaN;
    rows of other signals are ignored. Categorical ``source``/``engine``/``signal`` columns
    (``Store.read_frame``) are the fast path (no hashing).
    """
    num: dict[str, npt.NDArray[np.float64]] = {}
    if isinstance(windows, pd.DataFrame):
        df = windows
        signal = df["signal"]
        if isinstance(signal.dtype, pd.CategoricalDtype):  # per category, not per row
            known = np.append(np.isin(signal.cat.categories, list(SIGNALS)), False)
            keep = known[signal.cat.codes.to_numpy()]
        else:
            keep = signal.isin(SIGNALS).to_numpy(dtype=bool)
        if not keep.all():  # other signals are ignored, as for Window records
            df = df[keep]
        engine = (
            df["engine"]
            if "engine" in df.columns
            else np.asarray(_label_values(df["labels"].tolist(), ENGINE_LABEL), dtype=np.object_)
        )
        coded = {"source": _codes(df["source"]), "engine": _codes(engine),
                 "signal": _codes(df["signal"])}  # fmt: skip
        if MODEL_LABEL in df.columns:
            coded["model"] = _codes(df[MODEL_LABEL])
        elif "labels" in df.columns:
            models = _label_values(df["labels"].tolist(), MODEL_LABEL)
            coded["model"] = _codes(np.asarray(models, dtype=np.object_))
        for name in ("start", "length_s", *_FIELDS):
            if name not in df.columns:
                continue  # an absent field reads as all-NaN
            if df[name].dtype == np.float64:
                num[name] = df[name].to_numpy()
            else:
                num[name] = pd.to_numeric(df[name]).to_numpy(dtype=np.float64, na_value=np.nan)
        return num, coded
    wanted = [w for w in windows if w.signal in SIGNALS]

    def attr(name: str) -> list[object]:
        return list(map(operator.attrgetter(name), wanted))

    coded = {
        "source": _codes(np.asarray(attr("source"), dtype=np.object_)),
        "engine": _codes(np.asarray(_label_values(attr("labels"), ENGINE_LABEL), dtype=np.object_)),
        "signal": _codes(np.asarray(attr("signal"), dtype=np.object_)),
        "model": _codes(np.asarray(_label_values(attr("labels"), MODEL_LABEL), dtype=np.object_)),
    }
    for name in ("start", "length_s", *_FIELDS):
        num[name] = np.asarray(attr(name), dtype=np.float64)  # None -> NaN
    return num, coded


def _label_values(labels: Sequence[object], key: str) -> list[str | None]:
    """The value of label ``key`` per label set (Labels tuples, or the store's JSON text)."""
    cache: dict[object, str | None] = {}
    out: list[str | None] = []
    for lab in labels:
        try:
            out.append(cache[lab])
        except KeyError:
            pairs = json.loads(lab) if isinstance(lab, str) else lab
            value = dict(pairs).get(key) if pairs is not None else None  # type: ignore[arg-type]
            cache[lab] = value if value else None
            out.append(cache[lab])
    return out


def engine_frame(
    windows: Sequence[Window] | pd.DataFrame,
    engines_meta: Mapping[str, object] | None = None,
) -> pd.DataFrame:
    """One row per (source, engine, window start); columns: METHODS.md#frames.

    ``windows``: Window records, or a DataFrame with their fields (see :func:`_table`).
    ``engines_meta`` maps a source (or ``"source/engine"``) to its engine record; its
    ``offload`` (or ``offload_mode``) fills ``offload_mode``, ``"unknown"`` when absent.
    Cost is linear in the number of windows: a few hash passes and bincounts.
    """
    num, coded = _table(windows)
    src_c, src_u = coded["source"]
    eng_c, eng_u = coded["engine"]
    sig_c, sig_u = coded["signal"]
    n_eng = len(eng_u) + 1  # +1: code of "no engine label"
    if src_c.size == 0:
        return pd.DataFrame({c: pd.Series(dtype=_dtype(c)) for c in COLUMNS})
    pair, pair_u = _engine_keys(src_c, eng_c, n_eng)
    mod_c, mod_u = coded.get("model", (np.full(src_c.size, -1, dtype=np.int64), []))
    pair_model = pair_models(pair, pair_u, eng_c >= 0, mod_c, len(mod_u))
    start_c, start_u = pd.factorize(num["start"])
    n_start = len(start_u)
    row_c, rows = _row_codes(pair * n_start + start_c, len(src_u) * n_eng * n_start, src_c.size)
    n = rows.size
    key_of_row = rows // n_start
    length = num["length_s"]
    sel = _Signals.of(num, sig_c, sig_u, row_c, n)
    src_names = np.asarray([str(x) for x in src_u] + [""], dtype=object)
    eng_names = np.asarray([str(x) for x in eng_u] + [""], dtype=object)
    cols: dict[str, object] = {
        "source": coded_text(src_names, key_of_row // n_eng),
        "engine": coded_text(eng_names, key_of_row % n_eng),
        "start": np.asarray(start_u, dtype=float)[rows % n_start],
        "window_s": np.bincount(row_c, weights=length, minlength=n)
        / np.bincount(row_c, minlength=n),
    }
    for col, signal, field, how in _SIMPLE:
        cols[col] = sel.agg(signal, field, how)
    _ratio_columns(cols, sel)
    add_derived(cols)  # type: ignore[arg-type]
    frame = pd.DataFrame(cols)
    mode, group = modes_and_groups(
        src_names, eng_names, key_of_row, n_eng, engines_meta or {},
        [str(m) for m in mod_u], pair_u, pair_model, frame["start"].to_numpy(),
    )  # fmt: skip
    frame["offload_mode"], frame["group"] = coded_text(*mode), coded_text(*group)
    frame = frame.sort_values(["source", "engine", "start"], kind="stable", ignore_index=True)
    return frame[list(COLUMNS)]


def coded_text(names: npt.NDArray[np.object_], codes: npt.NDArray[np.int64]) -> pd.Categorical:
    """``names[codes]`` as a categorical of the names it holds, sorted, as the frame's text
    columns (source, engine, offload_mode, group) are: the fits' hash passes over them
    (``pd.factorize``, groupby) then read integer codes, not strings, and sorting by them
    sorts by name."""
    used = np.flatnonzero(np.bincount(codes, minlength=len(names)))  # the names it holds
    cats, of_used = np.unique(names[used], return_inverse=True)
    code_of = np.full(len(names), -1, dtype=np.int64)
    code_of[used] = of_used.reshape(-1)
    out: pd.Categorical = pd.Categorical.from_codes(code_of[codes], categories=pd.Index(cats))
    return out


def _engine_keys(
    src_c: npt.NDArray[np.int64], eng_c: npt.NDArray[np.int64], n_eng: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Engine key per window and the distinct keys (before any remapping).

    A series without an engine label joins its source's only engine.
    """
    pair = src_c * n_eng + np.where(eng_c < 0, n_eng - 1, eng_c)
    pair_u = np.unique(pair)
    engines_of: dict[int, list[int]] = {}
    for p in pair_u.tolist():
        if p % n_eng != n_eng - 1:
            engines_of.setdefault(p // n_eng, []).append(p % n_eng)
    remap = {
        p: (p // n_eng) * n_eng + engines_of[p // n_eng][0]
        for p in pair_u.tolist()
        if p % n_eng == n_eng - 1 and len(engines_of.get(p // n_eng, [])) == 1
    }
    if remap:
        lut = np.array(list(remap.keys())), np.array(list(remap.values()))
        for a, b in zip(*lut, strict=True):
            pair[pair == a] = b
    return pair, pair_u


def _row_codes(
    keys: npt.NDArray[np.int64], size: int, n_windows: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(row code per window, key per row) of the (engine, start) keys in ``[0, size)``."""
    if size <= 4 * n_windows + 1_000_000:
        return _dense(keys, size)
    # sparse keys: hash instead of a dense table
    rc, ru = pd.factorize(keys)
    return rc.astype(np.int64), np.asarray(ru, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class _Signals:
    """The windows of each signal as one slice of a (radix-)sorted order: per-signal work
    then scales with that signal's windows, not with all of them."""

    num: dict[str, npt.NDArray[np.float64]]
    row_c: npt.NDArray[np.int64]
    n: int
    sig_index: dict[str, int]
    order: npt.NDArray[np.int64]
    bounds: npt.NDArray[np.int64]

    @classmethod
    def of(
        cls,
        num: dict[str, npt.NDArray[np.float64]],
        sig_c: npt.NDArray[np.int64],
        sig_u: list[object],
        row_c: npt.NDArray[np.int64],
        n: int,
    ) -> _Signals:
        sig_index = {str(s): i for i, s in enumerate(sig_u)}
        order = np.argsort(
            sig_c.astype(np.int16 if len(sig_u) < 32000 else np.int64), kind="stable"
        )
        bounds = np.searchsorted(sig_c[order], np.arange(len(sig_u) + 1))
        return cls(num, row_c, n, sig_index, order, bounds)

    def pick(
        self, signal: str, field: str
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """(row code, value) of the signal's windows with a value in ``field``."""
        num = self.num
        code = self.sig_index.get(signal)
        if code is None or (field not in num and field != "rate"):
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        idx = self.order[self.bounds[code] : self.bounds[code + 1]]
        if field == "rate":  # a counter without a rate: delta / length
            rate = num["rate"][idx] if "rate" in num else np.full(idx.size, np.nan)
            delta = num["delta"][idx] if "delta" in num else np.full(idx.size, np.nan)
            with np.errstate(invalid="ignore", divide="ignore"):
                v = np.where(np.isnan(rate), delta / num["length_s"][idx], rate)
        else:
            v = num[field][idx]
        keep = ~np.isnan(v)
        return self.row_c[idx][keep], v[keep]

    def agg(self, signal: str, field: str, how: str) -> npt.NDArray[np.float64]:
        """Per row: the ``how`` ("sum", "mean", "max") of the signal's ``field``; NaN if none."""
        n = self.n
        idx, v = self.pick(signal, field)
        cnt = np.bincount(idx, minlength=n)
        if how == "max":
            res = np.full(n, -np.inf)
            np.maximum.at(res, idx, v)
        else:
            res = np.bincount(idx, weights=v, minlength=n)
            if how == "mean":
                res = res / np.maximum(cnt, 1)
        return np.where(cnt > 0, res, np.nan)

    def wmean(self, signal: str) -> npt.NDArray[np.float64]:
        """Mean of a ratio's series weighted by their denominators (a missing one counts 1)."""
        num, n = self.num, self.n
        code = self.sig_index.get(signal)
        if code is None or "mean" not in num:
            return np.full(n, np.nan)
        idx = self.order[self.bounds[code] : self.bounds[code + 1]]
        v = num["mean"][idx]
        wt = num["delta"][idx] if "delta" in num else np.ones(idx.size)
        keep = ~np.isnan(v)
        wt = np.where(np.isnan(wt), 1.0, wt)[keep]
        top = np.bincount(self.row_c[idx][keep], weights=v[keep] * wt, minlength=n)
        bottom = np.bincount(self.row_c[idx][keep], weights=wt, minlength=n)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(bottom > 0, top / bottom, np.nan)


def _ratio_columns(cols: dict[str, object], sel: _Signals) -> None:
    """The hit-ratio columns (and their weights): the derived ratio weighted by its
    denominator where present, else the counters' ratio."""
    for col, ratio, numer, denom in _RATIOS:
        w = sel.agg(ratio, "delta", "sum")
        r = sel.wmean(ratio)
        d_num, d_den = sel.agg(numer, "delta", "sum"), sel.agg(denom, "delta", "sum")
        with np.errstate(invalid="ignore", divide="ignore"):
            fallback = np.where(d_den > 0, d_num / d_den, np.nan)
        cols[col] = np.where(np.isnan(r), fallback, r)
        if col in _RATIO_WEIGHT:
            cols[_RATIO_WEIGHT[col]] = np.where(np.isnan(w), d_den, w)


def add_derived(cols: dict[str, npt.NDArray[np.float64]]) -> None:
    """The columns computed from others: token rate, mean TTFT, prompt length, latency."""
    cols["tokens_per_s"] = cols["prompt_tokens_per_s"] + cols["output_tokens_per_s"]
    with np.errstate(invalid="ignore", divide="ignore"):
        for out, total, count in (("ttft_mean_s", "_ttft_sum", "ttft_count"),
                                  ("prompt_tokens_mean", "_prompt_sum", "_prompt_count"),
                                  ("e2e_mean_s", "_e2e_sum", "_e2e_count")):  # fmt: skip
            c = cols[count]
            cols[out] = np.where(c > 0, cols[total] / c, np.nan)


def _dtype(column: str) -> str:
    return "object" if column in _TEXT_COLUMNS else "float64"
