"""The experiment designs a plan proposes: pure functions of a frame or of numbers, no store.

:func:`random_assignment` (seeded, never by load; pools assigned whole) and a switchback on
one canary: period length from the integrated autocorrelation time (Sokal 1997), periods in
randomized pairs (after Bojinov, Simchi-Levi & Zhao 2023, Management Science 69(7)), the
number of periods from the between-period noise.

Method: planner/plan/METHODS.md#design
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from core.errors import ConfigError, InsufficientHistory
from planner.fit.units import engine_keys

if TYPE_CHECKING:
    import numpy.typing as npt

    Array = npt.NDArray[np.float64]

ON, OFF = "on", "off"
ROUND_S = 300.0  # period lengths are whole multiples of 5 minutes
SOKAL_C = 5.0  # Sokal's window: the smallest M with M >= c·τ(M)
TAU_MULTIPLE = 5.0  # a period is the washout plus this many integrated autocorrelation times
MIN_WINDOWS = 30

__all__ = ["autocorrelation_time", "period_sigma", "periods_needed", "random_assignment",
           "switchback_period_s", "switchback_schedule"]  # fmt: skip


def _tau_window(rho: Array, c: float) -> tuple[float, int]:
    """τ(M) = 1 + 2 Σ_{k=1..M} ρ(k) at Sokal's window M (the last lag when none fits)."""
    taus = 1.0 + 2.0 * np.cumsum(rho[1:])
    lags = np.arange(1, rho.size)
    ok = np.flatnonzero(lags >= c * taus)
    m = int(ok[0]) if ok.size else taus.size - 1
    return float(taus[m]), int(lags[m])


def _tau_geyer(rho: Array) -> float:
    """τ = −1 + 2 Σ_{k<=m} Γ_k, Γ_k = ρ(2k) + ρ(2k + 1), over Geyer's initial monotone
    sequence: m the last k with every Γ positive, each Γ cut to the smallest before it."""
    pairs = rho[: 2 * (rho.size // 2)].reshape(-1, 2).sum(axis=1)
    stop = np.flatnonzero(pairs <= 0.0)
    pairs = pairs[: int(stop[0]) if stop.size else pairs.size]
    return float(-1.0 + 2.0 * np.minimum.accumulate(pairs).sum())


def autocorrelation_time(
    values: Sequence[float] | Array, *, max_lag: int, method: str = "sokal"
) -> float:
    """The integrated autocorrelation time τ = 1 + 2 Σ_{k>=1} ρ(k), in windows, of an
    equally spaced series (NaN: a missing window); a mean of L windows has the variance of
    L/τ independent ones. ρ: statsmodels' ``acf`` up to ``max_lag`` (missing values
    "conservative"). ``method="sokal"``: summed up to Sokal's automatic window, the smallest
    M with M >= 5·τ(M) (``max_lag`` when none is; Sokal 1997); ``"geyer"``: the
    initial monotone sequence estimator (Geyer 1992, "Practical Markov chain Monte Carlo",
    Statistical Science 7(4)), which also handles negative correlation (Sokal's window
    can stop at lag 1 there and give τ ≈ 0). A series with no variation has τ = 1."""
    from statsmodels.tsa.stattools import acf  # noqa: PLC0415 - start-up: statsmodels (~0.7 s) loads when this fit runs, not on `import planner.plan`

    if method not in ("sokal", "geyer"):
        raise ConfigError(f"method must be 'sokal' or 'geyer': {method!r}")
    x = np.asarray(values, dtype=float)
    finite = np.isfinite(x)
    if int(finite.sum()) < 3:
        raise InsufficientHistory("autocorrelation time", 3, int(finite.sum()))
    if max_lag < 1:
        raise ConfigError(f"max_lag must be >= 1: {max_lag}")
    if float(np.var(x[finite])) == 0.0:
        return 1.0
    lag = min(max_lag, x.size - 1)
    missing = "none" if finite.all() else "conservative"
    rho = np.nan_to_num(np.asarray(acf(x, nlags=lag, fft=True, missing=missing), dtype=float))
    return _tau_window(rho, SOKAL_C)[0] if method == "sokal" else _tau_geyer(rho)


def _outcome_rows(
    frame: pd.DataFrame, outcome: str, *, log: bool
) -> tuple[npt.NDArray[np.object_], Array, npt.NDArray[np.bool_], Array]:
    """(engine key, (log) outcome or NaN, usable, window start) per row."""
    y = frame[outcome].to_numpy(dtype=float)
    ok = np.isfinite(y) & ((y > 0) if log else True)
    v = np.where(ok, np.log(np.where(ok, y, 1.0)) if log else y, np.nan)
    return engine_keys(frame), v, ok, frame["start"].to_numpy(dtype=float)


def _canary_series(
    frame: pd.DataFrame, engine_key: str, outcome: str, *, log: bool, detrend: bool
) -> tuple[Array, Array, bool]:
    """(starts, values) of the canary's usable windows, sorted; values net of the controls'
    mean (each control engine centred first) at the same start when ``detrend`` and there
    are controls; and whether that was done."""
    keys, v, ok, starts = _outcome_rows(frame, outcome, log=log)
    mine = (keys == engine_key) & ok
    s, val = starts[mine], v[mine]
    order = np.argsort(s, kind="stable")
    s, val = s[order], val[order]
    ctrl = (keys != engine_key) & ok
    if not (detrend and ctrl.any()):
        return s, val, False
    c = pd.DataFrame({"key": keys[ctrl], "start": starts[ctrl], "v": v[ctrl]})
    c["v"] -= c.groupby("key")["v"].transform("mean")
    common = c.groupby("start")["v"].mean()
    net = val - common.reindex(s).to_numpy(dtype=float)
    keep = np.isfinite(net)
    return s[keep], net[keep], True


def _grid(starts: Array, values: Array, window_s: float) -> Array:
    """The values on the regular window grid from the first start, NaN where missing."""
    idx = np.rint((starts - starts[0]) / window_s).astype(np.int64)
    out: Array = np.full(int(idx[-1]) + 1, np.nan)
    out[idx] = values
    return out


def switchback_period_s(  # noqa: PLR0913 - keyword-only design inputs with defaults
    frame: pd.DataFrame,
    engine_key: str,
    outcome: str,
    *,
    window_s: float,
    min_period_s: float = 900.0,
    max_period_s: float = 7200.0,
    washout_s: float = 300.0,
    log: bool = True,
    detrend: bool = True,
) -> tuple[float, str]:
    """The period length in seconds for a switchback of ``engine_key`` (``source/engine``) and
    how it was derived: ``washout_s`` + 5 integrated autocorrelation times (at least one
    window) of the canary's (log) ``outcome`` — net of the controls' common level when
    ``detrend`` and the frame has other engines, since the fit removes it — rounded up to
    a multiple of 5 minutes, at least ``min_period_s`` and at most ``max_period_s``: a drift
    slower than that (the canary's TTFT following its own load through the day) is what the
    randomized pairs and the fit's time periods absorb, and periods longer than a few hours
    would stretch the experiment over days. Raises InsufficientHistory below 30 windows of
    the canary."""
    if window_s <= 0:
        raise ConfigError(f"window_s must be > 0: {window_s}")
    s, v, netted = _canary_series(frame, engine_key, outcome, log=log, detrend=detrend)
    if s.size < MIN_WINDOWS:
        raise InsufficientHistory(f"switchback block length of {engine_key}", MIN_WINDOWS, s.size)
    series = _grid(s, v, window_s)
    max_lag = max(1, min(series.size // 4, 2000))
    tau = autocorrelation_time(series, max_lag=max_lag)
    raw = washout_s + TAU_MULTIPLE * max(tau, 1.0) * window_s
    period = max(float(min_period_s), math.ceil(raw / ROUND_S - 1e-9) * ROUND_S)
    capped = period > max_period_s
    period = min(period, float(max_period_s))
    what = f"{'log ' if log else ''}{outcome} of {engine_key}" + (
        ", net of the controls' common level" if netted else ""
    )
    text = (
        f"block {period / 60:.0f} min: washout {washout_s:.0f} s + {TAU_MULTIPLE:.0f} × "
        f"τ_int {tau:.3g} windows (at least 1) × {window_s:.0f} s = {raw:.0f} s, rounded up to "
        f"a multiple of {ROUND_S / 60:.0f} min, at least {min_period_s:.0f} s; τ_int of {what} "
        f"over {int(np.isfinite(series).sum())} windows (Sokal's window, lags <= {max_lag})"
    )
    if capped:
        text += (
            f"; capped at {max_period_s / 60:.0f} min: a drift that slow is left to the "
            "randomized pairs and the fit's time blocks"
        )
    return period, text


def period_sigma(
    frame: pd.DataFrame,
    engine_key: str,
    outcome: str,
    *,
    period_s: float,
    window_s: float,
    washout_s: float = 300.0,
    log: bool = True,
) -> tuple[float, int]:
    """The between-period SD of the canary's period-mean (log) ``outcome`` after removing the
    controls' common period means, and the number of periods it rests on: the history is cut
    into periods of ``period_s`` from the canary's first window, each period's first
    ``washout_s`` left out of the canary's mean as the fit will, periods with fewer than half
    their windows left out. The ``sigma_period`` of :func:`periods_needed`. Raises
    InsufficientHistory below 3 periods."""
    if period_s <= washout_s or window_s <= 0:
        raise ConfigError(f"block_s ({period_s}) must exceed washout_s ({washout_s})")
    keys, v, ok, starts = _outcome_rows(frame, outcome, log=log)
    mine = (keys == engine_key) & ok
    what = f"block noise of {engine_key}"
    if not mine.any():
        raise InsufficientHistory(what, 3, 0)
    t0 = float(starts[mine].min())
    period_of = np.floor((starts - t0) / period_s).astype(np.int64)
    offset = starts - t0 - period_of * period_s
    canary = pd.DataFrame({"b": period_of[mine], "v": v[mine], "late": offset[mine] >= washout_s})
    per = canary.groupby("b").agg(n=("v", "size"))
    means = canary[canary["late"]].groupby("b")["v"].mean()
    full = per.index[per["n"].to_numpy() >= 0.5 * period_s / window_s]
    diff = means.reindex(full)
    ctrl = (keys != engine_key) & ok & (starts >= t0)
    if ctrl.any():
        c = pd.DataFrame({"key": keys[ctrl], "b": period_of[ctrl], "v": v[ctrl]})
        c["v"] -= c.groupby("key")["v"].transform("mean")
        diff = diff - c.groupby("b")["v"].mean().reindex(full)
    d = diff.to_numpy(dtype=float)
    d = d[np.isfinite(d)]
    if d.size < 3:
        raise InsufficientHistory(what, 3, int(d.size))
    return float(np.std(d, ddof=1)), int(d.size)


def periods_needed(
    sigma_period: float, effect: float, *, level: float, power: float, max_periods: int
) -> int:
    """The smallest even number of periods n (n/2 per mode, at least 4) for which the
    interval at ``level`` of the mode contrast excludes 0 with probability ``power`` when the
    true (log) effect is ``effect``: se = sigma_period·√(2/(n/2)), t with ν = n − 2 (the
    Bell–McCaffrey ν of a balanced single-canary switchback is close to it), power from the
    noncentral t. 0 when even ``max_periods`` periods do not reach it. Periods of one mode that
    follow each other in the schedule are one time period to the fit: the se holds, ν is
    lower (tests/planner/test_design.py: planned 10 periods, median ν 5.2, power 0.76 for a
    nominal 0.8 in a seeded Monte Carlo of the fit)."""
    from scipy import stats  # noqa: PLC0415 - start-up: scipy.stats (~0.6 s) loads when this runs, not on `import planner.plan`

    if not 0.0 < level < 1.0 or not 0.0 < power < 1.0:
        raise ConfigError(f"level and power must be in (0, 1): {level}, {power}")
    if not sigma_period >= 0.0:
        raise ConfigError(f"sigma_period must be >= 0: {sigma_period}")
    if sigma_period == 0.0:
        return 4 if effect != 0.0 and max_periods >= 4 else 0
    for n in range(4, max_periods + 1, 2):
        df = n - 2
        se = sigma_period * math.sqrt(4.0 / n)
        crit = float(stats.t.ppf(0.5 + level / 2.0, df))
        ncp = abs(effect) / se
        reach = float(stats.nct.sf(crit, df, ncp) + stats.nct.cdf(-crit, df, ncp))
        if reach >= power:
            return n
    return 0


def switchback_schedule(n_periods: int, *, seed: int) -> tuple[str, ...]:
    """``n_periods`` of "on" / "off": each consecutive pair one of each in a random order
    (an odd last period: either), seeded (METHODS.md#design)."""
    if n_periods < 2:
        raise ConfigError(f"a switchback needs at least 2 periods: {n_periods}")
    rng = np.random.default_rng(seed)
    out: list[str] = []
    for _ in range(n_periods // 2):
        out.extend((ON, OFF) if rng.random() < 0.5 else (OFF, ON))
    if n_periods % 2:
        out.append(ON if rng.random() < 0.5 else OFF)
    return tuple(out)


def random_assignment(
    engines: Sequence[str], k: int, *, seed: int, pools: Mapping[str, str] | None = None
) -> tuple[str, ...]:
    """The engines (sorted) of ``k`` randomization units drawn at random with ``seed`` — by
    name only, never by load. A unit is an LMCache pool (``pools``: engine -> pool) with
    every engine in it, or an engine of its own; the draw does not depend on the order of
    ``engines``."""
    names = sorted(set(engines))
    given = pools or {}
    unit_of = {e: ("pool", given[e]) if e in given else ("engine", e) for e in names}
    units = sorted(set(unit_of.values()))
    if not 1 <= k <= len(units):
        raise ConfigError(f"k must be between 1 and {len(units)} (units to switch): {k}")
    chosen = np.random.default_rng(seed).choice(len(units), size=k, replace=False)
    picked = {units[int(i)] for i in chosen}
    return tuple(e for e in names if unit_of[e] in picked)
