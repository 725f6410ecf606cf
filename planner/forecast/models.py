"""The candidate demand models: fit once, predict from any origin with the parameters fixed.

``naive`` / ``snaive`` (FPP3 §5.5), statsmodels ETS with additive errors (FPP3 §8), and
SARIMAX regressions on [1, t] (+ daily Fourier terms, FPP3 §12.1) with AR(1) errors, each
fitted on a series scaled to mean |y| = 1. Intervals treat parameters as known and errors as
Gaussian; the backtest checks them. Fit warnings are recorded, never raised.

Method: planner/forecast/METHODS.md#models
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd

from core.errors import ConfigError

if TYPE_CHECKING:
    import numpy.typing as npt

    FloatArray = npt.NDArray[np.float64]

Family = Literal["naive", "ets", "sarimax"]
FOURIER_PAIRS = 3
MIN_TRAIN_NONSEASONAL = 16  # ETS heuristic needs 10; AR(1) + 2 regression states want more
ETS_MAXITER = 200
SARIMAX_MAXITER = 50


@dataclass(frozen=True, slots=True)
class ModelSpec:
    key: str
    label: str
    family: Family
    seasonal: bool
    trend: bool = False
    damped: bool = False


SPECS: dict[str, ModelSpec] = {
    s.key: s
    for s in (
        ModelSpec("naive", "naive", "naive", seasonal=False),
        ModelSpec("snaive", "seasonal naive", "naive", seasonal=True),
        ModelSpec("ets_AAdN", "ETS(A,Ad,N)", "ets", seasonal=False, trend=True, damped=True),
        ModelSpec("ets_AAN", "ETS(A,A,N)", "ets", seasonal=False, trend=True),
        ModelSpec("ets_AAdA", "ETS(A,Ad,A)", "ets", seasonal=True, trend=True, damped=True),
        ModelSpec("ets_AAA", "ETS(A,A,A)", "ets", seasonal=True, trend=True),
        ModelSpec("sarimax", "SARIMAX(1,0,0)+[1,t]", "sarimax", seasonal=False),
        ModelSpec(
            "sarimax_fourier",
            f"SARIMAX(1,0,0)+[1,t,Fourier K={FOURIER_PAIRS}]",
            "sarimax",
            seasonal=True,
        ),
    )
}
# Cheapest first: when the time budget runs out, what is left is the simpler model.
DEFAULT_SEASONAL = ("snaive", "ets_AAdN", "ets_AAdA", "ets_AAA", "sarimax_fourier")
DEFAULT_NONSEASONAL = ("naive", "ets_AAdN", "ets_AAN", "sarimax")


def spec_of(key: str) -> ModelSpec:
    if key not in SPECS:
        raise ConfigError(f"models: unknown model {key!r}; known: {', '.join(SPECS)}")
    return SPECS[key]


def min_train(spec: ModelSpec, period: int | None) -> int:
    """Fewest points a fit needs: two full seasons when seasonal (ETS heuristic's rule)."""
    if spec.seasonal and period:
        return max(2 * period, 10 + 2 * (period // 2), MIN_TRAIN_NONSEASONAL)
    return MIN_TRAIN_NONSEASONAL


@contextmanager
def recorded(tag: str, sink: list[str]) -> Iterator[None]:
    """Record (not raise, not drop) every warning emitted inside, prefixed with ``tag``.

    Every occurrence is kept; planner.forecast.demand collapses repeats into one line with a count.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:  # keep what was said before a fit failed, too
            sink.extend(f"{tag}: {w.category.__name__}: {w.message}" for w in caught)


@dataclass(slots=True)
class Fitted:
    """A fitted candidate: what ``predict`` needs to forecast from any origin."""

    spec: ModelSpec
    period: int | None
    start_epoch: float  # epoch of point 0 (Fourier terms use absolute UTC time of day)
    cadence_s: float
    train_points: int
    params: Any = None
    sigma: float = 0.0
    fit_seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)


def _exog(f: Fitted, first: int, count: int) -> FloatArray:
    j = np.arange(first, first + count, dtype=np.float64)
    cols = [np.ones(count), j / max(f.train_points, 1)]
    if f.spec.seasonal and f.period:
        phase = 2 * np.pi * (((f.start_epoch + j * f.cadence_s) % 86_400.0) / 86_400.0)
        for k in range(1, FOURIER_PAIRS + 1):
            cols += [np.sin(k * phase), np.cos(k * phase)]
    return np.column_stack(cols)


def _ets_model(spec: ModelSpec, y: FloatArray, period: int | None) -> Any:
    from statsmodels.tsa.exponential_smoothing.ets import ETSModel  # noqa: PLC0415 - start-up: statsmodels (~0.7 s) loads when this fit runs, not on `import planner.plan`

    seasonal = spec.seasonal and bool(period)
    return ETSModel(
        pd.Series(y),  # a pandas index: get_prediction fails on bare arrays in 0.15
        error="add",
        trend="add" if spec.trend else None,
        damped_trend=spec.damped,
        seasonal="add" if seasonal else None,
        seasonal_periods=period if seasonal else None,
        initialization_method="heuristic",
    )


def _sarimax_model(f: Fitted, y: FloatArray) -> Any:
    from statsmodels.tsa.statespace.sarimax import SARIMAX  # noqa: PLC0415 - start-up: statsmodels (~0.7 s) loads when this fit runs, not on `import planner.plan`

    return SARIMAX(
        y,
        exog=_exog(f, 0, len(y)),
        order=(1, 0, 0),
        trend="n",
        mle_regression=False,
        concentrate_scale=True,
    )


def fit(
    spec: ModelSpec, y: FloatArray, *, period: int | None, start_epoch: float, cadence_s: float
) -> Fitted:
    """Estimate ``spec`` on ``y`` (scaled); warnings go to ``Fitted.warnings``."""
    f = Fitted(spec, period, start_epoch, cadence_s, len(y))
    t0 = time.perf_counter()
    with recorded(f"{spec.label} fit on {len(y)} points", f.warnings):
        if spec.family == "naive":
            lag = period if (spec.seasonal and period) else 1
            d = y[lag:] - y[:-lag]
            f.sigma = float(np.sqrt(np.mean(d * d))) if d.size else 0.0
        elif spec.family == "ets":
            res = _ets_model(spec, y, period).fit(disp=False, maxiter=ETS_MAXITER)
            f.params = np.asarray(res.params, dtype=np.float64)
        else:
            f.params = _sarimax_model(f, y).fit(disp=False, maxiter=SARIMAX_MAXITER)
    f.fit_seconds = time.perf_counter() - t0
    return f


def predict(
    f: Fitted, y: FloatArray, steps: int, level: float
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Mean and ``level`` interval for the ``steps`` buckets after ``y`` (params fixed)."""
    alpha = 1.0 - level
    n = len(y)
    with recorded(f"{f.spec.label} forecast", f.warnings):
        if f.spec.family == "naive":
            z = NormalDist().inv_cdf(1.0 - alpha / 2.0)
            h = np.arange(steps)
            if f.spec.seasonal and f.period:
                m = f.period
                mean = y[n - m + (h % m)]
                sd = f.sigma * np.sqrt(h // m + 1.0)
            else:
                mean = np.full(steps, y[-1])
                sd = f.sigma * np.sqrt(h + 1.0)
            return mean, mean - z * sd, mean + z * sd
        if f.spec.family == "ets":
            res = _ets_model(f.spec, y, f.period).smooth(f.params)
            frame = res.get_prediction(start=n, end=n + steps - 1).summary_frame(alpha=alpha)
            cols = ("mean", "pi_lower", "pi_upper")
        else:
            res = f.params.apply(y, exog=_exog(f, 0, n))
            fc = res.get_forecast(steps, exog=_exog(f, n, steps))
            frame = fc.summary_frame(alpha=alpha)
            cols = ("mean", "mean_ci_lower", "mean_ci_upper")
    mean, lo, hi = (np.asarray(frame[c], dtype=np.float64) for c in cols)
    return mean, lo, hi


def crossing_probability(
    f: Fitted, y: FloatArray, steps: int, threshold: float, *, seed: int, paths: int = 1000
) -> float | None:
    """Share of simulated paths (seeded) that reach ``threshold`` within ``steps``.

    Paths follow the fitted model with its parameters fixed, Gaussian errors; None when the
    model cannot simulate (recorded as a warning).
    """
    rng = np.random.default_rng(seed)
    n = len(y)
    with recorded(f"{f.spec.label} simulation of {paths} paths", f.warnings):
        if f.spec.family == "naive":
            eps = rng.standard_normal((steps, paths)) * f.sigma
            if f.spec.seasonal and f.period:
                m = f.period
                h = np.arange(steps)
                base = y[n - m + (h % m)][:, None]
                sims = _seasonal_walk(base, eps, m)
            else:
                sims = y[-1] + eps.cumsum(axis=0)
        elif f.spec.family == "ets":
            res = _ets_model(f.spec, y, f.period).smooth(f.params)
            sims = np.asarray(res.simulate(steps, anchor="end", repetitions=paths, rng=rng))
        else:
            res = f.params.apply(y, exog=_exog(f, 0, n))
            sims = np.asarray(
                res.simulate(
                    steps, anchor="end", repetitions=paths, exog=_exog(f, n, steps), rng=rng
                )
            ).reshape(steps, paths)
    if sims.shape != (steps, paths) or not np.isfinite(sims).all():
        f.warnings.append(f"{f.spec.label}: simulation gave no usable paths")
        return None
    return float(np.mean((sims >= threshold).any(axis=0)))


def _seasonal_walk(base: FloatArray, eps: FloatArray, m: int) -> FloatArray:
    """Seasonal random walk: y[h] = y[h - m] + eps[h], started from the last season."""
    out = base + eps
    for h in range(m, len(out)):
        out[h] = out[h - m] + eps[h]
    return out
