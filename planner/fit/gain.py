"""Tokens/s vs KV utilization × offload mode: the equal-KV-use diagnostic of `kvscope plan`.

Not the effect of offload nor its capacity gain (offload itself lowers KV use: effects.py and
capacity.py estimate those). Fits the log-throughput gain g(u) of an offload mode over none,
piecewise linear in log u on the modes' common support (WLS; errors clustered by engine with
CR1, CR2 + Bell–McCaffrey df with few engines, else HC3), and locates its break-even u* with
a Fieller interval (or a cluster bootstrap); ``can_tell`` False, with a reason, otherwise.

Method: planner/fit/METHODS.md#gain
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from core.errors import ConfigError
from planner.fit.common import (
    MIN_CLUSTERS,
    FitResult,
    Interval,
    check_level,
    engine_groups,
    fmt,
    nan_interval,
    ols_robust,
    recorded_warnings,
    require_history,
    t_quantile,
)
from planner.fit.gain_crossings import (
    bootstrap_break_even,
    edge_crossing,
    located_crossings,
    roots_of,
)
from planner.fit.gain_curve import (
    DEFAULT_KNOTS,
    GainCurve,
    GainPoint,
    basis_matrix,
    choose_knots,
    knots_at,
    window_weights,
)
from planner.frames.groups import text_values
from planner.frames.space import present

if TYPE_CHECKING:
    import numpy.typing as npt
    import pandas as pd

    Array = npt.NDArray[np.float64]

NO_OFFLOAD = "none"
# Windows whose mean KV utilization exceeds this are saturated (the cache pinned full,
# requests queued or preempted): excluded from the gain fit (METHODS.md#gain).
SATURATED_UTIL = 0.95
NOT_OFFLOAD = frozenset({"none", "unknown"})

__all__ = ["GainFit", "GainPoint", "fit_gain", "located_crossings"]


@dataclass(frozen=True, slots=True)
class GainFit(FitResult):
    """``estimate`` = break-even utilization u* where the offload gain crosses zero."""

    offload: str  # the mode compared with "none"
    # crosses | positive_throughout | negative_throughout | positive_above | negative_below |
    # undetermined; *_above / *_below carry the one-sided bound on u* in ``interval``
    verdict: str
    direction: str  # "offload better above u*" | "offload better below u*" | ""
    support: tuple[float, float]  # common utilization range used
    roots: tuple[float, ...]  # every sign change of the estimated gain
    grid: tuple[GainPoint, ...]
    windows_by_mode: tuple[tuple[str, int], ...]
    engines_by_mode: tuple[tuple[str, int], ...]
    cov_type: str
    util_column: str
    response_column: str


@dataclass(frozen=True, slots=True)
class _Spec:
    """The options of one gain fit that its steps read."""

    label: str  # the mode compared with "none" ("offload": every offload mode pooled)
    util: str
    response: str
    log: bool  # log response on log utilization (the gain is a ratio)
    level: float
    min_per_mode: int


@dataclass(frozen=True, slots=True)
class _Windows:
    """The windows a gain fit uses: utilization, response, mode (1.0 = offload), engine
    and weight, one entry per window."""

    u: Array
    y: Array
    d: Array
    g: npt.NDArray[np.int64]
    w: Array

    def take(self, keep: npt.NDArray[np.bool_]) -> _Windows:
        return _Windows(self.u[keep], self.y[keep], self.d[keep], self.g[keep], self.w[keep])


@dataclass(frozen=True, slots=True)
class _Model:
    """The fitted curves and the gain read on a fine grid across the common support."""

    curve: GainCurve
    design: Array  # [x·√w, x·√w·d]: what the bootstrap refits
    y: Array  # the response (logged on the log scale) times √w
    fine: Array  # 401 utilizations across the support
    gain: Array  # the estimated gain at each
    ok: npt.NDArray[np.bool_]  # its interval contains 0 there (the Fieller acceptance set)


def fit_gain(  # noqa: PLR0913 - keyword-only fit options with defaults, as statsmodels' fit() takes them
    frame: pd.DataFrame,
    *,
    offload: str | None = None,
    util: str = "kv_util",
    response: str = "tokens_per_s",
    level: float = 0.95,
    knots: int | None = None,
    scale: str = "log",
    saturated: float = SATURATED_UTIL,
    weight: str | None = "requests",
    min_windows: int = 60,
    min_per_mode: int = 30,
    min_overlap: float = 0.05,
    n_grid: int = 21,
    interval_method: str = "fieller",
    n_boot: int = 999,
    time_budget_s: float = 10.0,
    seed: int = 0,
) -> GainFit:
    """Fit the gain model (METHODS.md#gain) of ``offload`` (default: every offload mode
    pooled) against ``none``. Raises InsufficientHistory below ``min_windows`` windows."""
    _check_options(level, interval_method, scale, saturated)
    log = scale == "log"
    spec = _Spec(offload or "offload", util, response, log, level, min_per_mode)
    what = f"offload gain ({spec.label} vs none)"
    data, d = _compared(frame, offload, util, response, weight)
    require_history(what, len(data), min_windows)
    win, weighted, weighting, excluded = _usable(
        data, d, spec, weight=weight if log else None, saturated=saturated
    )
    fit = _unanswered(win, spec, what=what, knots=knots, weighted=weighted, excluded=excluded)
    few = [m for m, c in fit.windows_by_mode if c < min_per_mode]
    if few:
        return _cannot(fit, f"too few windows for mode {', '.join(few)} (< {min_per_mode})")
    fit, inside = _common_support(fit, win, spec, min_overlap=min_overlap, excluded=excluded)
    if inside is None:
        return fit
    fit, model = _fit_model(fit, inside, spec, knots=knots, weighting=weighting, n_grid=n_grid)
    return _break_even(
        fit, model, inside, spec, interval_method=interval_method, n_boot=n_boot,
        budget_s=time_budget_s, seed=seed,
    )  # fmt: skip


def _check_options(level: float, interval_method: str, scale: str, saturated: float) -> None:
    """ConfigError for an option fit_gain does not know."""
    check_level(level)
    if interval_method not in ("fieller", "bootstrap"):
        raise ConfigError(f"interval_method must be 'fieller' or 'bootstrap': {interval_method}")
    if scale not in ("log", "linear"):
        raise ConfigError(f"scale must be 'log' or 'linear': {scale}")
    if not 0.0 < saturated <= 1.0:
        raise ConfigError(f"saturated must be in (0, 1]: {saturated}")


def _compared(
    frame: pd.DataFrame, offload: str | None, util: str, response: str, weight: str | None
) -> tuple[pd.DataFrame, Array]:
    """The rows of ``offload`` (every offload mode for None) and of none with the columns
    read below, and per row 1.0 for offload, 0.0 for none."""
    cols = [util, response, "offload_mode"]
    if not all(c in frame.columns for c in cols):
        return frame.iloc[0:0], np.zeros(0)
    used = dict.fromkeys([*cols, "source", "engine", weight or ""])  # what is read below
    data = frame[[c for c in used if c in frame.columns]].dropna(subset=cols)
    modes = text_values(data["offload_mode"])
    is_off = (modes == offload) if offload else ~np.isin(modes, list(NOT_OFFLOAD))
    keep = is_off | (modes == NO_OFFLOAD)
    return data[keep], is_off[keep].astype(np.float64)


def _usable(
    data: pd.DataFrame, d: Array, spec: _Spec, *, weight: str | None, saturated: float
) -> tuple[_Windows, bool, str, str]:
    """The windows left once saturated (and, on the log scale, idle) ones are excluded;
    whether they are weighted, the weighting's text and the exclusions' text."""
    util, response, log = spec.util, spec.response, spec.log
    u = data[util].to_numpy(dtype=float)
    y = data[response].to_numpy(dtype=float)
    g = engine_groups(data)
    weights, weighting = window_weights(data, weight)
    w = np.ones(len(data)) if weights is None else weights
    # Saturated windows (KV pinned at capacity: queueing, preemptions) carry no information
    # on throughput as a function of utilization — every mode sits at u ≈ 1 there — and on
    # the log scale idle windows (no tokens or no KV in use) have no logarithm.
    drop_sat = u > saturated
    drop_idle = ((u <= 0.0) | (y <= 0.0)) if log else np.zeros(u.size, dtype=bool)
    keep0 = ~(drop_sat | drop_idle)
    excluded = (
        f"excluded: {int(drop_sat.sum())} saturated windows ({util} > {fmt(saturated)})"
        + (f", {int((drop_idle & ~drop_sat).sum())} idle windows ({util} or {response} = 0)"
           if log else "")
    )  # fmt: skip
    win = _Windows(u, y, d, g, w).take(keep0)
    return win, weights is not None, weighting, excluded


def _unanswered(
    win: _Windows, spec: _Spec, *, what: str, knots: int | None, weighted: bool, excluded: str
) -> GainFit:
    """The answer before the curves are fitted: what is compared, how, on which windows;
    the data cannot tell yet."""
    util, response, label, log, d, g = spec.util, spec.response, spec.label, spec.log, win.d, win.g
    counts = ((NO_OFFLOAD, int((d == 0).sum())), (label, int((d == 1).sum())))  # after exclusions
    engines = (
        (NO_OFFLOAD, int(np.unique(g[d == 0]).size)),
        (label, int(np.unique(g[d == 1]).size)),
    )
    how_many = "K" if knots is None else str(knots)
    assumptions = (
        f"log {response} piecewise linear in log {util} with {how_many} interior knots, per "
        "mode (multiplicative errors: the gain is a ratio)"
        if log
        else f"{response} piecewise linear in {util} with {how_many} interior knots, per mode",
        "association, not causation: engine differences confound the mode unless engines "
        "ran both modes",
        "windows independent within engine unless errors are clustered by engine",
    )
    estimator = "WLS" if weighted else "OLS"
    method = f"{estimator}{' on log-log' if log else ''}, piecewise-linear × mode interaction"
    # the answer so far: each step below replaces the fields it learns (checked by mypy)
    return GainFit(
        what=what, unit=util, method=method, assumptions=assumptions, offload=label,
        util_column=util, response_column=response, windows_by_mode=counts,
        engines_by_mode=engines, estimate=math.nan, interval=nan_interval(spec.level),
        n=len(win.y), can_tell=False, why="", verdict="undetermined", direction="",
        support=(math.nan, math.nan), roots=(), grid=(), cov_type="none", warnings=(),
        basis=(f"windows: none {counts[0][1]}, {label} {counts[1][1]}; {excluded}",),
    )  # fmt: skip


def _cannot(fit: GainFit, why: str) -> GainFit:
    return replace(fit, why=why, can_tell=False)


def _common_support(
    fit: GainFit, win: _Windows, spec: _Spec, *, min_overlap: float, excluded: str
) -> tuple[GainFit, _Windows | None]:
    """The windows inside the modes' common utilization range (each mode's 2nd–98th
    percentiles) with the fit's support; None and the answer when the ranges overlap by
    less than ``min_overlap`` or a mode has too few windows inside."""
    u, d, util, label = win.u, win.d, spec.util, spec.label
    (lo0, hi0), (lo1, hi1) = (np.quantile(u[d == v], [0.02, 0.98]) for v in (0.0, 1.0))
    lo, hi = float(max(lo0, lo1)), float(min(hi0, hi1))
    ranges = f"none [{fmt(lo0)}, {fmt(hi0)}], {label} [{fmt(lo1)}, {fmt(hi1)}]"
    if hi - lo < min_overlap:
        return replace(
            fit,
            why=f"the {util} ranges of the modes do not overlap: {ranges}",
            basis=(*fit.basis, f"{util} ranges: {ranges}"),
        ), None
    win = win.take((u >= lo) & (u <= hi))
    d = win.d
    fit = replace(
        fit,
        n=int(win.y.size),
        basis=(
            f"windows in the common support: none {int((d == 0).sum())}, {label} {int(d.sum())}",
            f"{util} ranges: {ranges}; common support [{fmt(lo)}, {fmt(hi)}]",
            excluded,
        ),
        support=(lo, hi),
    )
    if min(int((d == 0).sum()), int(d.sum())) < spec.min_per_mode:
        return _cannot(
            fit,
            f"too few windows of a mode inside the common support [{fmt(lo)}, {fmt(hi)}] "
            f"(< {spec.min_per_mode})",
        ), None
    return fit, win


def _fit_model(
    fit: GainFit, win: _Windows, spec: _Spec, *, knots: int | None, weighting: str, n_grid: int
) -> tuple[GainFit, _Model]:
    """Fit both modes' curves and read the gain, its interval and its sign changes across
    the support; the fit records the knots, errors, roots and the ``n_grid`` points."""
    fit, design, y, kn, centre = _design(fit, win, spec.log, knots=knots, weighting=weighting)
    fit, n_eng = _error_kind(fit, win)
    lo, hi = fit.support
    level = spec.level
    fine = np.linspace(lo, hi, 401)
    at = np.linspace(lo, hi, n_grid)
    with recorded_warnings() as caught:
        ols = ols_robust(y, design, win.g, fit.cov_type)
        curve = GainCurve(kn, centre, ols.params, ols.cov, spec.log)
        gain, se = curve.gain(fine)
        roots = roots_of(fine, gain)
        # t quantile per utilization: Bell–McCaffrey ν of the gain contrast with CR2,
        # G − 1 with CR1, n − p with HC3 (planner.fit.common.RobustOLS.df)
        tq_fine = _t_quantiles(level, ols.df(curve.gain_contrasts(fine)))
        df_at = ols.df(curve.gain_contrasts(at))
        ok = np.abs(gain) <= tq_fine * se  # Fieller acceptance set
        points = curve.points(at, _t_quantiles(level, df_at), level, df=df_at)
    if fit.cov_type == "CR2":
        fit = replace(
            fit,
            assumptions=(
                *fit.assumptions[:-1],
                f"only {n_eng} engines: bias-reduced cluster errors (CR2) with Bell–McCaffrey "
                f"degrees of freedom ({fmt(float(np.nanmin(df_at)))}–"
                f"{fmt(float(np.nanmax(df_at)))} over the support); with so few clusters the "
                "interval rests on the engines being alike",
            ),
        )
    fit = replace(
        fit,
        roots=tuple(roots),
        grid=points,
        warnings=tuple(caught),
        method=f"{fit.method}; {fit.cov_type} errors",
    )
    return fit, _Model(curve, design, y, fine, gain, ok)


def _design(
    fit: GainFit, win: _Windows, log: bool, *, knots: int | None, weighting: str
) -> tuple[GainFit, Array, Array, Array, float]:
    """The weighted design [x·√w, x·√w·d] of the piecewise-linear basis (its knots chosen
    by cross-validation unless given), the response times √w, the knots and the centre;
    the fit's basis records the choice and the weighting."""
    xs = np.log(win.u) if log else win.u
    centre = 0.5 * (float(xs.min()) + float(xs.max()))
    y = np.log(win.y) if log else win.y
    sw = np.sqrt(win.w)
    if knots is None:
        chosen, cv = choose_knots(xs, y, win.d, win.g, centre, sw=sw)
        # undersmoothing: the bias of a curve tuned for prediction is of the order of its
        # standard error, so intervals on it under-cover (Hall 1992, Ann. Statist. 20(2));
        # never fewer than DEFAULT_KNOTS
        knots = max(chosen, DEFAULT_KNOTS)
        fit = replace(fit, basis=(*fit.basis, f"{cv}; used {knots} (at least {DEFAULT_KNOTS})"))
    fit = replace(fit, basis=(*fit.basis, weighting))
    kn = knots_at(xs, knots)
    # weighted least squares as OLS on rows scaled by √w (the sandwich stays valid); the
    # design [x·√w, x·√w·d] made in place (d is 0 or 1: the products are exact either way)
    p = 2 + kn.size
    design = np.empty((xs.size, 2 * p))
    basis_matrix(xs, kn, centre, scale=sw, out=design[:, :p])
    np.multiply(design[:, :p], win.d[:, None], out=design[:, p:])
    return fit, design, y * sw, kn, centre


def _error_kind(fit: GainFit, win: _Windows) -> tuple[GainFit, int]:
    """The fit with its error kind (cluster, CR2 or HC3) and the assumption it adds; the
    number of engines."""
    g, d = win.g, win.d
    n_g = [present(g[d == v])[0].size for v in (0.0, 1.0)]  # engine codes: small, >= 0
    n_eng = present(g)[0].size
    # Cluster by engine when the mode changes between engines (then engine-level
    # differences are part of the gain's error) as long as each mode has >= 2 engines;
    # otherwise HC3. With few clusters (< MIN_CLUSTERS) CR1 is too narrow (Cameron & Miller
    # 2015): the bias-reduced CR2 with Bell–McCaffrey degrees of freedom is used instead
    # (Imbens & Kolesár 2016; Pustejovsky & Tipton 2018).
    clustered = min(n_g) >= 2 and n_eng >= 4
    cov_type = ("cluster" if n_eng >= MIN_CLUSTERS else "CR2") if clustered else "HC3"
    if cov_type == "CR2":
        fit = replace(
            fit,
            assumptions=(
                *fit.assumptions,
                f"only {n_eng} engines: bias-reduced cluster errors (CR2)",
            ),
        )
    elif cov_type == "HC3":
        fit = replace(
            fit,
            assumptions=(
                *fit.assumptions,
                f"engines per mode {n_g}: too few to estimate engine-to-engine variation, which "
                "the HC3 interval leaves out",
            ),
        )
    return replace(fit, cov_type=cov_type), n_eng


def _break_even(
    fit: GainFit, model: _Model, win: _Windows, spec: _Spec, *, interval_method: str,
    n_boot: int, budget_s: float, seed: int,
) -> GainFit:  # fmt: skip
    """The answer from the gain's sign changes: cannot tell its sign, a bound on u* (none
    located), or the break-even u* with its Fieller or bootstrap interval."""
    lo, hi = fit.support
    level, fine, gain, ok = spec.level, model.fine, model.gain, model.ok
    span = f"[{fmt(lo)}, {fmt(hi)}]"
    if ok.all():
        return _cannot(
            fit,
            f"the gain's {level:.0%} interval contains 0 at every {spec.util} in {span}: "
            "the data cannot tell its sign",
        )
    located = located_crossings(fine, gain, ok, pick="steep")
    edge = edge_crossing(fine, gain, ok)
    if not located and edge is None:
        return _no_break_even(fit, model, spec)
    # Which sign change answers "from which utilization on does offload pay off": a located
    # rising one, else a rising one at an edge, else a located falling one, else the edge's.
    cands = [(*c, False, False) for c in located] + ([edge] if edge is not None else [])
    root, iv_lo, iv_hi, rising, open_lo, open_hi = min(
        cands, key=lambda c: (not c[3], c[4] or c[5], c[0])
    )
    others = [c[0] for c in cands if c[0] != root and not (c[4] or c[5])]
    if interval_method == "fieller":
        how = f"Fieller (inverted pointwise {fit.cov_type} t-test)"
    else:  # bootstrap
        with recorded_warnings() as more:
            iv_lo, iv_hi, open_lo, open_hi, done = bootstrap_break_even(
                model.design, model.y, win.d, win.g, curve=model.curve, root=root, fine=fine,
                level=level, n_boot=n_boot, budget_s=budget_s, seed=seed,
            )  # fmt: skip
        fit = replace(fit, warnings=(*fit.warnings, *more))
        how = f"stratified engine bootstrap, {done} replicates, seed {seed}"
    why = ""
    if open_lo or open_hi:
        why = (
            f"the break-even interval reaches the edge of the common support {span}: "
            "u* may lie outside the observed range"
        )
    elif others:
        why = (
            f"the gain changes sign {len(others) + 1} times where its interval excludes 0 "
            f"(at {', '.join(fmt(c) for c in sorted([root, *others]))}); "
            f"{'the rising one' if rising else 'the first'} is reported"
        )
    better = "above" if rising else "below"
    return replace(
        fit,
        estimate=float(root),
        interval=Interval(iv_lo, iv_hi, level),
        can_tell=not why,
        why=why,
        verdict="crosses",
        direction=f"offload better {better} u*",
        method=f"{fit.method}; break-even interval: {how}",
    )


def _no_break_even(fit: GainFit, model: _Model, spec: _Spec) -> GainFit:
    """The answer when no sign change is located where the interval excludes 0: the gain's
    sign throughout, or a one-sided bound on u* where the data cannot tell its sign."""
    # Every stretch where the interval excludes 0 has the same sign and the estimate
    # changes sign only inside interior stretches where it does not: no break-even
    # located. A break-even is still possible where the interval contains 0 at the end
    # of the support where it would lie (the low end for a positive gain): then only a
    # bound is claimed, u* <= the first significant u (u* >= the last, if negative).
    lo, hi = fit.support
    fine, gain, ok, roots, util = model.fine, model.gain, model.ok, fit.roots, spec.util
    span = f"[{fmt(lo)}, {fmt(hi)}]"
    sig = np.flatnonzero(~ok)
    positive = bool(gain[sig[0]] > 0)
    loose = (
        f"; the estimate crosses 0 at {', '.join(fmt(r) for r in roots)}, where its "
        "interval contains 0"
        if roots
        else ""
    )
    share = f"its interval excludes 0 on {sig.size / ok.size:.0%} of {span}{loose}"
    sign = ">" if positive else "<"
    if not (ok[0] if positive else ok[-1]):
        return replace(
            _cannot(fit, f"no break-even: gain {sign} 0 throughout {span} ({share})"),
            verdict="positive_throughout" if positive else "negative_throughout",
        )
    bound = float(fine[sig[0]] if positive else fine[sig[-1]])
    side, rel, word = ("below", "<=", "from") if positive else ("above", ">=", "up to")
    return replace(
        _cannot(
            fit,
            f"no break-even located: gain {sign} 0 {word} {util} "
            f"{fmt(bound)} ({share}); {side} {fmt(bound)} the data cannot tell its sign: "
            f"u* {rel} {fmt(bound)} if there is one",
        ),
        verdict="positive_above" if positive else "negative_below",
        interval=Interval(lo, bound, spec.level) if positive else Interval(bound, hi, spec.level),
        direction=f"offload better {'above' if positive else 'below'} u*",
    )


def _t_quantiles(level: float, df: Array) -> Array:
    """Two-sided t critical values, one per ν (NaN ν, a contrast with no variance: normal)."""
    known: dict[float, float] = {}  # one quantile per distinct ν (often one ν for all)
    for v in df.tolist():
        nu = float(v) if math.isfinite(v) else math.inf
        if nu not in known:
            known[nu] = t_quantile(level, nu)
    out: Array = np.array([known[float(v) if math.isfinite(v) else math.inf]
                           for v in df.tolist()])  # fmt: skip
    return out
