"""Preemptions vs KV-cache pressure: where do preemptions start, and how fast do they grow?

A Poisson (or NegBin2, after Cameron & Trivedi's overdispersion test) GLM of the window's
preemptions with a hinge at the knee k in mean KV use, fitted by statsmodels on exact
sufficient statistics per (bin, window length); k by profile likelihood with a χ²₁ interval
(Feder 1975), slope and base rate by engine-clustered Wald intervals united over the knee's
interval.

Method: planner/fit/METHODS.md#preempt
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from planner.fit.common import (
    MIN_CLUSTERS,
    Estimate,
    FitResult,
    Interval,
    check_level,
    chi2_quantile,
    engine_groups,
    fmt,
    nan_interval,
    recorded_warnings,
    require_history,
    t_quantile,
)
from planner.fit.glm_irls import irls, score_and_hessian

if TYPE_CHECKING:
    import numpy.typing as npt

    Array = npt.NDArray[np.float64]

WHAT = "preemption knee"


@dataclass(frozen=True, slots=True)
class PreemptionFit(FitResult):
    """``estimate`` = the knee k (utilization where preemptions start)."""

    slope: Estimate  # b: log-rate increase per unit utilization above the knee
    base_rate: Estimate  # exp(a): preemptions per second below the knee
    family: str  # "poisson" | "negative_binomial"
    dispersion_alpha: float  # NB2 α used (0 for Poisson)
    dispersion_p: float  # one-sided p-value of the Cameron–Trivedi test
    cov_type: str  # "cluster" (CR1 by engine) | "HC0" (one engine: windows independent)
    clusters: int  # engines the cluster-robust covariance sums over (1 with HC0)
    profile: tuple[tuple[float, float], ...]  # (k, 2·(ℓ_max − ℓ_p(k))) on the grid
    util_column: str


@dataclass(frozen=True, slots=True)
class _Cells:
    """Windows collapsed by (u bin, window length[, engine]): exact statistics given the bin."""

    u: Array
    t: Array
    c: Array  # windows
    y: Array  # Σ y
    y2: Array  # Σ y²
    g: npt.NDArray[np.int64]  # engine (or -1 when not split by engine)


@dataclass(frozen=True, slots=True)
class _Windows:
    """The usable windows as arrays: utilization, preemptions, length, engine."""

    u: Array
    y: Array
    t: Array
    groups: npt.NDArray[np.int64]
    n_eng: int


@dataclass(frozen=True, slots=True)
class _Setup:
    """What is known before the knee is fitted: how, on which windows, which errors."""

    util: str
    level: float
    n: int
    method: str
    assumptions: tuple[str, ...]
    basis: tuple[str, ...]
    cov_type: str  # "cluster" | "HC0"


@dataclass(frozen=True, slots=True)
class _Knee:
    """The profile likelihood over the knee grid and the family it was profiled under."""

    cells: _Cells  # by (bin, window length, engine): for the robust covariance
    grid: Array
    lr: Array  # 2·(ℓ_max − ℓ_p(k)) at each grid point
    betas: list[Array]  # (a, b) at each grid point
    i_hat: int
    cut: float
    k_lo: float
    k_hi: float
    open_lo: bool
    open_hi: bool
    nb: bool
    a_nb: float
    p_disp: float


def fit_preemption(  # noqa: PLR0913 - keyword-only fit options with defaults
    frame: pd.DataFrame,
    *,
    util: str = "kv_util",
    count: str = "preemptions",
    exposure: str = "window_s",
    level: float = 0.95,
    min_windows: int = 120,
    grid_points: int = 161,
    bins: int = 2000,
    dispersion_alpha: float = 0.05,
    maxiter: int = 50,
) -> PreemptionFit:
    """Fit the hinge count GLM (METHODS.md#preempt) and return the knee with its interval.

    Raises :class:`core.errors.InsufficientHistory` with fewer than ``min_windows``
    windows that have ``util``, ``count`` and ``exposure``.
    """
    check_level(level)
    win = _windows(frame, util, count, exposure, min_windows=min_windows)
    u, y, n_eng = win.u, win.y, win.n_eng
    fr = _unanswered(win, util, level, bins)
    n, cov_type = fr.n, fr.cov_type
    if y.sum() == 0:
        return _cannot(
            fr,
            f"no preemptions in {n} windows: they start above the largest {util} seen "
            f"({fmt(u.max())}), if at all",
        )
    lo_k, hi_k = (float(q) for q in np.quantile(u, [0.02, 0.98]))
    if hi_k - lo_k < 1e-3:
        return _cannot(
            fr, f"{util} barely varies ({fmt(lo_k)}–{fmt(hi_k)}): no knee can be located"
        )
    with recorded_warnings() as caught:
        knee = _profile_knee(
            win, lo_k, hi_k, level=level, grid_points=grid_points, bins=bins,
            dispersion_alpha=dispersion_alpha, maxiter=maxiter,
        )  # fmt: skip
        tq = t_quantile(level, n_eng - 1 if cov_type == "cluster" else math.inf)
        a_iv, b_iv = _united_intervals(knee, tq, cluster=cov_type == "cluster")
    a_hat, b_hat = (float(v) for v in knee.betas[knee.i_hat])
    k_hat = float(knee.grid[knee.i_hat])
    slope = Estimate(b_hat, Interval(b_iv[0], b_iv[1], level), f"log-rate per unit {util}")
    base = Estimate(math.exp(a_hat), Interval(math.exp(a_iv[0]), math.exp(a_iv[1]), level), "1/s")
    why = _why_not(knee, slope, util, lo_k, hi_k)
    family = "negative_binomial" if knee.nb else "poisson"
    how = f"CR1 by engine ({n_eng} engines), t({n_eng - 1})" if cov_type == "cluster" else "HC0"
    return PreemptionFit(
        what=WHAT,
        estimate=k_hat,
        interval=Interval(knee.k_lo, knee.k_hi, level),
        unit=util,
        n=n,
        method=f"{fr.method}; {family}; slope/base rate: {how} Wald, united over knee CI",
        assumptions=fr.assumptions,
        basis=fr.basis,
        warnings=tuple(caught),
        can_tell=not why,
        why=why,
        slope=slope,
        base_rate=base,
        family=family,
        dispersion_alpha=float(knee.a_nb),
        dispersion_p=float(knee.p_disp),
        cov_type=cov_type,
        clusters=n_eng if cov_type == "cluster" else 1,
        profile=tuple(zip(knee.grid.tolist(), knee.lr.tolist(), strict=True)),
        util_column=util,
    )


def _windows(
    frame: pd.DataFrame, util: str, count: str, exposure: str, *, min_windows: int
) -> _Windows:
    """The windows with a positive length and a count, as arrays; raises
    InsufficientHistory below ``min_windows``."""
    data = _usable(frame, [util, count, exposure])
    if len(data):
        data = data[(data[exposure] > 0) & (data[count] >= 0)]
    require_history(WHAT, len(data), min_windows)
    u = data[util].to_numpy(dtype=float)
    y = data[count].to_numpy(dtype=float)
    t = data[exposure].to_numpy(dtype=float)
    groups = engine_groups(data)
    n_eng = int(groups.max()) + 1 if groups.size else 0
    return _Windows(u, y, t, groups, n_eng)


def _unanswered(win: _Windows, util: str, level: float, bins: int) -> _Setup:
    """The method, assumptions, basis and error kind (cluster by engine, or HC0 with one
    engine) before anything is fitted."""
    u, y, n_eng = win.u, win.y, win.n_eng
    n = int(y.size)
    basis = (
        f"{n} windows from {n_eng} engines",
        f"{util} in [{fmt(u.min())}, {fmt(u.max())}]; {int(y.sum())} preemptions",
    )
    method = (
        "hinge log-linear count GLM (statsmodels IRLS on exact binned statistics); "
        "knee by profile LR"
    )
    cov_type = "cluster" if n_eng >= 2 else "HC0"
    if cov_type == "HC0":
        errors = (
            "one engine: the slope and base-rate intervals treat its windows as independent "
            "(HC0; too narrow if its windows are correlated)"
        )
    elif n_eng < MIN_CLUSTERS:
        errors = (
            f"slope and base-rate errors clustered by engine ({n_eng} engines; with fewer "
            f"than {MIN_CLUSTERS} the cluster-robust errors are biased down, intervals "
            "may be too narrow)"
        )
    else:
        errors = f"slope and base-rate errors clustered by engine ({n_eng} engines)"
    assumptions = (
        "windows independent given utilization for the knee interval",
        "one knee and one slope for all engines pooled",
        f"{util} binned into {bins} bins (their mean values) before fitting",
        errors,
    )
    return _Setup(util, level, n, method, assumptions, basis, cov_type)


def _cannot(fr: _Setup, why: str) -> PreemptionFit:
    """The answer when no knee can be fitted."""
    level, util = fr.level, fr.util
    nan = Estimate(math.nan, nan_interval(level))
    return PreemptionFit(
        what=WHAT, estimate=math.nan, interval=nan_interval(level), unit=util, n=fr.n,
        method=fr.method, assumptions=fr.assumptions, basis=fr.basis, warnings=(),
        can_tell=False, why=why, slope=nan, base_rate=nan, family="none",
        dispersion_alpha=math.nan, dispersion_p=math.nan, cov_type="none", clusters=0,
        profile=(), util_column=util,
    )  # fmt: skip


def _profile_knee(
    win: _Windows, lo_k: float, hi_k: float, *, level: float, grid_points: int, bins: int,
    dispersion_alpha: float, maxiter: int,
) -> _Knee:  # fmt: skip
    """Profile the knee over [lo_k, hi_k] (Poisson, then NB2 when overdispersed), refine
    the grid near the χ²₁ cut and read the knee's interval from the profile."""
    u, y, t, groups = win.u, win.y, win.t, win.groups
    ub = _bin(u, bins)
    cells = _collapse(ub, t, y, groups, by_engine=True)
    coarse = _collapse(ub, t, y, groups, by_engine=False)
    grid = np.linspace(lo_k, hi_k, grid_points)
    prof, betas = _profile(coarse, grid, 0.0, maxiter)
    i_hat = int(np.argmax(prof))
    mu = t * np.exp(betas[i_hat][0] + betas[i_hat][1] * np.maximum(0.0, ub - grid[i_hat]))
    alpha, p_disp = _dispersion_test(y, mu)
    nb = p_disp < dispersion_alpha and alpha > 0
    a_nb = alpha if nb else 0.0
    if nb:
        prof, betas = _profile(coarse, grid, a_nb, maxiter)
    cut = chi2_quantile(level)
    # Refine: a second grid as dense over the region within the cut (+ one step).
    step = float(grid[1] - grid[0])
    near = grid[2.0 * (prof.max() - prof) <= cut + 1.0]
    fine = np.linspace(max(lo_k, near.min() - step), min(hi_k, near.max() + step), grid_points)
    fprof, fbetas = _profile(coarse, fine, a_nb, maxiter)
    grid = np.concatenate([grid, fine])
    order = np.argsort(grid, kind="stable")
    grid, prof = grid[order], np.concatenate([prof, fprof])[order]
    betas = [(betas + fbetas)[i] for i in order]
    lr = 2.0 * (prof.max() - prof)
    k_lo, k_hi, open_lo, open_hi = _interval_from_profile(grid, lr, cut)
    i_hat = int(np.argmin(lr))
    return _Knee(cells, grid, lr, betas, i_hat, cut, k_lo, k_hi, open_lo, open_hi, nb, a_nb, p_disp)


def _united_intervals(knee: _Knee, tq: float, *, cluster: bool) -> tuple[list[float], list[float]]:
    """Wald intervals of a and b (t quantile ``tq``) united over every knee inside the
    knee's interval."""
    inside = np.flatnonzero(knee.lr <= knee.cut)
    a_iv, b_iv = [math.inf, -math.inf], [math.inf, -math.inf]
    for i in inside:
        beta = knee.betas[i]
        cov = _robust_cov(knee.cells, float(knee.grid[i]), beta, knee.a_nb, cluster)
        for j, iv in ((0, a_iv), (1, b_iv)):
            se = math.sqrt(max(float(cov[j, j]), 0.0))
            iv[0] = min(iv[0], float(beta[j]) - tq * se)
            iv[1] = max(iv[1], float(beta[j]) + tq * se)
    return a_iv, b_iv


def _why_not(knee: _Knee, slope: Estimate, util: str, lo_k: float, hi_k: float) -> str:
    """Why the knee is not pinned down ("" when it is)."""
    why = ""
    if knee.open_lo or knee.open_hi:
        side = "lower" if knee.open_lo else "upper"
        why = (
            f"the knee's {side} end is not bounded by the data (the likelihood-ratio cut "
            f"is not reached inside [{fmt(lo_k)}, {fmt(hi_k)}])"
        )
        if knee.open_lo and not knee.open_hi:
            why += (
                f": the preemption rate keeps falling down to the lowest {util} seen, with "
                "no flat base rate below to put a knee on"
            )
    elif slope.interval.lo <= 0:
        why = "no detectable rise of the preemption rate above the knee (slope CI includes 0)"
    return why


def _usable(frame: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    """Rows with every column present and finite (an absent column -> no rows)."""
    if not all(c in frame.columns for c in cols):
        return frame.iloc[0:0]
    return frame.dropna(subset=cols)


def _bin(u: Array, bins: int) -> Array:
    """Each value replaced by the mean of its equal-width bin."""
    lo, hi = float(u.min()), float(u.max())
    idx = np.minimum(((u - lo) / max(hi - lo, 1e-12) * bins).astype(np.int64), bins - 1)
    sums = np.bincount(idx, weights=u, minlength=bins)
    cnt = np.bincount(idx, minlength=bins)
    means: Array = sums[idx] / cnt[idx]
    return means


def _collapse(u: Array, t: Array, y: Array, g: npt.NDArray[np.int64], by_engine: bool) -> _Cells:
    ui, uu = pd.factorize(u)
    ti, tu = pd.factorize(t)
    key = ui.astype(np.int64) * len(tu) + ti
    if by_engine:
        key = key * (int(g.max()) + 1) + g
    kc, ku = pd.factorize(key)
    c = np.bincount(kc)
    ku = np.asarray(ku, dtype=np.int64)
    ge = int(g.max()) + 1 if by_engine else 1
    cell_ut = ku // ge
    return _Cells(
        u=np.asarray(uu, dtype=float)[cell_ut // len(tu)],
        t=np.asarray(tu, dtype=float)[cell_ut % len(tu)],
        c=c.astype(float),
        y=np.bincount(kc, weights=y).astype(np.float64),
        y2=np.bincount(kc, weights=y * y).astype(np.float64),
        g=(ku % ge) if by_engine else np.full(ku.size, -1, dtype=np.int64),
    )


def _design(u: Array, k: float) -> Array:
    return np.column_stack([np.ones_like(u), np.maximum(0.0, u - k)])


def _family(alpha: float) -> Any:
    from statsmodels.genmod import families  # noqa: PLC0415 - start-up: statsmodels (~0.7 s) loads when this fit runs, not on `import planner.plan`

    return families.Poisson() if alpha == 0.0 else families.NegativeBinomial(alpha=alpha)


def _glm(cells: _Cells, k: float, alpha: float) -> dict[str, Any]:
    """The count GLM on cells at knee k, as statsmodels' ``GLM(endog, exog, family=,
    offset=, var_weights=)`` takes it: cell r holds c_r windows of length t_r with total
    count y_r; its response is the mean count y_r/c_r with ``var_weights`` c_r, so score and
    (observed) information are the sums over the c_r windows, which share
    μ_r = t_r·exp(x_r'β) (the binned covariate): the fit equals the one on the windows."""
    return {"endog": cells.y / cells.c, "exog": _design(cells.u, k), "family": _family(alpha),
            "offset": np.log(cells.t), "var_weights": cells.c}  # fmt: skip


def _fit_glm(
    cells: _Cells, k: float, alpha: float, start: Array | None, maxiter: int
) -> tuple[Array, float]:
    """Log-link Poisson (alpha=0) / NB2 GLM by statsmodels' IRLS on cells: (β, log-likelihood),
    as ``GLM(**_glm(cells, k, alpha)).fit(...)`` gives them (planner/fit/glm_irls.py: the same
    iterations without building a model at each of the profile's ~320 knees).

    The log-likelihood of cell means weighted by counts differs from the windows' by terms of
    the data (and α) alone: it compares knees on the same data, not across data sets.
    """
    if start is None:
        rate = max(float(cells.y.sum()), 0.5) / float(np.sum(cells.c * cells.t))
        start = np.array([math.log(rate), 0.0])
    # converged when β moves by < 1e-10 relative: the knees' profile differences and the
    # plan's numbers do not depend on where IRLS stopped
    return irls(**_glm(cells, k, alpha), start=start, maxiter=maxiter, atol=1e-12, rtol=1e-10)


def _profile(cells: _Cells, grid: Array, alpha: float, maxiter: int) -> tuple[Array, list[Array]]:
    prof = np.empty(grid.size)
    betas: list[Array] = []
    start = None
    for i, k in enumerate(grid):
        beta, prof[i] = _fit_glm(cells, float(k), alpha, start, maxiter)
        betas.append(beta)
        start = beta
    return prof, betas


def _robust_cov(cells: _Cells, k: float, beta: Array, alpha: float, cluster: bool) -> Array:
    """Robust covariance of β at knee k: statsmodels' cluster-robust sandwich (CR1 by
    engine, n counting windows) of the GLM on the (bin, t, engine) cells, or the HC0
    sandwich per window from per-cell score sums; built at β with no refit.

    The cluster sandwich is ``sw.cov_cluster`` of the model's ``score_obs`` and inverse
    Hessian at β (planner/fit/glm_irls.py: no model, no results object for each knee):
    what ``GLMResults(..., cov_type="cluster")`` computes; the test holds them equal.

    Method: planner/fit/METHODS.md#preempt (robust covariance on cells)
    """
    from statsmodels.stats import sandwich_covariance as sw  # noqa: PLC0415 - start-up: statsmodels (~0.7 s) loads when this fit runs, not on `import planner.plan`

    glm = _glm(cells, k, alpha)
    score_obs, hessian = score_and_hessian(**glm, params=beta)
    if cluster:
        # the engines present (cells.g holds codes 0..G-1 of engine_groups)
        ng = int(np.count_nonzero(np.bincount(cells.g)))
        n = float(cells.c.sum())
        # a cell's weighted score is exactly the sum of its windows' scores, which
        # tests/planner/test_fit_preempt.py checks against the GLM on the windows
        sandwich = (score_obs, np.linalg.inv(hessian))
        out: Array = np.asarray(sw.cov_cluster(sandwich, cells.g, use_correction=False),
                                dtype=np.float64)  # fmt: skip
        return out * (ng / (ng - 1) * (n - 1) / max(n - 2, 1))
    bread = np.linalg.pinv(hessian)
    x = glm["exog"]
    mu = cells.t * np.exp(np.minimum(x @ beta, 50.0))
    ss = (cells.y2 - 2 * mu * cells.y + cells.c * mu * mu) / (1.0 + alpha * mu) ** 2
    root = x * np.sqrt(np.maximum(ss, 0.0))[:, None]
    out = np.asarray(sw.cov_white_simple((root, bread), use_correction=False))
    return out


def _interval_from_profile(grid: Array, lr: Array, cut: float) -> tuple[float, float, bool, bool]:
    """Ends of {k : lr(k) <= cut} around the minimum, linearly interpolated."""
    i = int(np.argmin(lr))
    lo_i, hi_i = i, i
    while lo_i > 0 and lr[lo_i - 1] <= cut:
        lo_i -= 1
    while hi_i < grid.size - 1 and lr[hi_i + 1] <= cut:
        hi_i += 1
    open_lo, open_hi = lo_i == 0, hi_i == grid.size - 1

    def cross(j_in: int, j_out: int) -> float:
        x0, x1, y0, y1 = grid[j_in], grid[j_out], lr[j_in], lr[j_out]
        return float(x0 + (cut - y0) * (x1 - x0) / (y1 - y0)) if y1 != y0 else float(x0)

    k_lo = float(grid[0]) if open_lo else cross(lo_i, lo_i - 1)
    k_hi = float(grid[-1]) if open_hi else cross(hi_i, hi_i + 1)
    return k_lo, k_hi, open_lo, open_hi


def _dispersion_test(y: Array, mu: Array) -> tuple[float, float]:
    """Cameron–Trivedi auxiliary regression ((y − μ)² − y)/μ = α μ + ε (statsmodels OLS, no
    intercept): α̂ and the one-sided p-value of α = 0 (normal reference)."""
    from scipy import stats  # noqa: PLC0415 - start-up: scipy.stats (~0.6 s) loads when this runs, not on `import planner.plan`
    from statsmodels.regression.linear_model import OLS  # noqa: PLC0415 - start-up: statsmodels (~0.7 s) loads when this fit runs, not on `import planner.plan`

    z = ((y - mu) ** 2 - y) / mu
    res = OLS(z, mu[:, None]).fit()
    alpha, se = float(res.params[0]), float(res.bse[0])
    if se == 0.0:
        return alpha, 1.0 if alpha <= 0 else 0.0
    return alpha, float(stats.norm.sf(alpha / se))
