"""The offload effect on one canary engine switched on and off in periods of time (a switchback).

y = α_engine + τ_time-period + β·offload + z'γ + ε on log outcomes, weighted by requests, with
a washout after every switch (Bojinov, Simchi-Levi & Zhao 2023) and errors clustered by time
period (CR2 with Bell–McCaffrey df, or Driscoll–Kraay with ``cov="hac"``). The controls'
windows measure each time period's common level.

Method: planner/fit/METHODS.md#switchback
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from core.errors import ConfigError
from planner.fit.capacity import QUEUE_GROWTH_SHARE
from planner.fit.common import (
    Estimate,
    FitResult,
    Interval,
    check_level,
    exp_or_inf,
    fmt,
    nan_interval,
    ols_robust,
    recorded_warnings,
    require_history,
    t_quantile,
)
from planner.fit.gain_curve import window_weights
from planner.fit.units import engine_codes, engine_keys

if TYPE_CHECKING:
    import numpy.typing as npt

    Array = npt.NDArray[np.float64]

NO_OFFLOAD = "none"
UNKNOWN_MODE = "unknown"
DEFAULT_WASHOUT_S = 300.0
COV_TYPES = ("cr2", "hac")

__all__ = ["Period", "SwitchbackFit", "carried_over", "engine_keys", "find_switchbacks",
           "fit_switchback", "switchback_periods"]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Period:
    """A maximal run of one engine's windows in one offload mode: ``[start, end)`` with
    ``start`` its first window's start and ``end`` the next period's first start (the last
    period: its last window's end); ``windows`` rows in it."""

    engine: str
    mode: str
    start: float
    end: float
    windows: int


@dataclass(frozen=True, slots=True)
class SwitchbackFit(FitResult):
    """``estimate`` = β, the offload effect on ``outcome`` (log scale when ``log``) with its
    ``interval`` at ``interval.level`` over time periods (METHODS.md#switchback)."""

    offload: str
    outcome: str
    log: bool
    ratio: Estimate  # exp β and its interval (NaN unless ``log``)
    se: float
    df: float
    cov_type: str  # "CR2" | "HAC" | "none"
    periods_by_arm: tuple[tuple[str, int], ...]  # switching engines' periods with windows used
    windows_by_arm: tuple[tuple[str, int], ...]  # switching engines' windows used
    switching: tuple[str, ...]
    controls: tuple[str, ...]
    time_periods: int
    time_effects: bool  # τ_b in the model (False without a control)
    dropped: tuple[tuple[str, int], ...]  # (reason, windows)
    washout_s: float


def _modes(frame: pd.DataFrame) -> npt.NDArray[np.object_]:
    out: npt.NDArray[np.object_] = (
        frame["offload_mode"].fillna(UNKNOWN_MODE).astype(str).to_numpy(dtype=object)
    )
    return out


def find_switchbacks(frame: pd.DataFrame) -> tuple[str, ...]:
    """Engine keys (sorted) whose rows carry two or more known offload modes."""
    if not len(frame) or "offload_mode" not in frame.columns:
        return ()
    keys, names = engine_codes(frame, short=True)
    modes = _modes(frame)
    known = modes != UNKNOWN_MODE
    mode_c, mode_u = pd.factorize(modes[known])
    width = max(len(mode_u), 1)
    pairs = pd.unique(keys[known] * width + mode_c)  # each (engine, mode) seen once
    per_key = np.bincount(pairs // width, minlength=len(names))
    return tuple(sorted(names[i] for i in np.flatnonzero(per_key >= 2).tolist()))


def _runs(
    starts: Array, modes: npt.NDArray[np.object_], window_s: float, engine: str
) -> list[Period]:
    """Periods of one engine's rows, already sorted by start."""
    if not starts.size:
        return []
    cut = np.flatnonzero(modes[1:] != modes[:-1]) + 1
    first = np.concatenate([[0], cut])
    last = np.concatenate([cut, [starts.size]])
    out = []
    for a, b in zip(first.tolist(), last.tolist(), strict=True):
        end = float(starts[b]) if b < starts.size else float(starts[b - 1]) + window_s
        out.append(Period(engine, str(modes[a]), float(starts[a]), end, b - a))
    return out


def _window_s(frame: pd.DataFrame) -> float:
    if "window_s" in frame.columns:
        w = frame["window_s"].to_numpy(dtype=float)
        w = w[np.isfinite(w) & (w > 0)]
        if w.size:
            return float(np.median(w))
    s = np.unique(frame["start"].to_numpy(dtype=float))
    gaps = np.diff(s)
    return float(np.median(gaps)) if gaps.size else 60.0


def switchback_periods(frame: pd.DataFrame, engine: str) -> tuple[Period, ...]:
    """The periods of ``engine`` (an engine key): maximal runs of its windows, sorted by
    start, in one offload mode (a missing mode counts as ``unknown``)."""
    if not len(frame):
        return ()
    rows = np.flatnonzero(engine_keys(frame) == engine)
    starts = frame["start"].to_numpy(dtype=float)[rows]
    order = np.argsort(starts, kind="stable")
    modes = _modes(frame)[rows][order]
    return tuple(_runs(starts[order], modes, _window_s(frame), engine))


def _queue(frame: pd.DataFrame) -> tuple[Array, Array]:
    """Per row: the mean waiting queue and the finished requests (NaN where not collected)."""
    nan = np.full(len(frame), np.nan)
    cols = [frame[c].to_numpy(dtype=float) if c in frame.columns else nan
            for c in ("waiting", "requests")]  # fmt: skip
    return cols[0], cols[1]


def carried_over(
    starts: Array, waiting: Array, finished: Array, switch_at: float, washout_s: float
) -> npt.NDArray[np.bool_]:
    """Which windows of one period (any order) the switch at ``switch_at`` still shapes: those
    starting within ``washout_s`` of it, then each following window while the waiting queue
    falls from the one before by more than QUEUE_GROWTH_SHARE of its finished requests (at
    least 1) — the backlog the other mode left is still being served. A missing queue ends
    the washout at ``washout_s``."""
    out = starts < switch_at + washout_s
    order = np.argsort(starts, kind="stable")
    prev = math.nan
    for j in order.tolist():
        if not out[j]:
            fall = prev - waiting[j] > max(QUEUE_GROWTH_SHARE * np.nan_to_num(finished[j]), 1.0)
            if not fall:
                break
            out[j] = True
        prev = float(waiting[j])
    return out


def _time_periods(periods: Sequence[Period]) -> Array:
    """Cut points of the time periods: every period start, then the last period end."""
    cuts = sorted({b.start for b in periods} | {max(b.end for b in periods)})
    return np.asarray(cuts, dtype=float)


def _identified(x: Array, j: int) -> bool:
    """Whether column ``j`` of ``x`` is not a linear combination of the others: its squared
    distance from their span (the Schur complement of X'X) is not ~0."""
    xtx = x.T @ x
    others = np.delete(np.arange(x.shape[1]), j)
    cross = xtx[others, j]
    coef, *_ = np.linalg.lstsq(xtx[np.ix_(others, others)], cross, rcond=None)
    left = float(xtx[j, j] - cross @ coef)
    return left > 1e-9 * max(float(xtx[j, j]), 1e-300)


def _dummies(codes: npt.NDArray[np.int64]) -> Array:
    """Indicator columns of every code but the first (the intercept carries it)."""
    levels = int(codes.max()) + 1 if codes.size else 0
    out: Array = (codes[:, None] == np.arange(1, levels)[None, :]).astype(np.float64)
    return out


@dataclass(frozen=True, slots=True)
class _Rows:
    """The frame's rows as arrays, one entry per row."""

    keys: npt.NDArray[np.object_]  # engine key
    modes: npt.NDArray[np.object_]  # offload mode (UNKNOWN_MODE when missing)
    starts: Array
    y: Array  # the outcome as collected
    waiting: Array  # mean waiting queue (NaN where not collected)
    finished: Array  # finished requests (NaN where not collected)


@dataclass(frozen=True, slots=True)
class _Switches:
    """The engines that ran both modes, their periods, and per row its period (-1: none) and
    whether the washout after a switch drops it."""

    engines: tuple[str, ...]
    periods: tuple[Period, ...]
    period_of: npt.NDArray[np.int64]  # index into ``periods``
    washed: npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class _Kept:
    """The rows a switchback fit uses, what the others were dropped for, and per frame row
    its time period and covariates."""

    used: npt.NDArray[np.int64]  # positions of the rows used
    dropped: tuple[tuple[str, int], ...]  # (reason, windows), in the order applied
    cell: npt.NDArray[np.int64]  # time period (-1 or the last cut and past: outside)
    z: Array  # the covariates' values


@dataclass(frozen=True, slots=True)
class _Design:
    """The switchback model's weighted design and what its estimate needs."""

    xs: Array  # intercept, engine and time-period effects, the mode, covariates; times √w
    ys: Array  # the outcome (logged when log) times √w
    j: int  # the mode's column
    cells: npt.NDArray[np.int64]  # each row's time period, 0-based (the clusters)
    n_cells: int
    time_effects: bool  # τ_b in the model (False without a control)
    weighted: bool
    weighting: str


@dataclass(frozen=True, slots=True)
class _Effect:
    """β of the mode, its variance and degrees of freedom, and how they were estimated."""

    beta: float
    var: float
    df: float
    cov_type: str  # "CR2" | "HAC"
    method: str
    warnings: tuple[str, ...]


def fit_switchback(  # noqa: PLR0913 - keyword-only fit options with defaults
    frame: pd.DataFrame,
    *,
    offload: str,
    outcome: str,
    log: bool = True,
    weight: str | None = "requests",
    covariates: Sequence[str] = (),
    level: float = 0.90,
    min_periods_per_arm: int = 2,
    washout_s: float = DEFAULT_WASHOUT_S,
    cov: str = "cr2",
    min_windows: int = 30,
) -> SwitchbackFit:
    """The offload effect β of the switchback model (METHODS.md#switchback) of ``offload``
    against ``none`` on ``outcome``. Raises InsufficientHistory when fewer than
    ``min_windows`` windows of the two modes have a usable outcome."""
    _check_options(
        frame, offload, level, cov=cov, washout_s=washout_s,
        min_periods_per_arm=min_periods_per_arm, covariates=covariates,
    )  # fmt: skip
    what = f"offload effect on {outcome} ({offload} vs none, switchback)"
    need = ("source", "start", "offload_mode", outcome)
    if not len(frame) or not all(c in frame.columns for c in need):
        require_history(what, 0, min_windows)
    window_s = _window_s(frame)
    rows = _rows(frame, outcome)
    in_pair = (rows.modes == NO_OFFLOAD) | (rows.modes == offload)
    bad_y = ~np.isfinite(rows.y) | ((rows.y <= 0.0) if log else False)
    require_history(what, int((in_pair & ~bad_y).sum()), min_windows)
    sw = _switches(rows, in_pair, window_s, washout_s)
    controls = tuple(sorted({str(k) for k in rows.keys[in_pair]} - set(sw.engines)))
    base = _unanswered(
        what, offload, outcome, log=log, level=level, washout_s=washout_s,
        switching=sw.engines, controls=controls,
    )  # fmt: skip
    if not sw.engines:
        return replace(
            base,
            why=f"no engine ran both none and {offload}: a switchback needs an engine whose "
            "offload is switched on and off",
        )
    kept = _kept(
        frame, rows, sw, in_pair=in_pair, bad_y=bad_y, covariates=covariates, log=log,
        washout_s=washout_s,
    )  # fmt: skip
    is_off = rows.modes[kept.used] == offload
    fit, arms, short = _counted(base, rows, sw, kept=kept, is_off=is_off)
    require_history(what, int(kept.used.size), min_windows)
    dm = _design(frame, rows, kept, is_off, weight=weight, log=log, covariates=covariates)
    fit = replace(
        fit,
        time_periods=dm.n_cells,
        time_effects=dm.time_effects,
        assumptions=_assumptions(outcome, log, covariates, washout_s, dm.time_effects),
        basis=(*fit.basis, dm.weighting),
    )
    why = _too_few_periods(arms, short, min_periods_per_arm)
    if not _identified(dm.xs, dm.j):
        return replace(fit, why=why or "the mode is not identified apart from the engines")
    effect = _regress(dm, cov, starts=rows.starts[kept.used], window_s=window_s, periods=sw.periods)
    return _answer(fit, effect, why=why, level=level, log=log)


def _check_options(
    frame: pd.DataFrame,
    offload: str,
    level: float,
    *,
    cov: str,
    washout_s: float,
    min_periods_per_arm: int,
    covariates: Sequence[str],
) -> None:
    """ConfigError for an option fit_switchback cannot use."""
    check_level(level)
    if cov not in COV_TYPES:
        raise ConfigError(f"cov must be one of {', '.join(COV_TYPES)}: {cov!r}")
    if offload in (NO_OFFLOAD, UNKNOWN_MODE):
        raise ConfigError(f"offload must name an offload mode, not {offload!r}")
    if washout_s < 0:
        raise ConfigError(f"washout_s must be >= 0: {washout_s}")
    if min_periods_per_arm < 1:
        raise ConfigError(f"min_periods_per_arm must be >= 1: {min_periods_per_arm}")
    missing = [c for c in covariates if c not in frame.columns]
    if missing:
        raise ConfigError(f"covariates not in the frame: {', '.join(missing)}")


def _rows(frame: pd.DataFrame, outcome: str) -> _Rows:
    keys = engine_keys(frame)
    modes = _modes(frame)
    starts = frame["start"].to_numpy(dtype=float)
    y = frame[outcome].to_numpy(dtype=float)
    waiting, finished = _queue(frame)
    return _Rows(keys, modes, starts, y, waiting, finished)


def _switches(
    rows: _Rows, in_pair: npt.NDArray[np.bool_], window_s: float, washout_s: float
) -> _Switches:
    """The switching engines of this comparison, their periods, the washout after each
    switch."""
    keys, modes, starts = rows.keys, rows.modes, rows.starts
    pair_frame = pd.DataFrame({"key": keys[in_pair], "mode": modes[in_pair]})
    n_modes = pair_frame.groupby("key")["mode"].nunique()
    switching = tuple(sorted(str(k) for k in n_modes.index[n_modes.to_numpy() >= 2]))
    periods: list[Period] = []
    washed = np.zeros(len(keys), dtype=bool)
    period_of = np.full(len(keys), -1, dtype=np.int64)  # index into ``periods``
    for key in switching:
        these_rows = np.flatnonzero(keys == key)
        these_rows = these_rows[np.argsort(starts[these_rows], kind="stable")]
        runs = _runs(starts[these_rows], modes[these_rows], window_s, key)
        pos = 0
        for i, b in enumerate(runs):
            these = these_rows[pos : pos + b.windows]
            pos += b.windows
            period_of[these] = len(periods)
            if i > 0:
                washed[these] = carried_over(starts[these], rows.waiting[these],
                                             rows.finished[these], b.start, washout_s)  # fmt: skip
            periods.append(b)
    return _Switches(switching, tuple(periods), period_of, washed)


def _unanswered(
    what: str,
    offload: str,
    outcome: str,
    *,
    log: bool,
    level: float,
    washout_s: float,
    switching: tuple[str, ...],
    controls: tuple[str, ...],
) -> SwitchbackFit:
    """The answer before any window is counted: the data cannot tell yet."""
    level_nan = nan_interval(level)
    return SwitchbackFit(
        what=what, estimate=math.nan, interval=level_nan, unit=f"log {outcome}" if log
        else outcome, n=0, method="", assumptions=(), basis=(), warnings=(), can_tell=False,
        why="", offload=offload, outcome=outcome, log=log,
        ratio=Estimate(math.nan, level_nan, "ratio"), se=math.nan, df=math.nan,
        cov_type="none", periods_by_arm=((NO_OFFLOAD, 0), (offload, 0)),
        windows_by_arm=((NO_OFFLOAD, 0), (offload, 0)), switching=switching, controls=controls,
        time_periods=0, time_effects=False, dropped=(), washout_s=float(washout_s),
    )  # fmt: skip


def _kept(
    frame: pd.DataFrame,
    rows: _Rows,
    sw: _Switches,
    *,
    in_pair: npt.NDArray[np.bool_],
    bad_y: npt.NDArray[np.bool_],
    covariates: Sequence[str],
    log: bool,
    washout_s: float,
) -> _Kept:
    """The rows used and the windows dropped per reason; time periods cut from every
    switching engine's periods: windows outside them are left out."""
    cuts = _time_periods(sw.periods)
    cell = np.searchsorted(cuts, rows.starts, side="right") - 1
    outside = (cell < 0) | (cell >= cuts.size - 1)
    z = frame[list(covariates)].to_numpy(dtype=float) if covariates else np.zeros((len(frame), 0))
    bad_z = ~np.isfinite(z).all(axis=1)
    steps = (
        ("other offload modes", ~in_pair),
        (f"outcome missing{' or <= 0' if log else ''}", bad_y),
        (
            f"washout ({fmt(washout_s)} s after a switch, then while an inherited queue drains)",
            sw.washed,
        ),
        ("outside the switchback's time blocks", outside),
        ("a covariate missing", bad_z),
    )
    keep = np.ones(len(frame), dtype=bool)
    dropped = []
    for reason, mask in steps:
        dropped.append((reason, int((keep & mask).sum())))
        keep &= ~mask
    return _Kept(np.flatnonzero(keep), tuple(dropped), cell, z)


def _counted(
    base: SwitchbackFit,
    rows: _Rows,
    sw: _Switches,
    *,
    kept: _Kept,
    is_off: npt.NDArray[np.bool_],
) -> tuple[SwitchbackFit, tuple[tuple[str, int], ...], list[str]]:
    """The fit with the periods and windows used per arm, the controls and what was dropped;
    the periods per arm and the switching engines with fewer than 2 periods used."""
    periods, switching, offload = sw.periods, sw.engines, base.offload
    used, dropped = kept.used, kept.dropped
    sw_rows = sw.period_of[used] >= 0
    used_periods = np.unique(sw.period_of[used][sw_rows])
    per_arm = {m: sum(1 for i in used_periods.tolist() if periods[i].mode == m)
               for m in (NO_OFFLOAD, offload)}  # fmt: skip
    per_engine = {k: len({i for i in used_periods.tolist() if periods[i].engine == k})
                  for k in switching}  # fmt: skip
    arms = ((NO_OFFLOAD, per_arm[NO_OFFLOAD]), (offload, per_arm[offload]))
    win_arms = (
        (NO_OFFLOAD, int((sw_rows & ~is_off).sum())),
        (offload, int((sw_rows & is_off).sum())),
    )
    controls = tuple(sorted({str(k) for k in rows.keys[used]} - set(switching)))
    dropped_text = ", ".join(f"{c} {r}" for r, c in dropped if c) or "none"
    fit = replace(
        base,
        n=int(used.size),
        periods_by_arm=arms,
        windows_by_arm=win_arms,
        controls=controls,
        dropped=dropped,
        basis=(
            f"switching engines: {', '.join(switching)}; controls: {len(controls)}",
            f"blocks used: none {arms[0][1]}, {offload} {arms[1][1]}; windows of the "
            f"switching engines: none {win_arms[0][1]}, {offload} {win_arms[1][1]}",
            f"windows used {used.size}; dropped: {dropped_text}",
        ),
    )
    return fit, arms, [k for k, c in per_engine.items() if c < 2]


def _design(
    frame: pd.DataFrame,
    rows: _Rows,
    kept: _Kept,
    is_off: npt.NDArray[np.bool_],
    *,
    weight: str | None,
    log: bool,
    covariates: Sequence[str],
) -> _Design:
    """Design: intercept, engine and time-period effects, the mode, centred covariates;
    without a control the time-period effects, confounded with the mode, are left out."""
    used, cell, z = kept.used, kept.cell, kept.z
    weights, weighting = window_weights(frame.iloc[used], weight)
    w = np.ones(used.size) if weights is None else weights
    y = rows.y[used]
    y = np.log(y) if log else y
    eng_codes = pd.factorize(rows.keys[used], sort=True)[0].astype(np.int64)
    cell_codes = pd.factorize(cell[used], sort=True)[0].astype(np.int64)
    n_cells = int(cell_codes.max()) + 1
    d = is_off.astype(np.float64)
    zc = z[used] - (w @ z[used]) / w.sum() if covariates else z[used]
    time_fx = _dummies(cell_codes)
    parts = [np.ones((used.size, 1)), _dummies(eng_codes), time_fx, d[:, None], zc]
    x = np.hstack(parts)
    j = 1 + (int(eng_codes.max()) if used.size else 0) + time_fx.shape[1]
    sw = np.sqrt(w)
    xs, ys = x * sw[:, None], y * sw
    time_effects = True
    if not _identified(xs, j):  # no control: τ_b and β are confounded
        x = np.hstack([parts[0], parts[1], parts[3], parts[4]])
        j -= time_fx.shape[1]
        xs = x * sw[:, None]
        time_effects = False
    return _Design(xs, ys, j, cell_codes, n_cells, time_effects, weights is not None, weighting)


def _assumptions(
    outcome: str, log: bool, covariates: Sequence[str], washout_s: float, time_effects: bool
) -> tuple[str, ...]:
    assumptions = [
        f"{'log ' if log else ''}{outcome} = engine + time block + mode effect"
        + (f" + {', '.join(covariates)} (centred)" if covariates else "")
        + (": the effect is a ratio, the same in every block" if log else ""),
        "time blocks independent once their common level is removed (the units of the "
        "interval); autocorrelation outlasting a block makes it too narrow",
        f"carry-over ends within the washout ({fmt(washout_s)} s after a switch)",
        "the schedule of the switches does not follow the load (randomized)",
    ]
    if covariates:
        assumptions.append("the covariates are not themselves changed by the offload mode")
    if not time_effects:
        assumptions.append(
            "no control engine: time-block effects are confounded with the mode and left "
            "out, so a time trend that follows the schedule biases the effect"
        )
    return tuple(assumptions)


def _too_few_periods(
    arms: tuple[tuple[str, int], ...], short: list[str], min_periods_per_arm: int
) -> str:
    """Why the periods used cannot tell (too few per arm, or an engine showing one mode
    only), or ""."""
    few = [f"{c} block{'s' if c != 1 else ''} of {m}" for m, c in arms if c < min_periods_per_arm]
    if few:
        return (
            f"only {' and '.join(few)} with windows after the washout; at least "
            f"{min_periods_per_arm} per arm are needed (the blocks, not the windows, are the "
            "units)"
        )
    if short:
        return (
            f"fewer than 2 blocks with windows after the washout on {', '.join(short)}: "
            "it shows one mode only"
        )
    return ""


def _regress(
    dm: _Design, cov: str, *, starts: Array, window_s: float, periods: Sequence[Period]
) -> _Effect:
    """β and its variance: CR2 clustered by time period (t with Bell–McCaffrey ν) or
    Driscoll–Kraay HAC over windows (t with G − 1)."""
    xs, ys, j, n_cells = dm.xs, dm.ys, dm.j, dm.n_cells
    estimator = "WLS" if dm.weighted else "OLS"
    c = np.zeros(xs.shape[1])
    c[j] = 1.0
    with recorded_warnings() as caught:
        if cov == "cr2":
            res = ols_robust(ys, xs, dm.cells, "CR2")
            beta, var = float(res.params[j]), float(res.cov[j, j])
            df = float(res.df(c)[0])
            cov_type = "CR2"
            method = (
                f"{estimator}, engine + time-block fixed "
                f"effects; CR2 clustered by time block ({n_cells}), t with Bell–McCaffrey ν"
            )
        else:
            beta, var, lags = _hac(ys, xs, j=j, starts=starts, window_s=window_s, periods=periods)
            df = float(n_cells - 1)
            cov_type = "HAC"
            method = (
                f"{estimator}, engine + time-block fixed "
                f"effects; Driscoll–Kraay HAC over windows (Bartlett, {lags} lags), "
                f"t with G − 1 = {n_cells - 1}"
            )
    return _Effect(beta, var, df, cov_type, method, tuple(caught))


def _answer(
    fit: SwitchbackFit, effect: _Effect, *, why: str, level: float, log: bool
) -> SwitchbackFit:
    """The fit with β, its t interval and exp β (on the log scale); without a defined
    interval, β alone and why."""
    beta, df = effect.beta, effect.df
    se = math.sqrt(effect.var) if effect.var > 0 else math.nan
    if not (math.isfinite(se) and math.isfinite(df) and df > 0):
        return replace(
            fit,
            estimate=beta,
            method=effect.method,
            cov_type=effect.cov_type,
            warnings=effect.warnings,
            why=why or f"the interval is not defined (se {fmt(se)}, ν {fmt(df)})",
        )
    half = t_quantile(level, df) * se
    interval = Interval(beta - half, beta + half, level)
    ratio = (
        Estimate(
            exp_or_inf(beta),
            Interval(exp_or_inf(interval.lo), exp_or_inf(interval.hi), level),
            "ratio",
        )
        if log
        else Estimate(math.nan, nan_interval(level), "ratio")
    )
    return replace(
        fit,
        estimate=beta,
        interval=interval,
        ratio=ratio,
        se=se,
        df=df,
        cov_type=effect.cov_type,
        method=effect.method,
        warnings=effect.warnings,
        can_tell=not why,
        why=why,
    )


def _hac(
    ys: Array, xs: Array, *, j: int, starts: Array, window_s: float, periods: Sequence[Period]
) -> tuple[float, float, int]:
    """β, its Driscoll–Kraay variance and the lags used (METHODS.md#switchback)."""
    from statsmodels.regression.linear_model import OLS  # noqa: PLC0415 - start-up: statsmodels (~0.7 s) loads when this fit runs, not on `import planner.plan`

    lags = max(1, round(float(np.median([b.windows for b in periods]))))
    t = np.rint((starts - starts.min()) / window_s).astype(np.int64)
    res = OLS(ys, xs).fit(
        cov_type="hac-groupsum",
        cov_kwds={"time": t, "maxlags": lags, "use_correction": "hac"},
    )
    cov = np.asarray(res.cov_params(), dtype=np.float64)
    return float(res.params[j]), float(cov[j, j]), lags
