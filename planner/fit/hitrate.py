"""LMCache L1 hit rate vs cache size: what hit rate would another size give, and what size
reaches a target?

A binomial GLM (logit) of hit tokens on a natural cubic spline in ln(L1 bytes in use),
statsmodels IRLS; covariance clustered by LMCache pool (CR1, t(G − 1)) from spline_df + 1
pools, else HAC within each pool. Sizes are never looked for outside those seen.

Method: planner/fit/METHODS.md#hitrate
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import patsy  # type: ignore[import-untyped]

from core.errors import ConfigError
from planner.fit.common import (
    MIN_CLUSTERS,
    Estimate,
    FitResult,
    Interval,
    check_level,
    engine_groups,
    exp_or_inf,
    fmt,
    nan_interval,
    recorded_warnings,
    require_history,
    t_quantile,
)
from planner.fit.glm_irls import binomial_cr1

if TYPE_CHECKING:
    import numpy.typing as npt

    Array = npt.NDArray[np.float64]

WHAT = "LMCache L1 hit-rate curve"
# grid of ln C on which the roots are bracketed before refining
_ROOT_GRID = 512


@dataclass(frozen=True, slots=True)
class HitPrediction:
    """Predicted hit ratio at one L1 size; ``extrapolated`` outside the sizes observed."""

    size_bytes: float
    hit_ratio: float
    interval: Interval
    extrapolated: bool


@dataclass(frozen=True, slots=True)
class HitRateFit(FitResult):
    """``estimate`` = L1 bytes at which the curve reaches ``target_fraction`` of its hit
    ratio at the largest size seen. ``curve`` / ``curve_interval`` evaluate the fit."""

    hit_at_largest: Estimate  # fitted hit ratio at size_range[1]
    target_fraction: float
    size_for_target_hit: Estimate | None  # for an absolute target hit ratio, when asked
    predictions: tuple[HitPrediction, ...]
    size_range: tuple[float, float]
    evicting_share: float  # share of windows with L1 evictions (usage = capacity)
    cov_type: str  # "cluster" (CR1 by LMCache pool) | "HAC" (within each pool) | "none"
    clusters: int  # LMCache pools (sources) in the data
    spline_df: int  # basis functions of the spline in ln C (0 when not fitted)
    knots_ln_bytes: tuple[float, ...]  # the spline's knots (ln bytes), boundary ones included
    coef: tuple[float, ...]
    coef_cov: tuple[tuple[float, ...], ...]
    t_crit: float  # the t quantile of the pointwise intervals

    def curve(self, sizes_bytes: Sequence[float] | Array) -> Array:
        """Fitted hit ratio at L1 sizes (bytes); linear in ln C on the logit scale outside
        ``size_range`` (an extrapolation). NaN everywhere when the fit has no curve."""
        sizes = np.asarray(sizes_bytes, dtype=float)
        if not self.coef:
            return np.full(sizes.shape, math.nan)
        out: Array = _expit(_basis(np.log(sizes), self.knots_ln_bytes) @ np.asarray(self.coef))
        return out

    def curve_interval(self, sizes_bytes: Sequence[float] | Array) -> tuple[Array, Array]:
        """Pointwise (lo, hi) of the hit ratio at ``level`` (Wald on the logit scale)."""
        sizes = np.asarray(sizes_bytes, dtype=float)
        if not self.coef:
            nan = np.full(sizes.shape, math.nan)
            return nan, nan.copy()
        b = _basis(np.log(sizes), self.knots_ln_bytes)
        eta = b @ np.asarray(self.coef)
        se = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", b, np.asarray(self.coef_cov), b), 0))
        return _expit(eta - self.t_crit * se), _expit(eta + self.t_crit * se)


@dataclass(frozen=True, slots=True)
class _Windows:
    """The usable windows: L1 sizes, hit ratios, looked-up tokens, evicting flags, pools."""

    c: Array
    h: Array
    trials: Array
    evicting: npt.NDArray[np.bool_]
    groups: npt.NDArray[np.int64]
    pools: int  # LMCache pools (sources) in the data

    @property
    def n(self) -> int:
        return len(self.c)


def fit_hitrate(  # noqa: PLR0913 - keyword-only fit options with defaults
    frame: pd.DataFrame,
    *,
    size: str = "l1_usage_bytes",
    hit: str = "lmcache_hit_ratio",
    weight: str = "lmcache_requested_tokens",
    target_fraction: float = 0.9,
    target_hit: float | None = None,
    sizes: Sequence[float] | None = None,
    level: float = 0.95,
    only_evicting: bool = False,
    min_windows: int = 30,
    spline_df: int = 6,
) -> HitRateFit:
    """Fit the hit-rate curve (METHODS.md#hitrate).

    ``weight``: the looked-up tokens behind each hit ratio (windows without a positive
    count are left out; every window counts 1 when the column is absent). ``sizes``: L1
    sizes (bytes) to predict at (default: quartiles of the observed sizes and 2× / 4× the
    largest, the last two extrapolated). ``spline_df``: spline basis functions (fewer only
    when the sizes seen have fewer distinct quantiles). Raises InsufficientHistory
    below ``min_windows`` windows.
    """
    _check_options(level, target_fraction, target_hit, spline_df)
    win = _windows(frame, size, hit, weight, only_evicting=only_evicting, min_windows=min_windows)
    c, n = win.c, win.n
    lc = np.log(c)
    knots = _knots(lc, spline_df)
    k = len(knots) if len(knots) >= 3 else 2
    cov_type = "cluster" if win.pools >= k + 1 else "HAC"
    c_lo, c_hi = float(c.min()), float(c.max())
    out = _unanswered(win, k, cov_type, target_fraction)
    nan_est = Estimate(math.nan, nan_interval(level))
    empty: dict[str, Any] = {
        "estimate": math.nan, "interval": nan_interval(level), "hit_at_largest": nan_est,
        "predictions": (), "spline_df": 0, "knots_ln_bytes": (), "coef": (), "coef_cov": (),
        "t_crit": math.nan,
    }  # fmt: skip
    if float(np.std(c) / max(float(np.mean(c)), 1e-300)) < 0.05:
        return HitRateFit(
            **out, **empty, warnings=(), can_tell=False,
            why="L1 usage barely varies (CV < 0.05): no curve can be fitted",
        )  # fmt: skip
    with recorded_warnings() as caught:
        coef, cov = _glm(win.h, win.trials, _basis(lc, knots), win.groups, cov_type)
    tq = t_quantile(level, win.pools - 1 if cov_type == "cluster" else n - k)
    fit = HitRateFit(
        **out, estimate=math.nan, interval=nan_interval(level), warnings=(), can_tell=False,
        why="", hit_at_largest=nan_est, predictions=(), spline_df=k,
        knots_ln_bytes=tuple(float(x) for x in knots), coef=tuple(float(x) for x in coef),
        coef_cov=tuple(tuple(float(x) for x in row) for row in cov), t_crit=tq,
    )  # fmt: skip
    top = _hit_at(fit, c_hi, level)
    grid = sorted(set(sizes)) if sizes is not None else [
        *np.quantile(c, [0.25, 0.5, 0.75]).tolist(), 2 * c_hi, 4 * c_hi]  # fmt: skip
    with recorded_warnings() as more:
        preds = _predict(fit, np.asarray(grid, dtype=float), level)
        for_hit = _size_for(fit, target_hit, None, level) if target_hit is not None else None
        size_q = _size_for(fit, target_fraction * top.value, target_fraction, level)
        rise_lo = _rise_lower_bound(fit, c_lo, c_hi)
    caught.extend(more)
    why = _why_not(
        size_q, rise_lo, size_range=(c_lo, c_hi), target_fraction=target_fraction, level=level
    )
    return HitRateFit(
        **(out | {"size_for_target_hit": for_hit}),
        estimate=size_q.value,
        interval=size_q.interval,
        warnings=tuple(caught),
        can_tell=not why,
        why=why,
        hit_at_largest=top,
        predictions=preds,
        spline_df=k,
        knots_ln_bytes=fit.knots_ln_bytes,
        coef=fit.coef,
        coef_cov=fit.coef_cov,
        t_crit=tq,
    )


def _check_options(
    level: float, target_fraction: float, target_hit: float | None, spline_df: int
) -> None:
    """ConfigError for an option fit_hitrate does not accept."""
    check_level(level)
    if not 0.0 < target_fraction < 1.0:
        raise ConfigError(f"target_fraction must be in (0, 1), got {target_fraction}")
    if target_hit is not None and not 0.0 < target_hit < 1.0:
        raise ConfigError(f"target_hit must be in (0, 1), got {target_hit}")
    if spline_df < 2:
        raise ConfigError(f"spline_df must be at least 2, got {spline_df}")


def _windows(
    frame: pd.DataFrame, size: str, hit: str, weight: str, *, only_evicting: bool,
    min_windows: int,
) -> _Windows:  # fmt: skip
    """The usable windows (only the evicting ones when asked) as arrays; raises
    InsufficientHistory below ``min_windows``."""
    data = _usable(frame, size, hit, weight)
    ev = data["l1_evicted_chunks"] if "l1_evicted_chunks" in data.columns else None
    evicting = (ev > 0).to_numpy() if ev is not None else np.zeros(len(data), dtype=bool)
    if only_evicting:
        data, evicting = data[evicting], evicting[evicting]
    require_history(WHAT, len(data), min_windows)
    c = data[size].to_numpy(dtype=float)
    h = data[hit].to_numpy(dtype=float)
    trials = data[weight].to_numpy(dtype=float) if weight in data.columns else np.ones(len(data))
    groups = _pools(data)
    pools = int(np.unique(groups).size)
    return _Windows(c, h, trials, evicting, groups, pools)


def _unanswered(win: _Windows, k: int, cov_type: str, target_fraction: float) -> dict[str, Any]:
    """The fields known before the curve is fitted: what is fitted, how, on which windows,
    and the errors' assumption for ``cov_type`` with a ``k``-df curve."""
    c, h, evicting, pools, n = win.c, win.h, win.evicting, win.pools, win.n
    c_lo, c_hi = float(c.min()), float(c.max())
    errors, independence = _errors_text(pools, n, k, cov_type)
    out: dict[str, Any] = {
        "what": WHAT, "unit": "bytes", "n": n, "cov_type": cov_type, "clusters": pools,
        "method": f"binomial GLM (logit) of hit / looked-up tokens on a natural cubic "
                  f"spline in ln L1 usage ({k} df), weights = looked-up tokens; {errors}; "
                  "Wald on the logit scale",
        "assumptions": (
            "L1 usage stands in for L1 size (equal only while evicting)",
            "cache warm-up can confound size with time",
            "one curve for all pools",
            f"the natural spline with {k} df follows the true curve (its shape error is "
            "not in the intervals)",
            independence,
        ),
        "basis": (
            f"{n} windows from {pools} LMCache pools (sources); L1 usage [{fmt(c_lo)}, "
            f"{fmt(c_hi)}] bytes",
            f"hit ratio [{fmt(h.min())}, {fmt(h.max())}]; {float(evicting.mean()):.0%} of "
            "windows evicting",
        ),
        "target_fraction": target_fraction, "size_range": (c_lo, c_hi),
        "evicting_share": float(evicting.mean()), "size_for_target_hit": None,
    }  # fmt: skip
    return out


def _errors_text(pools: int, n: int, k: int, cov_type: str) -> tuple[str, str]:
    """How the errors are estimated (for the method) and the independence it assumes."""
    if cov_type == "cluster":
        errors = f"CR1 by LMCache pool ({pools} pools), t({pools - 1})"
        few = f"; below {MIN_CLUSTERS} pools CR1 is biased down" if pools < MIN_CLUSTERS else ""
        independence = (
            f"errors clustered by LMCache pool ({pools} sources: independent across pools, "
            f"any correlation within one){few}"
        )
    else:
        errors = (
            f"Newey–West HAC within each pool's window series ({pools} LMCache "
            f"pool{'s' if pools != 1 else ''}, {hac_lags(n)} lags), t(n − {k})"
        )
        independence = (
            f"{pools} LMCache pool{'s' if pools != 1 else ''}: too few for cluster-robust "
            f"errors on a {k}-df curve (needs {k + 1}); the intervals allow correlation between "
            f"a pool's windows up to {hac_lags(n)} windows apart (HAC) and describe these "
            "pools, not pools in general"
        )
    return errors, independence


def _hit_at(fit: HitRateFit, size: float, level: float) -> Estimate:
    """The fitted hit ratio at one L1 size with its pointwise interval."""
    lo_hi = fit.curve_interval([size])
    return Estimate(float(fit.curve([size])[0]), Interval(float(lo_hi[0][0]),
                                                          float(lo_hi[1][0]), level))  # fmt: skip


def _why_not(
    size_q: Estimate, rise_lo: float, *, size_range: tuple[float, float], target_fraction: float,
    level: float,
) -> str:  # fmt: skip
    """Why the size for ``target_fraction`` is not pinned down ("" when it is)."""
    c_lo, c_hi = size_range
    why = ""
    if not rise_lo > 0:
        why = (
            f"the hit ratio does not rise detectably over the L1 usage seen ([{fmt(c_lo)}, "
            f"{fmt(c_hi)}] bytes, past saturation or independent of size): the size for "
            f"{target_fraction:.0%} of it is not pinned down"
        )
    elif math.isnan(size_q.value):
        why = (
            f"the hit ratio at the smallest L1 usage seen ({fmt(c_lo)} bytes) is already "
            f"{target_fraction:.0%} of that at the largest: the size for it lies below the "
            "sizes seen, not pinned down"
        )
    elif not size_q.interval.hi / size_q.interval.lo <= 100:
        why = (
            f"the size for {target_fraction:.0%} of the hit ratio at the largest L1 seen is "
            f"not pinned down ({level:.0%} interval [{fmt(size_q.interval.lo)}, "
            f"{fmt(size_q.interval.hi)}] bytes)"
        )
    return why


def _usable(frame: pd.DataFrame, size: str, hit: str, weight: str) -> pd.DataFrame:
    if not {size, hit} <= set(frame.columns):
        return frame.iloc[0:0]
    used = dict.fromkeys([size, hit, weight, "l1_evicted_chunks", "source", "engine", "start"])
    data = frame[[c for c in used if c in frame.columns]].dropna(subset=[size, hit])
    keep = (data[size] > 0) & (data[hit] >= 0) & (data[hit] <= 1)
    if weight in data.columns:
        keep &= data[weight] > 0  # NaN fails too: a hit ratio without its lookups
    data = data[keep]
    order = [c for c in ("source", "start") if c in data.columns]  # time order per pool (HAC)
    return data.sort_values(order, kind="stable") if order else data


def _pools(data: pd.DataFrame) -> npt.NDArray[np.int64]:
    """LMCache pool per row: the source (an LMCache server's series carry no engine and
    join their source's engine, planner.frames.frames), else the engine."""
    if "source" not in data.columns:
        return engine_groups(data)
    codes, _ = pd.factorize(data["source"])
    return codes.astype(np.int64)


def _knots(lc: Array, k: int) -> Array:
    """k knots at equally spaced quantiles of ln C, fewer when quantiles coincide; fewer
    than 3 means a line (no interior knot)."""
    knots: Array = np.unique(np.quantile(lc, np.linspace(0.0, 1.0, max(k, 2))))
    return knots if knots.size >= 3 else knots[[0, -1]] if knots.size >= 2 else knots


def _basis(lc: Array, knots: Sequence[float] | Array) -> Array:
    """The natural cubic regression spline basis (patsy ``cr``; its columns sum to 1, so no
    intercept) at ln C, or [1, ln C − first knot] for a line (2 knots)."""
    kn = np.asarray(knots, dtype=float)
    lc = np.atleast_1d(lc)
    if kn.size < 3:
        out: Array = np.column_stack([np.ones_like(lc), lc - kn[0]])
        return out
    out = np.asarray(patsy.cr(lc, knots=kn[1:-1], lower_bound=kn[0], upper_bound=kn[-1]))
    return out


def hac_lags(n: int) -> int:
    """Newey–West's rule for the lags of a HAC covariance: floor(4 (n / 100)^(2/9))
    (Newey & West 1994, Rev. Econ. Stud. 61(4))."""
    return max(1, int(4 * (n / 100) ** (2 / 9)))


def _glm(
    h: Array, trials: Array, basis: Array, groups: npt.NDArray[np.int64], cov_type: str
) -> tuple[Array, Array]:
    """Binomial logit GLM of [hits, misses] (statsmodels): coefficients and their robust
    covariance (CR1 by ``groups``, or HAC within each group's series).

    CR1 is ``GLM(...).fit(cov_type="cluster")`` without the model: statsmodels' IRLS
    (planner/fit/glm_irls.py) and its ``cov_cluster`` on the scores and inverse Hessian,
    the same numbers (tests/planner/test_glm_irls.py)."""
    from statsmodels.genmod import families  # noqa: PLC0415 - start-up: statsmodels (~0.7 s) loads when this fit runs, not on `import planner.plan`
    from statsmodels.genmod.generalized_linear_model import GLM  # noqa: PLC0415 - start-up: statsmodels (~0.7 s) loads when this fit runs, not on `import planner.plan`

    endog = np.column_stack([h * trials, (1.0 - h) * trials])
    if cov_type == "cluster":
        return binomial_cr1(endog, basis, groups)
    # rows in time order within each pool (_usable): Newey–West per pool series
    model = GLM(endog, basis, family=families.Binomial())
    lags = hac_lags(len(h))
    res = model.fit(cov_type="hac-panel", cov_kwds={"groups": groups, "maxlags": lags})
    return (
        np.asarray(res.params, dtype=np.float64),
        np.asarray(res.cov_params(), dtype=np.float64),
    )


def _expit(x: Array) -> Array:
    from scipy.special import expit  # noqa: PLC0415 - start-up: scipy.special (~0.09 s) loads when this runs, not on `import planner.plan`

    out: Array = expit(x)
    return out


def _predict(fit: HitRateFit, sizes: Array, level: float) -> tuple[HitPrediction, ...]:
    lo, hi = fit.curve_interval(sizes)
    f = fit.curve(sizes)
    c_lo, c_hi = fit.size_range
    return tuple(
        HitPrediction(
            size_bytes=float(sizes[i]),
            hit_ratio=float(f[i]),
            interval=Interval(float(lo[i]), float(hi[i]), level),
            extrapolated=bool(sizes[i] < c_lo or sizes[i] > c_hi),
        )
        for i in range(sizes.size)
    )


def _eta_and_slope(fit: HitRateFit, lc: float) -> tuple[Array, float]:
    """Basis row b(ln C) and the slope dη/d ln C there (central difference of the
    piecewise cubic, exact to O(h²))."""
    step = 1e-5 * max(1.0, abs(lc))
    rows = _basis(np.array([lc - step, lc, lc + step]), fit.knots_ln_bytes)
    beta = np.asarray(fit.coef)
    b: Array = rows[1]
    return b, float((rows[2] - rows[0]) @ beta / (2 * step))


def _size_for(fit: HitRateFit, goal: float, fraction: float | None, level: float) -> Estimate:
    """The smallest size in the observed range where the curve reaches ``goal``: an
    absolute hit ratio (``fraction`` None) or ``fraction`` × the hit ratio at the largest
    size seen (then the goal moves with the coefficients too). Delta method on ln C for the
    root of p(C) − goal = 0.

    Reached already at the smallest size seen: NaN with ``hi`` = that size; not reached
    within the sizes seen: inf with ``hi`` = inf.
    """
    from scipy.optimize import brentq  # noqa: PLC0415 - start-up: scipy.optimize (~0.25 s) loads when this runs, not on `import planner.plan`

    c_lo, c_hi = fit.size_range
    grid = np.linspace(math.log(c_lo), math.log(c_hi), _ROOT_GRID)
    p = fit.curve(np.exp(grid))
    above = np.flatnonzero(p >= goal)
    if above.size == 0:
        return Estimate(math.inf, Interval(math.nan, math.inf, level), "bytes")
    i = int(above[0])
    if i == 0:
        return Estimate(math.nan, Interval(math.nan, c_lo, level), "bytes")
    lc = float(brentq(lambda x: float(fit.curve([math.exp(x)])[0]) - goal, grid[i - 1], grid[i],
                      xtol=1e-12))  # fmt: skip
    b, slope = _eta_and_slope(fit, lc)
    ps = float(fit.curve([math.exp(lc)])[0])
    grad = ps * (1 - ps) * b
    if fraction is not None:
        bm, _ = _eta_and_slope(fit, math.log(c_hi))
        pm = float(fit.curve([c_hi])[0])
        grad = grad - fraction * pm * (1 - pm) * bm
    dfdl = ps * (1 - ps) * slope
    if not dfdl > 0:
        return Estimate(math.exp(lc), Interval(0.0, math.inf, level), "bytes")
    se = math.sqrt(max(float(grad @ np.asarray(fit.coef_cov) @ grad), 0.0)) / dfdl
    return Estimate(
        math.exp(lc),
        Interval(math.exp(lc - fit.t_crit * se), exp_or_inf(lc + fit.t_crit * se), level),
        "bytes",
    )


def _rise_lower_bound(fit: HitRateFit, c_lo: float, c_hi: float) -> float:
    """Lower end of the interval of logit p(C_max) − logit p(C_min): > 0 when the hit ratio
    rises detectably across the sizes seen."""
    d = _basis(np.log(np.array([c_hi])), fit.knots_ln_bytes)[0]
    d = d - _basis(np.log(np.array([c_lo])), fit.knots_ln_bytes)[0]
    se = math.sqrt(max(float(d @ np.asarray(fit.coef_cov) @ d), 0.0))
    return float(d @ np.asarray(fit.coef)) - fit.t_crit * se
