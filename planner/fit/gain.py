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

if TYPE_CHECKING:
    import numpy as np
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


def fit_gain(
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
    import numpy as np

    from core.errors import ConfigError

    check_level(level)
    if interval_method not in ("fieller", "bootstrap"):
        raise ConfigError(f"interval_method must be 'fieller' or 'bootstrap': {interval_method}")
    if scale not in ("log", "linear"):
        raise ConfigError(f"scale must be 'log' or 'linear': {scale}")
    if not 0.0 < saturated <= 1.0:
        raise ConfigError(f"saturated must be in (0, 1]: {saturated}")
    log = scale == "log"
    label = offload or "offload"
    what = f"offload gain ({label} vs none)"
    cols = [util, response, "offload_mode"]
    if not all(c in frame.columns for c in cols):
        data, d = frame.iloc[0:0], np.zeros(0)
    else:
        used = dict.fromkeys([*cols, "source", "engine", weight or ""])  # what is read below
        data = frame[[c for c in used if c in frame.columns]].dropna(subset=cols)
        modes = data["offload_mode"].astype(str).to_numpy()
        is_off = (modes == offload) if offload else ~np.isin(modes, list(NOT_OFFLOAD))
        keep = is_off | (modes == NO_OFFLOAD)
        data, d = data[keep], is_off[keep].astype(np.float64)
    require_history(what, len(data), min_windows)
    u = data[util].to_numpy(dtype=float)
    y = data[response].to_numpy(dtype=float)
    g = engine_groups(data)
    weights, weighting = window_weights(data, weight if log else None)
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
    u, y, d, g, w = u[keep0], y[keep0], d[keep0], g[keep0], w[keep0]
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
    estimator = "OLS" if weights is None else "WLS"
    method = f"{estimator}{' on log-log' if log else ''}, piecewise-linear × mode interaction"
    # the answer so far: each step below replaces the fields it learns (checked by mypy)
    fit = GainFit(
        what=what, unit=util, method=method, assumptions=assumptions, offload=label,
        util_column=util, response_column=response, windows_by_mode=counts,
        engines_by_mode=engines, estimate=math.nan, interval=nan_interval(level), n=len(y),
        can_tell=False, why="", verdict="undetermined", direction="",
        support=(math.nan, math.nan), roots=(), grid=(), cov_type="none", warnings=(),
        basis=(f"windows: none {counts[0][1]}, {label} {counts[1][1]}; {excluded}",),
    )  # fmt: skip

    def cannot(why: str) -> GainFit:
        return replace(fit, why=why, can_tell=False)

    few = [m for m, c in counts if c < min_per_mode]
    if few:
        return cannot(f"too few windows for mode {', '.join(few)} (< {min_per_mode})")
    (lo0, hi0), (lo1, hi1) = (np.quantile(u[d == v], [0.02, 0.98]) for v in (0.0, 1.0))
    lo, hi = float(max(lo0, lo1)), float(min(hi0, hi1))
    ranges = f"none [{fmt(lo0)}, {fmt(hi0)}], {label} [{fmt(lo1)}, {fmt(hi1)}]"
    if hi - lo < min_overlap:
        return replace(
            fit,
            why=f"the {util} ranges of the modes do not overlap: {ranges}",
            basis=(*fit.basis, f"{util} ranges: {ranges}"),
        )
    keep = (u >= lo) & (u <= hi)
    u, y, d, g, w = u[keep], y[keep], d[keep], g[keep], w[keep]
    n = int(y.size)
    fit = replace(
        fit,
        n=n,
        basis=(
            f"windows in the common support: none {int((d == 0).sum())}, {label} {int(d.sum())}",
            f"{util} ranges: {ranges}; common support [{fmt(lo)}, {fmt(hi)}]",
            excluded,
        ),
        support=(lo, hi),
    )
    if min(int((d == 0).sum()), int(d.sum())) < min_per_mode:
        return cannot(
            f"too few windows of a mode inside the common support [{fmt(lo)}, {fmt(hi)}] "
            f"(< {min_per_mode})"
        )
    xs = np.log(u) if log else u
    centre = 0.5 * (float(xs.min()) + float(xs.max()))
    if log:
        y = np.log(y)
    sw = np.sqrt(w)
    if knots is None:
        chosen, cv = choose_knots(xs, y, d, g, centre, sw=sw)
        # undersmoothing: the bias of a curve tuned for prediction is of the order of its
        # standard error, so intervals on it under-cover (Hall 1992, Ann. Statist. 20(2));
        # never fewer than DEFAULT_KNOTS
        knots = max(chosen, DEFAULT_KNOTS)
        fit = replace(fit, basis=(*fit.basis, f"{cv}; used {knots} (at least {DEFAULT_KNOTS})"))
    fit = replace(fit, basis=(*fit.basis, weighting))
    kn = knots_at(xs, knots)
    x = basis_matrix(xs, kn, centre)
    # weighted least squares as OLS on rows scaled by √w (the sandwich stays valid); the
    # design [x·√w, x·√w·d] made in place (d is 0 or 1: the products are exact either way)
    p = x.shape[1]
    design = np.empty((x.shape[0], 2 * p))
    np.multiply(x, sw[:, None], out=design[:, :p])
    del x
    np.multiply(design[:, :p], d[:, None], out=design[:, p:])
    y = y * sw
    n_g = [int(np.unique(g[d == v]).size) for v in (0.0, 1.0)]
    n_eng = int(np.unique(g).size)
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
                *assumptions,
                f"only {n_eng} engines: bias-reduced cluster errors (CR2)",
            ),
        )
    elif cov_type == "HC3":
        fit = replace(
            fit,
            assumptions=(
                *assumptions,
                f"engines per mode {n_g}: too few to estimate engine-to-engine variation, which "
                "the HC3 interval leaves out",
            ),
        )
    fine = np.linspace(lo, hi, 401)
    at = np.linspace(lo, hi, n_grid)
    with recorded_warnings() as caught:
        ols = ols_robust(y, design, g, cov_type)
        curve = GainCurve(kn, centre, ols.params, ols.cov, log)
        gain, se = curve.gain(fine)
        roots = roots_of(fine, gain)
        # t quantile per utilization: Bell–McCaffrey ν of the gain contrast with CR2,
        # G − 1 with CR1, n − p with HC3 (planner.fit.common.RobustOLS.df)
        tq_fine = _t_quantiles(level, ols.df(curve.gain_contrasts(fine)))
        df_at = ols.df(curve.gain_contrasts(at))
        ok = np.abs(gain) <= tq_fine * se  # Fieller acceptance set
        points = curve.points(at, _t_quantiles(level, df_at), level, df=df_at)
    if cov_type == "CR2":
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
        cov_type=cov_type,
        warnings=tuple(caught),
        method=f"{method}; {cov_type} errors",
    )
    span = f"[{fmt(lo)}, {fmt(hi)}]"
    if ok.all():
        return cannot(
            f"the gain's {level:.0%} interval contains 0 at every {util} in {span}: "
            "the data cannot tell its sign"
        )
    located = located_crossings(fine, gain, ok, pick="steep")
    edge = edge_crossing(fine, gain, ok)
    if not located and edge is None:
        # every stretch where the interval excludes 0 has the same sign and the estimate
        # changes sign only inside interior stretches where it does not: no break-even
        # located. A break-even is still possible where the interval contains 0 at the end
        # of the support where it would lie (the low end for a positive gain): then only a
        # bound is claimed, u* <= the first significant u (u* >= the last, if negative).
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
                cannot(f"no break-even: gain {sign} 0 throughout {span} ({share})"),
                verdict="positive_throughout" if positive else "negative_throughout",
            )
        bound = float(fine[sig[0]] if positive else fine[sig[-1]])
        side, rel, word = ("below", "<=", "from") if positive else ("above", ">=", "up to")
        return replace(
            cannot(
                f"no break-even located: gain {sign} 0 {word} {util} "
                f"{fmt(bound)} ({share}); {side} {fmt(bound)} the data cannot tell its sign: "
                f"u* {rel} {fmt(bound)} if there is one"
            ),
            verdict="positive_above" if positive else "negative_below",
            interval=Interval(lo, bound, level) if positive else Interval(bound, hi, level),
            direction=f"offload better {'above' if positive else 'below'} u*",
        )
    # Which sign change answers "from which utilization on does offload pay off": a located
    # rising one, else a rising one at an edge, else a located falling one, else the edge's.
    cands = [(*c, False, False) for c in located] + ([edge] if edge is not None else [])
    root, iv_lo, iv_hi, rising, open_lo, open_hi = min(
        cands, key=lambda c: (not c[3], c[4] or c[5], c[0])
    )
    others = [c[0] for c in cands if c[0] != root and not (c[4] or c[5])]
    if interval_method == "fieller":
        how = f"Fieller (inverted pointwise {cov_type} t-test)"
    else:  # bootstrap
        with recorded_warnings() as more:
            iv_lo, iv_hi, open_lo, open_hi, done = bootstrap_break_even(
                design, y, d, g, curve=curve, root=root, fine=fine, level=level,
                n_boot=n_boot, budget_s=time_budget_s, seed=seed,
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


def _t_quantiles(level: float, df: Array) -> Array:
    """Two-sided t critical values, one per ν (NaN ν, a contrast with no variance: normal)."""
    import numpy as np

    known: dict[float, float] = {}  # one quantile per distinct ν (often one ν for all)
    for v in df.tolist():
        nu = float(v) if math.isfinite(v) else math.inf
        if nu not in known:
            known[nu] = t_quantile(level, nu)
    out: Array = np.array([known[float(v) if math.isfinite(v) else math.inf]
                           for v in df.tolist()])  # fmt: skip
    return out
