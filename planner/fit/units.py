"""Units of evidence and traffic mix: what the offload estimands compare.

A *unit* is what can be assigned a mode independently of the others: an engine, or the
LMCache pool several engines share. Windows of one unit are never independent evidence;
effects and capacity cluster on units. TRAFFIC lists the traffic-mix covariates offload
does not change (routers send different loads and prompt lengths to different engines).

Method: planner/fit/METHODS.md#units
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from planner.frames.groups import text_values

if TYPE_CHECKING:
    import numpy.typing as npt

    Array = npt.NDArray[np.float64]
    IntArray = npt.NDArray[np.int64]

# Standardised mean difference above which arms are called unbalanced (Austin 2009,
# Statistics in Medicine 28(25): 0.1 is "negligible"; 0.25 is the usual limit past which
# regression adjustment is not trusted to remove the difference, Stuart 2010, Stat. Sci. 25(1)).
SMD_WARN = 0.25
UNKNOWN_POOL = "lmcache pool (unknown: engines not mapped to pools)"
# Traffic covariates (name -> what it is); computed per window by traffic().
TRAFFIC = {
    "request_rate": "requests per second",
    "prompt_tokens_per_request": "prompt tokens per request",
    "output_tokens_per_request": "output tokens per request",
}


def engine_keys(frame: pd.DataFrame) -> npt.NDArray[np.object_]:
    """``source/engine`` per row (``source`` when the engine label is empty), the engine
    key planner.frames.groups.GroupSlice.engines and engine_frame's metadata use."""
    codes, names = engine_codes(frame, short=True)
    out: npt.NDArray[np.object_] = np.asarray(names, dtype=object)[codes]
    return out


def engine_rows(frame: pd.DataFrame) -> dict[str, IntArray]:
    """The row positions (ascending) of each :func:`engine_keys` key, by key: one stable
    sort instead of a ``keys == key`` scan of every row per key."""
    codes, names = engine_codes(frame, short=True)
    order = np.argsort(codes, kind="stable")
    ends = np.cumsum(np.bincount(codes, minlength=len(names))).tolist()
    return {name: order[a:b] for name, a, b in zip(names, [0, *ends[:-1]], ends, strict=True)}


# id(frame) -> (the frame, weakly; its key columns' arrays; codes and keys by ``short``)
_CODES: dict[int, tuple[Any, tuple[object, ...], dict[bool, tuple[IntArray, list[str]]]]] = {}


def _columns_of(frame: pd.DataFrame) -> tuple[object, ...]:
    """Where ``source`` and ``engine`` hold their values (None when absent): the array
    they view (a categorical's codes; a fresh one for a column with nothing to share: then
    no cached codes are reused), the address, shape and strides."""
    out: list[object] = []
    for name in ("source", "engine"):
        if name not in frame.columns:
            out.append(None)
            continue
        column = frame[name]
        categorical = isinstance(column.dtype, pd.CategoricalDtype)
        view = root = column.array.codes if categorical else np.asarray(column)
        while isinstance(root.base, np.ndarray):
            root = root.base
        # a categorical's categories (alive while the frame is) name what its codes mean
        names = id(column.array.categories) if categorical else None
        out.append((root, view.__array_interface__["data"][0], view.shape, view.strides, names))
    return tuple(out)


def engine_codes(frame: pd.DataFrame, *, short: bool = False) -> tuple[IntArray, list[str]]:
    """(code per row, the keys by code) of each row's ``source/engine`` key, equal keys one
    code, with no string made per row. ``short``: :func:`engine_keys`' keys (the source
    alone when the engine is empty or missing); else always ``source/engine``.

    Computed once per frame and kept while the frame lives and its ``source`` / ``engine``
    columns hold the same arrays (several fits and verdicts read the same frame's keys)."""
    cols = _columns_of(frame)
    entry = _CODES.get(id(frame))
    if (
        entry is None
        or entry[0]() is not frame
        or any(not _same(a, b) for a, b in zip(entry[1], cols, strict=True))
    ):
        entry = (weakref.ref(frame, _forget(id(frame))), cols, {})
        _CODES[id(frame)] = entry
    if short not in entry[2]:
        entry[2][short] = _engine_codes(frame, short)
    codes, names = entry[2][short]
    return codes.copy(), list(names)


# id(units) -> (the units array, weakly; its codes and values)
_UNIT_CODES: dict[int, tuple[Any, tuple[IntArray, list[object]]]] = {}


def unit_codes(units: npt.NDArray[np.object_]) -> tuple[IntArray, list[object]]:
    """``pd.factorize(units, use_na_sentinel=False)`` of a units array, hashed once while
    the array lives: a plan's verdicts read one :func:`unit_keys` array (never written
    after) for every mode, in today's effect and in capacity."""
    entry = _UNIT_CODES.get(id(units))
    if entry is None or entry[0]() is not units:
        found, uniques = pd.factorize(units, use_na_sentinel=False)
        ref = weakref.ref(units, _forget(id(units), _UNIT_CODES))
        entry = (ref, (np.asarray(found, dtype=np.int64), list(uniques)))
        _UNIT_CODES[id(units)] = entry
    codes, values = entry[1]
    return codes.copy(), list(values)


def _same(a: Any, b: Any) -> bool:
    """The same column array: one root array (identity), at the same place and shape."""
    if a is None or b is None:
        return a is b
    return bool(a[0] is b[0] and a[1:] == b[1:])


def _forget(key: int, cache: dict[int, Any] = _CODES) -> Any:
    """The weakref callback dropping a dead frame's (or array's) cached codes."""

    def drop(_: object) -> None:
        cache.pop(key, None)

    return drop


def _engine_codes(frame: pd.DataFrame, short: bool) -> tuple[IntArray, list[str]]:
    s_c, s_u = _value_codes(frame["source"])
    e_c, e_u = np.zeros(len(frame), dtype=np.int64), [None]
    if "engine" in frame.columns:
        e_c, e_u = _value_codes(frame["engine"])
    width = max(len(e_u), 1)
    p_c, p_u = pd.factorize(s_c.astype(np.int64) * width + e_c)
    names = []
    for p in np.asarray(p_u).tolist():
        src, eng = _text(s_u[p // width]), e_u[p % width]
        if short:
            eng = "" if eng is None or (isinstance(eng, float) and math.isnan(eng)) else str(eng)
            names.append(f"{src}/{eng}" if eng else src)
        else:
            names.append(f"{src}/{_text(eng)}")
    n_c, n_u = pd.factorize(np.asarray(names, dtype=object))
    codes: IntArray = np.asarray(n_c, dtype=np.int64)[p_c]
    return codes, [str(x) for x in n_u]


def _value_codes(column: pd.Series) -> tuple[IntArray, list[Any]]:
    """A code per row and the values by code: a categorical's own codes (no hashing of
    strings) when no row is missing, else ``pd.factorize`` keeping missing as a value."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        codes = column.cat.codes.to_numpy().astype(np.int64)
        if not (codes < 0).any():
            return codes, list(column.cat.categories)
    found, values = pd.factorize(column, use_na_sentinel=False)
    return np.asarray(found, dtype=np.int64), list(values)


def _text(value: object) -> str:
    """A frame value as ``astype(str)`` writes it (a missing one: "nan")."""
    missing = value is None or (isinstance(value, float) and math.isnan(value))
    return "nan" if missing else str(value)


def unit_keys(
    frame: pd.DataFrame, pools: Mapping[str, str] | None = None
) -> npt.NDArray[np.object_]:
    """The unit of each row: the LMCache pool of rows in ``lmcache`` mode, else the engine.

    ``pools`` maps an engine (source, or ``source/engine``) to its pool; an LMCache engine
    missing from it joins one pool with every other unmapped LMCache engine (UNKNOWN_POOL):
    without the mapping, sharing cannot be ruled out, and counting them apart would treat
    dependent engines as independent."""
    codes, names = engine_codes(frame, short=True)
    out: npt.NDArray[np.object_] = np.asarray(names, dtype=object)[codes]
    lmcache = text_values(frame["offload_mode"]) == "lmcache"
    if not lmcache.any():
        return out
    pools = pools or {}
    # a row's pool depends on its engine key and source alone: one lookup per pair
    s_codes, s_values = _value_codes(frame["source"])
    width = max(len(s_values), 1)
    pairs, at = np.unique(codes[lmcache] * width + s_codes[lmcache], return_inverse=True)
    units = []
    for p in pairs.tolist():
        key, source = names[p // width], _text(s_values[p % width])
        pool = pools.get(str(key)) or pools.get(source)
        units.append(f"pool:{pool}" if pool else UNKNOWN_POOL)
    out[lmcache] = np.asarray(units, dtype=object)[at.ravel()]
    return np.asarray(out, dtype=object)


def traffic(frame: pd.DataFrame) -> pd.DataFrame:
    """The TRAFFIC covariates per row (NaN where a window has no finished request)."""
    req = frame["requests"].to_numpy(dtype=float)
    win = frame["window_s"].to_numpy(dtype=float)
    out_tok = frame["output_tokens_per_s"].to_numpy(dtype=float) * win
    with np.errstate(invalid="ignore", divide="ignore"):
        return pd.DataFrame(
            {
                "request_rate": np.where(win > 0, req / win, np.nan),
                "prompt_tokens_per_request": frame["prompt_tokens_mean"].to_numpy(dtype=float),
                "output_tokens_per_request": np.where(req > 0, out_tok / req, np.nan),
            },
            index=frame.index,
        )


@dataclass(frozen=True, slots=True)
class Balance:
    """Standardised mean difference of one traffic covariate between the arms."""

    covariate: str
    treated_mean: float
    control_mean: float
    smd: float  # (treated − control) / √((var_t + var_c) / 2), request-weighted windows

    @property
    def unbalanced(self) -> bool:
        return abs(self.smd) > SMD_WARN


def balance(values: pd.DataFrame, treated: Array, weights: Array) -> tuple[Balance, ...]:
    """SMD of every column of ``values`` between treated (``treated`` true) and control rows,
    weighted by ``weights``; a column constant in both arms has SMD 0."""
    out = []
    t = treated.astype(bool)
    for col in values.columns:
        v = values[col].to_numpy(dtype=float)
        ok = np.isfinite(v) & np.isfinite(weights) & (weights > 0)
        a, b = ok & t, ok & ~t
        if not a.any() or not b.any():
            continue
        ma, va = _wmean_var(v[a], weights[a])
        mb, vb = _wmean_var(v[b], weights[b])
        pooled = np.sqrt((va + vb) / 2.0)
        if pooled > 0:
            smd = (ma - mb) / pooled
        else:  # constant in each arm: no overlap at all when the constants differ
            smd = 0.0 if ma == mb else math.copysign(math.inf, ma - mb)
        out.append(Balance(str(col), ma, mb, float(smd)))
    return tuple(out)


def _wmean_var(v: Array, w: Array) -> tuple[float, float]:
    m = float(np.average(v, weights=w))
    return m, float(np.average((v - m) ** 2, weights=w))


def balance_warnings(rows: tuple[Balance, ...], mode: str) -> list[str]:
    """One sentence per unbalanced covariate."""
    return [
        f"traffic differs between the arms: {TRAFFIC.get(b.covariate, b.covariate)} "
        f"{b.treated_mean:.3g} on {mode} against {b.control_mean:.3g} without offload "
        f"(standardised difference {b.smd:+.2f}, above {SMD_WARN}): the router sends them "
        "different work, and the adjustment for it is only as good as its linear form"
        for b in rows
        if b.unbalanced
    ]
