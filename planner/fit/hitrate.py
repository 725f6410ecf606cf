"""LMCache L1 hit rate vs cache size: what hit rate would another size give, and what size
reaches a target?

Model
-----
For window i with L1 bytes in use C_i and token hit ratio h_i (hit / requested tokens),

    h_i = h_max · (1 − exp(−C_i / C0)) + ε_i ,

a saturating curve: h_max is the hit ratio an unbounded L1 would reach for this workload,
C0 the size scale (63 % of h_max at C0). The size that reaches a fraction q of h_max is
C_q = C0 · (−ln(1 − q)); the size for an absolute target h* < h_max is −C0·ln(1 − h*/h_max).

Estimator and uncertainty
-------------------------
Weighted nonlinear least squares (scipy ``least_squares``, trust-region, at most
``max_nfev`` evaluations) in θ = (logit h_max, log C0), weights = requested tokens of the
window (normalised), started from the best of a grid of C0 with h_max solved in closed form.
Covariance: sandwich (robust to the binomial-type heteroscedasticity and overdispersion of
token hits) — clustered by engine with ≥ 10 engines, HC1 per window otherwise. Intervals:
Wald on θ (so h_max stays in (0, 1) and C0 > 0), predictions by the delta method on the
logit scale; C_q's interval is exactly the rescaled interval of C0.

Assumptions
-----------
L1 *usage* stands in for the L1 *size*: it equals the capacity only when the cache is full
(windows with evictions; ``only_evicting=True`` keeps just those). While a cache warms up,
usage and hit rate rise together in time, so workload drift can masquerade as a size
effect. One curve for every engine pooled; windows independent unless clustered.

The data cannot tell when sizes barely vary, when C0 is not pinned down (its interval
spans more than a factor of 100: the cache is past saturation or the curve is flat), or
when the requested size lies far beyond the largest size observed (> 4×).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.fit.common import (
    MIN_CLUSTERS,
    Estimate,
    FitResult,
    Interval,
    check_level,
    engine_groups,
    fmt,
    nan_interval,
    recorded_warnings,
    require_history,
    sandwich,
    t_quantile,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pandas as pd

    Array = npt.NDArray[np.float64]

WHAT = "LMCache L1 hit-rate curve"


@dataclass(frozen=True, slots=True)
class HitPrediction:
    """Predicted hit ratio at one L1 size; ``extrapolated`` outside the sizes observed."""

    size_bytes: float
    hit_ratio: float
    interval: Interval
    extrapolated: bool


@dataclass(frozen=True, slots=True)
class HitRateFit(FitResult):
    """``estimate`` = L1 bytes reaching ``target_fraction`` of h_max."""

    h_max: Estimate
    c0_bytes: Estimate
    target_fraction: float
    size_for_target_hit: Estimate | None  # for an absolute target hit ratio, when asked
    predictions: tuple[HitPrediction, ...]
    size_range: tuple[float, float]
    evicting_share: float  # share of windows with L1 evictions (usage = capacity)
    cov_type: str


def fit_hitrate(
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
    max_nfev: int = 200,
) -> HitRateFit:
    """Fit the saturating hit-rate curve (module docstring).

    ``sizes``: L1 sizes (bytes) to predict at (default: quartiles of the observed sizes
    and 2× / 4× the largest). Raises InsufficientHistory below ``min_windows`` windows.
    """
    import numpy as np

    from collector.errors import ConfigError

    check_level(level)
    if not 0.0 < target_fraction < 1.0:
        raise ConfigError(f"target_fraction must be in (0, 1), got {target_fraction}")
    if target_hit is not None and not 0.0 < target_hit < 1.0:
        raise ConfigError(f"target_hit must be in (0, 1), got {target_hit}")
    data = _usable(frame, size, hit)
    ev = data["l1_evicted_chunks"] if "l1_evicted_chunks" in data.columns else None
    evicting = (ev > 0).to_numpy() if ev is not None else np.zeros(len(data), dtype=bool)
    if only_evicting:
        data, evicting = data[evicting], evicting[evicting]
    require_history(WHAT, len(data), min_windows)
    c = data[size].to_numpy(dtype=float)
    h = data[hit].to_numpy(dtype=float)
    w = data[weight].to_numpy(dtype=float) if weight in data.columns else np.ones(len(data))
    w = np.where(np.isfinite(w) & (w > 0), w, 1.0)
    w = w / w.mean()
    groups = engine_groups(data)
    n_eng = int(np.unique(groups).size)
    cov_type = "cluster" if n_eng >= MIN_CLUSTERS else "HC1"
    n = len(data)
    c_max = float(c.max())
    out: dict[str, Any] = {
        "what": WHAT, "unit": "bytes", "n": n, "cov_type": cov_type,
        "method": f"weighted NLS h = h_max(1 − exp(−C/C0)), weights = requested tokens; "
                  f"{cov_type} sandwich, Wald on (logit h_max, log C0)",
        "assumptions": (
            "L1 usage stands in for L1 size (equal only while evicting)",
            "cache warm-up can confound size with time",
            "one curve for all engines pooled",
        ),
        "basis": (
            f"{n} windows from {n_eng} engines; L1 usage [{fmt(c.min())}, {fmt(c_max)}] bytes",
            f"hit ratio [{fmt(h.min())}, {fmt(h.max())}]; {float(evicting.mean()):.0%} of "
            "windows evicting",
        ),
        "target_fraction": target_fraction, "size_range": (float(c.min()), c_max),
        "evicting_share": float(evicting.mean()), "size_for_target_hit": None,
    }  # fmt: skip
    nan_est = Estimate(math.nan, nan_interval(level))
    if float(np.std(c) / max(np.mean(c), 1e-300)) < 0.05:
        return HitRateFit(
            **out, estimate=math.nan, interval=nan_interval(level), warnings=(),
            can_tell=False, why="L1 usage barely varies (CV < 0.05): no curve can be fitted",
            h_max=nan_est, c0_bytes=nan_est, predictions=(),
        )  # fmt: skip
    with recorded_warnings() as caught:
        theta, jac_fn = _fit(c, h, w, max_nfev)
        f, jac = jac_fn(theta, c)
        cov = sandwich(jac, h - f, w, groups if cov_type == "cluster" else None)
        eig = np.linalg.eigvalsh((jac * w[:, None]).T @ jac)
    if not eig.min() > 1e-9 * max(eig.max(), 1e-300):
        # A (near-)zero direction of the information: the curve is flat in C0 (or h_max).
        return HitRateFit(
            **out, estimate=math.nan, interval=nan_interval(level), warnings=tuple(caught),
            can_tell=False, why="the size scale C0 is not pinned down: the hit ratio is flat "
            f"over the L1 usage seen ([{fmt(c.min())}, {fmt(c_max)}] bytes, past saturation "
            "or independent of size)", h_max=nan_est, c0_bytes=nan_est, predictions=(),
        )  # fmt: skip
    tq = t_quantile(level, n_eng - 1 if cov_type == "cluster" else n - 2)
    se = np.sqrt(np.maximum(np.diag(cov), 0.0))
    eta, lam = float(theta[0]), float(theta[1])
    h_max = Estimate(_expit(eta), Interval(_expit(eta - tq * se[0]), _expit(eta + tq * se[0]),
                                           level))  # fmt: skip
    c0 = Estimate(_exp(lam), Interval(_exp(lam - tq * se[1]),
                                          _exp(lam + tq * se[1]), level), "bytes")  # fmt: skip
    q = -math.log(1.0 - target_fraction)
    grid = sorted(set(sizes)) if sizes is not None else [
        *np.quantile(c, [0.25, 0.5, 0.75]).tolist(), 2 * c_max, 4 * c_max]  # fmt: skip
    with recorded_warnings() as more:
        preds = _predict(
            np.asarray(grid, dtype=float), theta, cov, tq=tq, level=level, lo=c.min(), hi=c_max
        )
        if target_hit is not None:
            out["size_for_target_hit"] = _size_for(target_hit, theta, cov, tq, level)
    caught.extend(more)
    why = ""
    if c0.interval.hi / c0.interval.lo > 100:
        why = (f"the size scale C0 is not pinned down ({level:.0%} interval "
               f"[{fmt(c0.interval.lo)}, {fmt(c0.interval.hi)}] bytes): the sizes seen are "
               "past saturation or the hit rate does not depend on them")  # fmt: skip
    elif c0.value * q > 4 * c_max:
        why = (f"the size for {target_fraction:.0%} of h_max ({fmt(c0.value * q)} bytes) "
               f"is beyond 4× the largest L1 usage seen ({fmt(c_max)})")  # fmt: skip
    return HitRateFit(
        **out,
        estimate=c0.value * q,
        interval=Interval(c0.interval.lo * q, c0.interval.hi * q, level),
        warnings=tuple(caught),
        can_tell=not why,
        why=why,
        h_max=h_max,
        c0_bytes=c0,
        predictions=preds,
    )


def _usable(frame: pd.DataFrame, size: str, hit: str) -> pd.DataFrame:
    if not {size, hit} <= set(frame.columns):
        return frame.iloc[0:0]
    data = frame.dropna(subset=[size, hit])
    return data[(data[size] > 0) & (data[hit] >= 0) & (data[hit] <= 1)]


def _exp(x: float) -> float:
    """exp that saturates to inf instead of raising OverflowError."""
    return math.exp(x) if x < 709.0 else math.inf


def _expit(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x > -700 else 0.0


def hit_ratio(size_bytes: Array, h_max: float, c0_bytes: float) -> Array:
    """The curve h(C) = h_max · (1 − exp(−C / C0)) at L1 sizes C (bytes): the one place it
    is written (the fit, the plan's curve and the plot evaluate it here)."""
    import numpy as np

    return h_max * (1.0 - np.exp(-size_bytes / c0_bytes))


def _model(theta: Array, c: Array) -> tuple[Array, Array]:
    """Curve values and Jacobian wrt (logit h_max, log C0)."""
    import numpy as np

    hm = 1.0 / (1.0 + np.exp(-theta[0]))
    c0 = np.exp(theta[1])
    f = hit_ratio(c, hm, c0)
    e = np.exp(-c / c0)
    jac = np.column_stack([hm * (1.0 - hm) * (1.0 - e), -hm * e * c / c0])
    return f, jac


def _fit(c: Array, h: Array, w: Array, max_nfev: int) -> tuple[Array, Any]:
    import numpy as np
    from scipy.optimize import least_squares

    sw = np.sqrt(w)
    best: tuple[float, float, float] | None = None
    for c0 in np.quantile(c, [0.05, 0.25, 0.5, 0.75, 0.95])[:, None] * [0.1, 0.3, 1.0, 3.0]:
        for cc in c0:
            s = 1.0 - np.exp(-c / cc)
            hm = float(np.clip(np.sum(w * h * s) / max(np.sum(w * s * s), 1e-300), 1e-4, 0.9999))
            sse = float(np.sum(w * (h - hm * s) ** 2))
            if best is None or sse < best[0]:
                best = (sse, hm, float(cc))
    assert best is not None
    start = np.array([math.log(best[1] / (1 - best[1])), math.log(best[2])])
    res = least_squares(
        lambda th: sw * (h - _model(th, c)[0]),
        start,
        jac=lambda th: -sw[:, None] * _model(th, c)[1],
        method="trf",
        max_nfev=max_nfev,
        x_scale="jac",
    )
    return np.asarray(res.x, dtype=float), _model


def _predict(
    sizes: Array, theta: Array, cov: Array, *, tq: float, level: float, lo: float, hi: float
) -> tuple[HitPrediction, ...]:
    import numpy as np

    f, jac = _model(theta, sizes)
    f = np.clip(f, 1e-12, 1 - 1e-12)
    g = jac / (f * (1.0 - f))[:, None]  # gradient of logit(f)
    se = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", g, cov, g), 0.0))
    lg = np.log(f / (1.0 - f))
    return tuple(
        HitPrediction(
            size_bytes=float(sizes[i]),
            hit_ratio=float(f[i]),
            interval=Interval(
                _expit(float(lg[i] - tq * se[i])), _expit(float(lg[i] + tq * se[i])), level
            ),
            extrapolated=bool(sizes[i] < lo or sizes[i] > hi),
        )
        for i in range(sizes.size)
    )


def _size_for(target: float, theta: Array, cov: Array, tq: float, level: float) -> Estimate:
    """Size for an absolute hit ratio: −C0·ln(1 − h*/h_max); delta method on its log."""
    import numpy as np

    hm = _expit(float(theta[0]))
    if target >= hm:
        return Estimate(math.inf, Interval(math.nan, math.inf, level), "bytes")
    r = target / hm
    ln = -math.log(1.0 - r)
    log_size = float(theta[1]) + math.log(ln)
    # d log(size)/d eta = d/d eta log(-ln(1 - t/hm)); dhm/deta = hm(1-hm).
    d_eta = (-(r / (1.0 - r)) / ln) * (1.0 - hm)
    grad = np.array([d_eta, 1.0])
    se = math.sqrt(max(float(grad @ cov @ grad), 0.0))
    return Estimate(
        _exp(log_size),
        Interval(_exp(log_size - tq * se), _exp(log_size + tq * se), level),
        "bytes",
    )
