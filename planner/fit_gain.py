"""Throughput vs utilization × offload mode: does KV offload pay off, and from which load?

Model
-----
With u a pressure measure (default ``kv_util``), d = 1 for windows of the offload mode
and 0 for windows without offload, and B(u) a continuous piecewise-linear basis
``[1, u − ū, (u − κ_1)+, …, (u − κ_K)+]`` (knots κ at equally spaced quantiles of u):

    y_i = B(u_i)'β + d_i · B(u_i)'γ + ε_i ,

so ``none(u) = B(u)'β`` and the *gain* of offload is ``g(u) = B(u)'γ`` (tokens/s), the
relative gain ``g(u) / none(u)``. The fit is restricted to the *common support*: the
utilization range both modes cover (each mode's 2nd–98th percentiles intersected), so
neither curve is extrapolated.

Estimator and uncertainty
-------------------------
OLS (normal equations; ``planner.fitcommon.ols_robust``, checked against statsmodels in the
tests) with cluster-robust covariance by engine (CR1, Student t with G−1 df) when each mode
has ≥ 2 engines and there are ≥ 4 in all — engine-level differences then enter the gain's
error, as they must when the mode is fixed per engine — and HC3 otherwise (windows treated
as independent; ``assumptions`` says what that leaves out). With fewer than 10 engines CR1
is too narrow (Cameron & Miller 2015). Pointwise intervals for g(u) (Wald) and
g(u)/none(u) (delta method). The break-even u* solves g(u*) = 0: a sign change of the
estimated gain that the data *locate* — between two utilizations where the gain's interval
excludes 0 with opposite signs (:func:`located_crossings`). Its interval, by default, is
Fieller's: the set {u : |g(u)| ≤ t·se(g(u))} of break-evens not rejected by a level-α
test, i.e. the inversion of the pointwise test — it stays valid when g is flat (the delta
method's ĝ'(u*) in the denominator does not) — namely the accepted stretch around u*,
evaluated on a 401-point grid over the support. Without a located sign change, one inside
the accepted stretch at an edge of the support is reported with that stretch as its
interval, open at the edge (u* may lie beyond the observed range); a sign change inside an
interior accepted stretch with the same sign on both sides is a wiggle, not a break-even.
Why not simply the first root: in real telemetry the absolute gain goes to 0 with the
throughput as u → 0, so the estimate often wanders across 0 near the low edge; taken as
the break-even, that root hid a located break-even further up (planner/accuracy.py, the
simulator study). In seeded simulations (20 engines, 240 windows each, engine random
effects) its 90 % interval covered the true u* in 91 of 100 replicates
(tests/planner/test_fit_gain.py checks 50); with 4 + 4 engines, 84 of 100. Alternatively
``interval_method="bootstrap"``: a seeded stratified cluster bootstrap (engines resampled
with replacement within each mode; percentile interval), bounded by ``n_boot`` and
``time_budget_s`` — it covered 86/100 (20 engines) and 80/100 (8 engines) in the same
simulations, so Fieller stays the default.

Assumptions
-----------
Mean throughput is a smooth function of u within each mode (piecewise linear with the
chosen knots); the comparison is an association: when modes differ by engine, engine-level
differences (model, GPU, traffic mix) are confounded with the mode unless the same engine
ran both modes — with few engines per mode the interval does not cover that. HC3 treats
windows as independent (serial correlation makes it too narrow); CR1 needs enough engines.

When the data cannot tell
-------------------------
``can_tell`` is False with a reason when: a mode has too few windows; the utilization
ranges do not overlap; there is no break-even in the support (``verdict`` then says
``positive_throughout`` / ``negative_throughout``: the sign wherever the interval excludes
0); the gain's interval contains 0 at every u (``undetermined``); the break-even interval
reaches the edge of the support; or the gain changes sign (located) more than once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.fitcommon import (
    MIN_CLUSTERS,
    Budget,
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

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pandas as pd

    Array = npt.NDArray[np.float64]

NO_OFFLOAD = "none"
# Windows whose mean KV utilization exceeds this are saturated (the cache pinned full,
# requests queued or preempted): excluded from the gain fit (fit_gain's docstring).
SATURATED_UTIL = 0.95
CANDIDATE_KNOTS = (1, 2, 3, 4, 5, 6)  # interior knots tried by cross-validation
DEFAULT_KNOTS = 3  # without enough engines to cross-validate
NOT_OFFLOAD = frozenset({"none", "unknown"})


@dataclass(frozen=True, slots=True)
class GainPoint:
    """The gain at one utilization: absolute (response units) and relative to no offload."""

    u: float
    gain: float
    gain_interval: Interval
    relative: float
    relative_interval: Interval


@dataclass(frozen=True, slots=True)
class GainFit(FitResult):
    """``estimate`` = break-even utilization u* where the offload gain crosses zero."""

    offload: str  # the mode compared with "none"
    verdict: str  # crosses | positive_throughout | negative_throughout | undetermined
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
    """Fit the gain model (module docstring) of ``offload`` (default: every offload mode
    pooled) against ``none``. Raises InsufficientHistory below ``min_windows`` windows."""
    import numpy as np

    from collector.errors import ConfigError

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
        data = frame.dropna(subset=cols)
        modes = data["offload_mode"].astype(str).to_numpy()
        is_off = (modes == offload) if offload else ~np.isin(modes, list(NOT_OFFLOAD))
        keep = is_off | (modes == NO_OFFLOAD)
        data, d = data[keep], is_off[keep].astype(np.float64)
    require_history(what, len(data), min_windows)
    u = data[util].to_numpy(dtype=float)
    y = data[response].to_numpy(dtype=float)
    g = engine_groups(data)
    w, weighting = _weights(data, weight if log else None)
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
    method = f"OLS{' on log-log' if log else ''}, piecewise-linear × mode interaction"
    out: dict[str, Any] = {
        "what": what, "unit": util, "method": method, "assumptions": assumptions,
        "offload": label, "util_column": util, "response_column": response,
        "windows_by_mode": counts, "engines_by_mode": engines, "estimate": math.nan,
        "interval": nan_interval(level), "n": len(y), "can_tell": False, "why": "",
        "verdict": "undetermined", "direction": "", "support": (math.nan, math.nan),
        "roots": (), "grid": (), "cov_type": "none", "warnings": (),
        "basis": (f"windows: none {counts[0][1]}, {label} {counts[1][1]}; {excluded}",),
    }  # fmt: skip

    def cannot(why: str, **kw: Any) -> GainFit:
        return GainFit(**{**out, **kw, "why": why, "can_tell": False})

    few = [m for m, c in counts if c < min_per_mode]
    if few:
        return cannot(f"too few windows for mode {', '.join(few)} (< {min_per_mode})")
    (lo0, hi0), (lo1, hi1) = (np.quantile(u[d == v], [0.02, 0.98]) for v in (0.0, 1.0))
    lo, hi = float(max(lo0, lo1)), float(min(hi0, hi1))
    ranges = f"none [{fmt(lo0)}, {fmt(hi0)}], {label} [{fmt(lo1)}, {fmt(hi1)}]"
    if hi - lo < min_overlap:
        return cannot(
            f"the {util} ranges of the modes do not overlap: {ranges}",
            basis=(*out["basis"], f"{util} ranges: {ranges}"),
        )
    keep = (u >= lo) & (u <= hi)
    u, y, d, g, w = u[keep], y[keep], d[keep], g[keep], w[keep]
    n = int(y.size)
    out["n"] = n
    out["basis"] = (
        f"windows in the common support: none {int((d == 0).sum())}, {label} {int(d.sum())}",
        f"{util} ranges: {ranges}; common support [{fmt(lo)}, {fmt(hi)}]",
        excluded,
    )
    out["support"] = (lo, hi)
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
        knots, cv = _choose_knots(xs, y, d, g, centre, sw=sw)
        out["basis"] = (*out["basis"], cv)
    out["basis"] = (*out["basis"], weighting)
    kn = _knots_at(xs, knots)
    x = _basis(xs, kn, centre)
    # weighted least squares as OLS on rows scaled by √w (the sandwich stays valid)
    design = np.hstack([x, x * d[:, None]]) * sw[:, None]
    y = y * sw
    n_g = [int(np.unique(g[d == v]).size) for v in (0.0, 1.0)]
    n_eng = int(np.unique(g).size)
    # Cluster by engine when the mode changes between engines (then engine-level
    # differences are part of the gain's error) as long as each mode has >= 2 engines;
    # otherwise HC3. With few clusters (< MIN_CLUSTERS) CR1 is too narrow (Cameron & Miller
    # 2015): the bias-reduced CR2 with t(G−1) is used instead (Imbens & Kolesár 2016).
    clustered = min(n_g) >= 2 and n_eng >= 4
    cov_type = ("cluster" if n_eng >= MIN_CLUSTERS else "CR2") if clustered else "HC3"
    if cov_type == "CR2":
        out["assumptions"] = (
            *assumptions,
            f"only {n_eng} engines: bias-reduced cluster errors (CR2) with t({n_eng - 1}); "
            "with so few clusters the interval rests on the engines being alike",
        )
    elif cov_type == "HC3":
        out["assumptions"] = (
            *assumptions,
            f"engines per mode {n_g}: too few to estimate engine-to-engine variation, which "
            "the HC3 interval leaves out",
        )
    tq = t_quantile(level, n_eng - 1 if clustered else n - design.shape[1])
    fine = np.linspace(lo, hi, 401)
    with recorded_warnings() as caught:
        params, cov = ols_robust(y, design, g, cov_type)
        curve = _Curve(kn, centre, params, cov, log)
        gain, se = curve.gain(fine)
        roots = _roots(fine, gain)
        ok = np.abs(gain) <= tq * se  # Fieller acceptance set
        points = curve.points(np.linspace(lo, hi, n_grid), tq, level)
    out.update(
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
    located = located_crossings(fine, gain, ok)
    edge = _edge_crossing(fine, gain, ok)
    if not located and edge is None:
        # every stretch where the interval excludes 0 has the same sign and the estimate
        # changes sign only inside interior stretches where it does not: no break-even
        positive = bool(gain[~ok][0] > 0)
        loose = (
            f"; the estimate crosses 0 at {', '.join(fmt(r) for r in roots)}, where its "
            "interval contains 0"
            if roots
            else ""
        )
        return cannot(
            f"no break-even: gain {'>' if positive else '<'} 0 throughout {span} (its interval "
            f"excludes 0 on {float(np.mean(~ok)):.0%} of it{loose})",
            verdict="positive_throughout" if positive else "negative_throughout",
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
            iv_lo, iv_hi, open_lo, open_hi, done = _bootstrap(
                design, y, d, g, curve=curve, root=root, fine=fine, level=level,
                n_boot=n_boot, budget_s=time_budget_s, seed=seed,
            )  # fmt: skip
        out["warnings"] = (*out["warnings"], *more)
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
    out.update(
        estimate=float(root),
        interval=Interval(iv_lo, iv_hi, level),
        can_tell=not why,
        why=why,
        verdict="crosses",
        direction=f"offload better {better} u*",
        method=f"{out['method']}; break-even interval: {how}",
    )
    return GainFit(**out)


def _weights(data: pd.DataFrame, column: str | None) -> tuple[Array, str]:
    """Window weights for the log-scale fit: the variance of a window's log throughput is
    about (1 + CV² of tokens per request) / (requests in it) — a window's throughput is a
    sum over its requests — so a window with few requests (low load, long prompts) is
    weighted down in proportion (at least 1). Unweighted without the column."""
    import numpy as np

    if column is None or column not in data.columns:
        return np.ones(len(data)), "unweighted"
    r = data[column].to_numpy(dtype=float)
    if not np.isfinite(r).any():
        return np.ones(len(data)), f"unweighted (no {column} counts)"
    out: Array = np.maximum(np.nan_to_num(r, nan=1.0), 1.0)
    return out, f"windows weighted by {column} (at least 1): var(log tokens/s) ∝ 1/{column}"


def _knots_at(x: Array, k: int) -> Array:
    """``k`` interior knots at equally spaced quantiles of ``x``."""
    import numpy as np

    if not k:
        return np.zeros(0)
    out: Array = np.unique(np.quantile(x, np.arange(1, k + 1) / (k + 1)))
    return out


def _choose_knots(
    x: Array, y: Array, d: Array, g: npt.NDArray[np.int64], centre: float, *, sw: Array
) -> tuple[int, str]:
    """The number of knots K in CANDIDATE_KNOTS with the least leave-one-engine-out
    prediction error (each engine predicted by the fit on all the others: the error that
    matters when the curves are used for an engine not yet seen), or DEFAULT_KNOTS with
    fewer than 4 engines. Per-engine cross-products make every refit a small solve."""
    import numpy as np

    codes, inv = np.unique(g, return_inverse=True)
    if codes.size < 4:
        return DEFAULT_KNOTS, f"knots: {DEFAULT_KNOTS} (fewer than 4 engines: not cross-validated)"
    order = np.argsort(inv, kind="stable")
    cuts = np.searchsorted(inv[order], np.arange(codes.size + 1))
    scores: dict[int, float] = {}
    for k in CANDIDATE_KNOTS:
        b = _basis(x, _knots_at(x, k), centre)
        design = (np.hstack([b, b * d[:, None]]) * sw[:, None])[order]
        ys = (y * sw)[order]
        q = design.shape[1]
        xtx = np.empty((codes.size, q, q))
        xty = np.empty((codes.size, q))
        yy = np.empty(codes.size)
        for e in range(codes.size):
            xe, ye = design[cuts[e] : cuts[e + 1]], ys[cuts[e] : cuts[e + 1]]
            xtx[e], xty[e], yy[e] = xe.T @ xe, xe.T @ ye, ye @ ye
        tot, toty = xtx.sum(axis=0), xty.sum(axis=0)
        sse = 0.0
        for e in range(codes.size):
            beta = np.linalg.lstsq(tot - xtx[e], toty - xty[e], rcond=None)[0]
            sse += float(yy[e] - 2.0 * beta @ xty[e] + beta @ xtx[e] @ beta)
        scores[k] = sse / y.size
    best = min(scores, key=lambda k: scores[k])
    listed = ", ".join(f"{k}: {v:.4g}" for k, v in scores.items())
    return best, f"knots: {best}, by leave-one-engine-out mean squared error ({listed})"


def _basis(u: Array, knots: Array, centre: float) -> Array:
    import numpy as np

    cols = [np.ones_like(u), u - centre, *(np.maximum(0.0, u - k) for k in knots)]
    return np.column_stack(cols)


@dataclass(frozen=True, slots=True)
class _Curve:
    """The fitted model: basis (knots, centre), coefficients (β then γ), covariance."""

    knots: Array
    centre: float
    params: Array
    cov: Array
    log: bool = False  # the model is log(response) on log(u): the gain is a log ratio

    def basis(self, u: Array) -> Array:
        import numpy as np

        return _basis(np.log(u) if self.log else u, self.knots, self.centre)

    @property
    def p(self) -> int:
        return int(self.params.size // 2)

    def gain(self, u: Array) -> tuple[Array, Array]:
        """g(u) = B(u)'γ and its standard error (log units on the log scale)."""
        import numpy as np

        b = self.basis(u)
        p = self.p
        var = np.einsum("ij,jk,ik->i", b, self.cov[p:, p:], b)
        return b @ self.params[p:], np.sqrt(np.maximum(var, 0.0))

    def points(self, u: Array, tq: float, level: float) -> tuple[GainPoint, ...]:
        """Absolute and relative gain with pointwise intervals at each u."""
        import numpy as np

        b = self.basis(u)
        none = b @ self.params[: self.p]
        gain, se = self.gain(u)
        if self.log:
            # r = exp(g) − 1 with the interval mapped through exp (exact for the Wald
            # interval of g); absolute gain = exp(none) · r (the geometric-mean curve of no
            # offload times the ratio; its interval leaves none's own error out)
            base = np.exp(none)
            rel_l = np.expm1(gain)
            lo_l, hi_l = np.expm1(gain - tq * se), np.expm1(gain + tq * se)
            return tuple(
                GainPoint(
                    u=float(u[i]),
                    gain=float(base[i] * rel_l[i]),
                    gain_interval=Interval(
                        float(base[i] * lo_l[i]), float(base[i] * hi_l[i]), level
                    ),
                    relative=float(rel_l[i]),
                    relative_interval=Interval(float(lo_l[i]), float(hi_l[i]), level),
                )
                for i in range(u.size)
            )
        # Relative gain r = g/none; gradient wrt (β, γ) = (−g/none² · B, B/none).
        jac = np.hstack([-(gain / none**2)[:, None] * b, b / none[:, None]])
        se_r = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", jac, self.cov, jac), 0.0))
        rel = gain / none

        def iv(x: float, s: float) -> Interval:
            return Interval(x - tq * s, x + tq * s, level)

        return tuple(
            GainPoint(
                u=float(u[i]),
                gain=float(gain[i]),
                gain_interval=iv(float(gain[i]), float(se[i])),
                relative=float(rel[i]),
                relative_interval=iv(float(rel[i]), float(se_r[i])),
            )
            for i in range(u.size)
        )


def _roots(u: Array, gain: Array) -> list[float]:
    """Sign changes of the gain on the grid, linearly interpolated."""
    import numpy as np

    s = np.sign(gain)
    idx = np.flatnonzero(s[:-1] * s[1:] < 0)
    exact = np.flatnonzero(s == 0)
    out = [float(u[i] - gain[i] * (u[i + 1] - u[i]) / (gain[i + 1] - gain[i])) for i in idx]
    return sorted(out + [float(u[i]) for i in exact])


def located_crossings(
    u: Array, gain: Array, ok: npt.NDArray[np.bool_]
) -> list[tuple[float, float, float, bool]]:
    """Sign changes of ``gain`` that the data locate: (root, lo, hi, rising) for each pair of
    consecutive grid points where the interval excludes 0 (``~ok``) with opposite signs.

    [lo, hi] is the accepted stretch between them (the Fieller set around the crossing, on
    the grid; widened to the root when the root falls between grid points) and root the
    first sign change of the estimate between them. A sign change inside a stretch of
    accepted points that reaches the edge of the grid, or that has the same sign on both
    sides, is not located: the gain is not distinguishable from 0 there (near u = 0 both
    modes' throughput, hence the absolute gain, go to 0, so the estimate often wanders
    across 0 at the low edge).
    """
    import numpy as np

    sig = np.flatnonzero(~ok)
    out: list[tuple[float, float, float, bool]] = []
    for a, b in zip(sig[:-1].tolist(), sig[1:].tolist(), strict=True):
        if (gain[a] > 0) == (gain[b] > 0):
            continue
        seg = slice(a, b + 1)
        root = _roots(u[seg], gain[seg])[0]
        lo, hi = (float(u[a + 1]), float(u[b - 1])) if b > a + 1 else (root, root)
        out.append((root, min(lo, root), max(hi, root), bool(gain[b] > 0)))
    return out


def _edge_crossing(
    u: Array, gain: Array, ok: npt.NDArray[np.bool_]
) -> tuple[float, float, float, bool, bool, bool] | None:
    """A sign change of the estimate inside a stretch of accepted points at an edge of the
    grid (the low one first): (root, lo, hi, rising, open_lo, open_hi), else None. The
    break-even may then lie anywhere in that stretch or beyond the edge."""
    import numpy as np

    sig = np.flatnonzero(~ok)
    if not sig.size:
        return None
    for a, b, at_lo in ((0, int(sig[0]), True), (int(sig[-1]), u.size - 1, False)):
        roots = _roots(u[a : b + 1], gain[a : b + 1])
        if roots:
            root = roots[-1] if at_lo else roots[0]
            rising = bool(gain[b] > 0) if at_lo else bool(gain[a] < 0)
            lo, hi = (float(u[0]), float(u[max(b - 1, 0)])) if at_lo else (
                float(u[min(a + 1, u.size - 1)]), float(u[-1]))  # fmt: skip
            return root, min(lo, root), max(hi, root), rising, at_lo, not at_lo
    return None


def _bootstrap(
    design: Array, y: Array, d: Array, g: npt.NDArray[np.int64], *, curve: _Curve,
    root: float, fine: Array, level: float, n_boot: int, budget_s: float, seed: int,
) -> tuple[float, float, bool, bool, int]:  # fmt: skip
    """Percentile interval of u* over engine-resampled refits.

    Engines are resampled with replacement within strata (only-none, only-offload, both),
    so each replicate keeps both modes. Per-engine X'X and X'y make a replicate cost one
    small solve. Replicates with no crossing count against the interval (open ends).
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    p = curve.p
    ng = int(g.max()) + 1
    q = design.shape[1]
    xtx = np.zeros((ng, q, q))
    xty = np.zeros((ng, q))
    for e in range(ng):
        m = g == e
        xtx[e] = design[m].T @ design[m]
        xty[e] = design[m].T @ y[m]
    share = np.bincount(g, weights=d, minlength=ng) / np.maximum(np.bincount(g, minlength=ng), 1)
    kind = np.where(share == 0, 0, np.where(share == 1, 1, 2))
    strata = [np.flatnonzero(kind == k) for k in (0, 1, 2) if np.any(kind == k)]
    bfine = curve.basis(fine)
    budget = Budget(budget_s)
    found: list[float] = []
    done = 0
    for _ in range(n_boot):
        if budget.spent:
            break
        w = np.zeros(ng)
        for members in strata:
            np.add.at(w, rng.choice(members, size=members.size, replace=True), 1.0)
        beta = np.linalg.lstsq(np.tensordot(w, xtx, 1), w @ xty, rcond=None)[0]
        roots = _roots(fine, bfine @ beta[p:])
        done += 1
        if roots:
            found.append(min(roots, key=lambda r: abs(r - root)))
    tail = (1.0 - level) / 2.0
    missing = done - len(found)
    if not found:
        return float(fine[0]), float(fine[-1]), True, True, done
    lo, hi = np.quantile(found, [tail, 1.0 - tail])
    open_end = missing / max(done, 1) > tail
    return float(lo), float(hi), open_end, open_end, done
