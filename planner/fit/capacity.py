"""Capacity at the SLO: the load one unit sustains within the latency target, per offload mode.

Per unit (an engine, or an engine's share of a pool): isotonic regression of SLO misses on
window load, the capacity where the miss probability first exceeds one half (a bound,
``status`` "above"/"below", when the unit never came near saturation). Between modes:
Welch's t interval on log capacity over units, a pool counting once.

Method: planner/fit/METHODS.md#capacity
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from core.errors import ConfigError
from planner.domain.slo import Slo
from planner.fit.common import Interval, check_level, exp_or_inf, nan_interval
from planner.fit.units import engine_codes, unit_codes
from planner.frames.groups import text_values

if TYPE_CHECKING:
    import numpy.typing as npt

    Array = npt.NDArray[np.float64]
    IntArray = npt.NDArray[np.int64]

MIN_BIN = 8  # windows a bound rests on ("above": the MIN_BIN-th highest load)
MIN_SIDE = 5  # windows missing (and meeting) the SLO before a unit counts as near saturation
MIN_UNITS = 2
NO_OFFLOAD = "none"
# A queue grows when its mean rises, window over window, by more than this share of the
# window's finished requests: arrivals then exceed service by that much.
QUEUE_GROWTH_SHARE = 0.05


@dataclass(frozen=True, slots=True)
class UnitCapacity:
    """One unit's capacity: ``value`` tokens/s per engine, or a bound (``status``)."""

    unit: str
    mode: str
    engines: int
    value: float  # capacity, or the bound when status is "above" / "below"
    status: str  # "measured" | "above" (>= value) | "below" (<= value)
    windows: int
    missed: int  # windows that missed the SLO


@dataclass(frozen=True, slots=True)
class CapacityComparison:
    """Capacity of ``mode`` relative to no offload, with what it rests on."""

    mode: str
    slo: Slo
    ratio: float  # capacity(mode) / capacity(none)
    interval: Interval
    bound: str  # "" (two-sided) | "lower" (the ratio is at least the interval's lo)
    claim_interval: Interval  # at claim_level: what a measured vote reads
    df: float
    none_capacity: float  # geometric mean tokens/s per engine
    mode_capacity: float
    units: tuple[UnitCapacity, ...]
    units_treated: int
    units_control: int
    method: str
    assumptions: tuple[str, ...]
    can_tell: bool
    why: str
    settle: str  # what would settle it when it cannot tell


def violations(frame: pd.DataFrame, slo: Slo) -> npt.NDArray[np.bool_]:
    """Per row: the window missed the SLO (TTFT quantile over target, or a growing queue
    against the same engine's previous window). Rows without a TTFT quantile count as met
    only when their queue is not growing."""
    ttft = frame[slo.column].to_numpy(dtype=float)
    wait = frame["waiting"].to_numpy(dtype=float)
    req = frame["requests"].to_numpy(dtype=float)
    key, _ = engine_codes(frame)  # rows of one engine together (their order is immaterial)
    start = frame["start"].to_numpy(dtype=float)
    order = np.lexsort((start, key))
    grow = np.zeros(len(frame), dtype=bool)
    k, w, r = key[order], wait[order], req[order]
    same = np.r_[False, k[1:] == k[:-1]]
    prev = np.r_[np.nan, w[:-1]]
    with np.errstate(invalid="ignore"):
        rise = np.where(same, w - prev, np.nan)
        g = rise > np.maximum(QUEUE_GROWTH_SHARE * np.nan_to_num(r), 1.0)
    grow[order] = g
    with np.errstate(invalid="ignore"):
        return (ttft > slo.ttft_s) | grow


def unit_capacity(load: Array, missed: npt.NDArray[np.bool_]) -> tuple[float, str]:
    """(capacity, status) of one unit from its windows' load and SLO misses (module
    docstring)."""
    from scipy.optimize import isotonic_regression  # noqa: PLC0415 - start-up: scipy.optimize (~0.25 s) loads when this runs, not on `import planner.plan`

    ok = np.isfinite(load) & (load > 0)
    x, m = load[ok], missed[ok].astype(float)
    if x.size < 2 * MIN_BIN:
        return math.nan, "too few windows"
    order = np.argsort(x, kind="stable")
    x, m = x[order], m[order]
    n_miss = int(m.sum())
    if n_miss < MIN_SIDE:
        return float(x[-MIN_BIN]), "above"
    if x.size - n_miss < MIN_SIDE:
        return float(x[MIN_BIN - 1]), "below"
    fitted = isotonic_regression(m, increasing=True).x
    above = np.flatnonzero(fitted > 0.5)
    if above.size == 0:
        return float(x[-MIN_BIN]), "above"
    i = int(above[0])
    if i == 0:
        return float(x[MIN_BIN - 1]), "below"
    return float((x[i - 1] + x[i]) / 2), "measured"


def _texts(units: Sequence[object] | npt.NDArray[np.object_]) -> tuple[IntArray, list[str]]:
    """``pd.factorize`` of the units' texts (``str``): code per row, texts by code in order
    of first appearance; with no string made per row when every unit is a ``str``."""
    values = np.asarray(units, dtype=object)
    codes, uniques = unit_codes(values)  # None as a value: a unit not all str, read as text
    if all(isinstance(u, str) for u in uniques):
        return codes, [str(u) for u in uniques]
    found, texts = pd.factorize(np.asarray([str(u) for u in values], dtype=object))
    return np.asarray(found, dtype=np.int64), [str(u) for u in texts]


def fit_capacity(
    frame: pd.DataFrame,
    units: Sequence[object] | npt.NDArray[np.object_],
    *,
    mode: str,
    slo: Slo | None = None,
    level: float = 0.90,
    claim_level: float = 0.95,
) -> CapacityComparison:
    """Capacity of ``mode`` against ``none`` at the SLO (METHODS.md#capacity)."""
    slo = slo or Slo()
    check_level(level)
    check_level(claim_level)
    if mode == NO_OFFLOAD:
        raise ConfigError("capacity is compared between an offload mode and 'none'")
    if len(units) != len(frame):
        raise ConfigError(f"units has {len(units)} entries for {len(frame)} frame rows")
    unit_c, unit_names = _texts(units)
    modes = text_values(frame["offload_mode"])
    load = frame["tokens_per_s"].to_numpy(dtype=float)
    missed = violations(frame, slo)
    key, key_names = engine_codes(frame)  # codes, no "source/engine" string per row
    caps: list[UnitCapacity] = []
    for arm in (mode, NO_OFFLOAD):
        cells = _cells(np.flatnonzero(modes == arm), unit_c, key, len(key_names))
        for u in sorted({unit_names[c] for c, _ in cells}):
            unit = unit_names.index(u)
            engines = sorted((key_names[k], k) for c, k in cells if c == unit)
            # a pool's load is per engine: each engine's windows, the pool's status combined
            values, statuses, n, n_miss = [], [], 0, 0
            for _, code in engines:
                r = cells[unit, code]
                v, s = unit_capacity(load[r], missed[r])
                values.append(v)
                statuses.append(s)
                n, n_miss = n + r.size, n_miss + int(missed[r].sum())
            caps.append(_combine(u, arm, values, statuses, n=n, missed=n_miss))
    method = (
        f"per unit: load (tokens/s per engine) where the share of windows missing the SLO "
        f"({slo.text()}) crosses 1/2, isotonic in load; between modes: Welch t interval on "
        f"the units' log capacity (Satterthwaite df), {level:.0%}"
    )
    assumptions = (
        "capacity is read from the load each engine carried: a unit that never came near "
        "saturation gives only a lower bound",
        "units are independent (engines sharing an LMCache pool are one unit); the traffic "
        "mix is the one each unit served",
    )
    return _compare(mode, slo, caps, level, claim_level, method, assumptions)


def _cells(
    rows: IntArray, unit_c: IntArray, key: IntArray, keys: int
) -> dict[tuple[int, int], IntArray]:
    """The rows (in row order) of each (unit code, engine code) among ``rows``: one stable
    sort, instead of a pass over every row per unit and per engine."""
    cell = unit_c[rows] * keys + key[rows]
    order = np.argsort(cell, kind="stable")
    cuts = np.flatnonzero(np.diff(cell[order])) + 1
    return {
        (int(part[0]) // keys, int(part[0]) % keys): rows[idx]
        for part, idx in zip(np.split(cell[order], cuts), np.split(order, cuts), strict=True)
        if part.size
    }


def _combine(
    unit: str, mode: str, values: list[float], statuses: list[str], *, n: int, missed: int
) -> UnitCapacity:
    """One unit from its engines: the geometric mean of their capacities, "above" if any
    engine's is only a lower bound (the mean is then a lower bound too)."""
    good = [(v, s) for v, s in zip(values, statuses, strict=True) if math.isfinite(v)]
    if not good:
        return UnitCapacity(unit, mode, len(values), math.nan, "too few windows", n, missed)
    kinds = {s for _, s in good}
    status = "above" if "above" in kinds else ("below" if kinds == {"below"} else "measured")
    if "above" in kinds and "below" in kinds:
        status = "mixed"
    value = math.exp(sum(math.log(v) for v, _ in good) / len(good))
    return UnitCapacity(unit, mode, len(values), value, status, n, missed)


def _compare(  # noqa: PLR0917 - fit_capacity's parts
    mode: str,
    slo: Slo,
    caps: list[UnitCapacity],
    level: float,
    claim_level: float,
    method: str,
    assumptions: tuple[str, ...],
) -> CapacityComparison:
    treated = [c for c in caps if c.mode == mode and c.status in ("measured", "above")]
    control = [c for c in caps if c.mode == NO_OFFLOAD and c.status in ("measured", "above")]
    n_t = sum(c.mode == mode for c in caps)
    n_c = sum(c.mode == NO_OFFLOAD for c in caps)
    nan_iv = nan_interval(level)

    def out(ratio: float, iv: Interval, claim: Interval, *, bound: str = "", df: float = math.nan,
            why: str = "", settle: str = "") -> CapacityComparison:  # fmt: skip
        return CapacityComparison(
            mode, slo, ratio, iv, bound, claim, df,
            _gmean([c.value for c in control]), _gmean([c.value for c in treated]),
            tuple(caps), n_t, n_c, method, assumptions, not why, why, settle,
        )  # fmt: skip

    settle = (
        f"windows that miss the SLO ({slo.text()}) on at least {MIN_UNITS} units of each "
        "arm: a busier period, or a load test that weights the router towards "
        f"{MIN_UNITS} engines of each mode until they miss it"
    )
    if len(treated) < MIN_UNITS or len(control) < MIN_UNITS:
        more = (
            f"at least {MIN_UNITS} independent units per arm: the mode on more engines (or "
            "LMCache pools), chosen at random, or the canary run as a switchback (the plan's "
            "experiment)"
        )
        return out(math.nan, nan_iv, nan_interval(claim_level),
                   why=f"{len(treated)} unit(s) on {mode} and {len(control)} without offload "
                   f"have enough windows: capacity needs at least {MIN_UNITS} independent "
                   "units per arm", settle=more)  # fmt: skip
    if any(c.status == "above" for c in control):
        return out(math.nan, nan_iv, nan_interval(claim_level),
                   why="no window past the SLO on the engines without offload (they never "
                   "missed it), so their capacity is unknown", settle=settle)  # fmt: skip
    lt = np.log([c.value for c in treated])
    lc = np.log([c.value for c in control])
    diff, df, (lo, hi) = welch(lt, lc, level)
    _, _, (clo, chi) = welch(lt, lc, claim_level)
    bound = "lower" if any(c.status == "above" for c in treated) else ""
    ratio = exp_or_inf(diff)
    if bound:
        return out(
            ratio,
            Interval(exp_or_inf(lo), math.inf, level),
            Interval(exp_or_inf(clo), math.inf, claim_level),
            bound=bound,
            df=df,
        )
    return out(ratio, Interval(exp_or_inf(lo), exp_or_inf(hi), level),
               Interval(exp_or_inf(clo), exp_or_inf(chi), claim_level), df=df)  # fmt: skip


def welch(a: Array, b: Array, level: float) -> tuple[float, float, tuple[float, float]]:
    """(mean(a) − mean(b), Satterthwaite df, interval at ``level``) — statsmodels'
    CompareMeans with unequal variances; both arms need >= 2 values."""
    from statsmodels.stats.weightstats import CompareMeans, DescrStatsW  # noqa: PLC0415 - start-up: statsmodels (~0.7 s) loads when this fit runs, not on `import planner.plan`

    cm = CompareMeans(DescrStatsW(a), DescrStatsW(b))
    lo, hi = cm.tconfint_diff(alpha=1 - level, usevar="unequal")
    var_a, var_b = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    den = var_a**2 / (a.size - 1) + var_b**2 / (b.size - 1)
    df = (var_a + var_b) ** 2 / den if den > 0 else math.inf
    return float(a.mean() - b.mean()), float(df), (float(lo), float(hi))


def _gmean(values: list[float]) -> float:
    good = [v for v in values if math.isfinite(v) and v > 0]
    return math.exp(sum(map(math.log, good)) / len(good)) if good else math.nan
