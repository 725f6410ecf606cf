"""Demand forecast: KV tokens in use or request rate, with intervals, backtest and saturation.

How a forecast is made (each step is stated again in ``Forecast.assumptions``):

1. History (planner/forecast_data.py): resampled to UTC-aligned buckets, hourly with a daily
   season (period 24) when >= 2 full days are available, else 15/5/1-min buckets and no
   season; short gaps interpolated, history before a long gap dropped; < 24 points raise
   InsufficientHistory(what, 24, available).
2. Candidates (planner/forecast_models.py), cheapest first: (seasonal) naive, ETS(A,Ad,N),
   ETS(A,A,N) or the seasonal ETS(A,Ad,A)/(A,A,A), and a SARIMAX regression with AR(1)
   errors (+ daily Fourier terms when seasonal).
3. Rolling-origin backtest (Tashman 2000), the same origins for every candidate: parameters
   are estimated once on the data before the first origin, then each origin re-filters the
   states on the data up to it (no look-ahead) and forecasts the next ``h_b`` buckets, with
   ``h_b`` = the forecast horizon when the history allows, halved until >= 3 origins fit.
   Scores pool every (origin, step): interval coverage, MAPE (withheld when actuals come
   near 0), MASE (scaled by the in-sample (seasonal) naive MAE, Hyndman & Koehler 2006) and
   the interval score (Gneiting & Raftery 2007, eq. 43), which rewards narrow intervals and
   penalises misses. The model with the lowest mean interval score wins; AIC is not used
   (ETS and SARIMAX likelihoods here are not comparable).
4. The winner is refitted on all the history and forecasts ``horizon_s``; intervals at
   ``level`` are clipped at 0 (demand is non-negative) and that is noted (the backtest
   scores the clipped intervals, i.e. what is reported).
5. Saturation (``capacity`` given): the point forecast is placed at bucket midpoints and
   linearly interpolated; ``time_to_saturation_s`` is when it first reaches capacity,
   ``_lo_s`` when the upper bound does (at that time P(demand >= capacity) reaches
   (1-level)/2) and ``_hi_s`` when the lower bound does (P reaches (1+level)/2); these are
   crossings of the pointwise band, not quantiles of a first-passage time. None with a note
   when not within the horizon; 0 when the last observed bucket is already at capacity.
   ``saturation_probability`` is the share of 1000 simulated paths of the fitted model
   (seeded by ``seed``, parameters fixed) that reach capacity within the horizon.

Budget: ``max_seconds`` bounds the work (statsmodels' one-off import excluded): once half of
it is spent no further candidate is tried (the simpler ones already scored stay), and the
simulation is skipped past 80 %. Each optimiser is capped (maxiter 200 ETS, 50 SARIMAX).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from collector.errors import ConfigError, InsufficientHistory
from planner.forecast_data import (
    MIN_POINTS,
    SeriesError,
    demand_series_from_windows,
    prepare,
)
from planner.forecast_models import (
    DEFAULT_NONSEASONAL,
    DEFAULT_SEASONAL,
    Fitted,
    ModelSpec,
    crossing_probability,
    fit,
    min_train,
    predict,
    spec_of,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pandas as pd

    FloatArray = npt.NDArray[np.float64]

__all__ = [
    "CandidateScore",
    "Forecast",
    "SeriesError",
    "demand_series_from_windows",
    "forecast_demand",
]

MAX_ORIGINS = 24
MIN_ORIGINS = 3
BACKTEST_TARGET_POINTS = 60
MAX_HORIZON_STEPS = 10_000
SIMULATED_PATHS = 1000


@dataclass(frozen=True, slots=True)
class CandidateScore:
    """One candidate's rolling-origin backtest (all candidates share the same origins)."""

    method: str
    status: str  # "chosen", "scored", "failed: ...", "skipped: ..."
    interval_score: float | None = None  # mean, in the series' units (lower is better)
    coverage: float | None = None
    mape: float | None = None
    mase: float | None = None
    fit_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Forecast:
    """A demand forecast with its intervals, its backtest and what it rests on."""

    what: str
    method: str
    cadence_s: float
    seasonal_period: int | None
    level: float
    origin_epoch: float  # end of the last observed bucket; points follow it
    points: tuple[tuple[float, float, float, float], ...]  # (bucket start, mean, lo, hi)
    backtest_coverage: float | None
    backtest_mape: float | None  # percent; None when actuals come near 0 (see backtest_mase)
    backtest_mase: float | None
    backtest_origins: int
    backtest_horizon_steps: int
    backtest_points: int
    capacity: float | None
    time_to_saturation_s: float | None
    time_to_saturation_lo_s: float | None  # earliest: the upper bound reaches capacity
    time_to_saturation_hi_s: float | None  # latest: the lower bound reaches capacity
    saturation_probability: float | None
    saturation_note: str
    history_points: int
    raw_points: int
    candidates: tuple[CandidateScore, ...]
    warnings: tuple[str, ...]
    assumptions: tuple[str, ...]
    fit_seconds: float
    seed: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (non-finite floats become None)."""
        return _json_safe(asdict(self))  # type: ignore[no-any-return]


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_safe(v) for v in obj]
    return obj


def plan_backtest(n: int, steps: int, train_min: int) -> tuple[int, list[int]]:
    """(h_b, origins): origins are the indices of the first held-out point, ascending."""
    hb = min(steps, n - train_min)
    while hb >= 1:
        spacing = max(1, hb // 2)
        wanted = min(MAX_ORIGINS, max(5, math.ceil(BACKTEST_TARGET_POINTS / hb)))
        k = min(wanted, (n - train_min - hb) // spacing + 1)
        if k >= MIN_ORIGINS or hb == 1:
            return hb, [n - hb - i * spacing for i in reversed(range(k))]
        hb //= 2
    return 0, []


@dataclass(frozen=True, slots=True)
class _Scores:
    interval_score: float
    coverage: float
    mape: float | None
    mase: float | None
    points: int


def _backtest(
    f: Fitted, y: FloatArray, *, origins: list[int], hb: int, level: float, mase_den: float
) -> _Scores:
    import numpy as np

    alpha = 1.0 - level
    actual, mean, lo, hi = [], [], [], []
    for o in origins:
        m, lower, upper = predict(f, y[:o], hb, level)
        actual.append(y[o : o + hb])
        mean.append(np.maximum(m, 0.0))
        lo.append(np.maximum(lower, 0.0))
        hi.append(np.maximum(upper, 0.0))
    a, m_, lo_, hi_ = (np.concatenate(x) for x in (actual, mean, lo, hi))
    if not (np.isfinite(m_).all() and np.isfinite(lo_).all() and np.isfinite(hi_).all()):
        raise SeriesError(f"{f.spec.label}: non-finite forecast in the backtest")
    score = (hi_ - lo_) + (2 / alpha) * ((lo_ - a) * (a < lo_) + (a - hi_) * (a > hi_))
    err = np.abs(a - m_)
    abs_a = np.abs(a)
    near_zero = abs_a.min() < 0.05 * max(abs_a.mean(), 1e-12)
    return _Scores(
        interval_score=float(score.mean()),
        coverage=float(np.mean((a >= lo_) & (a <= hi_))),
        mape=None if near_zero else float(100 * np.mean(err / abs_a)),
        mase=float(err.mean() / mase_den) if mase_den > 0 else None,
        points=len(a),
    )


def _crossing(prev: float, values: FloatArray, capacity: float, cadence: float) -> float | None:
    """Seconds after the origin when the midpoint-interpolated ``values`` reach capacity."""
    for j, v in enumerate(values):
        if v >= capacity:
            before = prev if j == 0 else float(values[j - 1])
            frac = 1.0 if v == before else (capacity - before) / (v - before)
            return max(0.0, (j - 0.5 + min(max(frac, 0.0), 1.0)) * cadence)
    return None


def _collapse(lines: list[str]) -> tuple[str, ...]:
    """Repeated warnings (one per backtest origin) as one line with a count, first-seen order."""
    counts: dict[str, int] = {}
    for line in lines:
        counts[line] = counts.get(line, 0) + 1
    return tuple(line if c == 1 else f"{line} (x{c})" for line, c in counts.items())


def _hours(s: float | None) -> str:
    return "not within the horizon" if s is None else f"in {s / 3600:.1f} h"


def forecast_demand(
    series: pd.Series,
    *,
    horizon_s: float,
    capacity: float | None = None,
    level: float = 0.9,
    seed: int = 0,
    max_seconds: float = 10.0,
    what: str = "kv_tokens",
    models: tuple[str, ...] | None = None,
    agg: str = "mean",
) -> Forecast:
    """Forecast ``series`` ``horizon_s`` ahead; see the module docstring for the method.

    ``models`` restricts the candidates (keys of planner.forecast_models.SPECS, e.g.
    ``("snaive",)`` for the baseline); ``agg="max"`` models each bucket's peak instead of
    its mean (saturation happens at peaks). The horizon is rounded up to whole buckets.
    Raises InsufficientHistory, SeriesError or ConfigError (bad argument).
    """
    import numpy as np

    # statsmodels' first import takes 1-3 s: a one-off process cost, kept out of the budget.
    import statsmodels.tsa.exponential_smoothing.ets
    import statsmodels.tsa.statespace.sarimax  # noqa: F401

    t_start = time.perf_counter()
    if not (horizon_s > 0 and math.isfinite(horizon_s)):
        raise ConfigError(f"horizon_s must be a positive number of seconds, got {horizon_s!r}")
    if not 0 < level < 1:
        raise ConfigError(f"level must be in (0, 1), got {level!r}")
    if not max_seconds > 0:
        raise ConfigError(f"max_seconds must be > 0, got {max_seconds!r}")
    if capacity is not None and not (capacity > 0 and math.isfinite(capacity)):
        raise ConfigError(f"capacity must be a positive number, got {capacity!r}")
    if agg not in ("mean", "max"):
        raise ConfigError(f"agg must be 'mean' or 'max', got {agg!r}")
    prep = prepare(series, what=what, agg=agg)
    cad, n = prep.cadence_s, len(prep.values)
    steps = math.ceil(horizon_s / cad)
    if steps > MAX_HORIZON_STEPS:
        raise ConfigError(
            f"horizon_s={horizon_s:g} is {steps} steps of {cad:g} s; at most {MAX_HORIZON_STEPS}"
        )
    scale = float(np.mean(np.abs(prep.values))) or 1.0
    y = prep.values / scale
    period = prep.seasonal_period
    specs = [spec_of(k) for k in (models or (DEFAULT_SEASONAL if period else DEFAULT_NONSEASONAL))]
    assumptions = list(prep.notes)
    span_h = n * cad / 3600
    assumptions.append(
        f"modelled as {cad:g} s buckets (the {agg} of the raw points in each, UTC-aligned); "
        f"a point t covers [t, t + {cad:g} s)"
    )
    hb, origins = plan_backtest(n, steps, max(min_train(s, period) for s in specs))
    if period and not origins:
        specs = [s for s in specs if not s.seasonal] or [spec_of("naive")]
        assumptions.append("seasonal models dropped: no room to backtest two full days")
        hb, origins = plan_backtest(n, steps, max(min_train(s, None) for s in specs))
    if not origins:
        raise InsufficientHistory(f"{what} forecast backtest at {cad:g} s", MIN_POINTS + 1, n)
    if period and any(s.seasonal for s in specs):
        assumptions.append(
            f"daily seasonality (period {period} at {cad:g} s) considered: "
            f"{span_h / 24:.1f} days of history >= 2 full days"
        )
    else:
        assumptions.append(
            f"no seasonality modelled: {span_h:.1f} h of history"
            + (" < 2 full days" if span_h < 48 else "")
        )
    lag = period if period and any(s.seasonal for s in specs) else 1
    train = y[: origins[0]]
    mase_den = float(np.mean(np.abs(train[lag:] - train[:-lag]))) if len(train) > lag else 0.0

    scored: list[tuple[float, int, ModelSpec, CandidateScore, _Scores]] = []
    rows: list[CandidateScore] = []
    warns: list[str] = []
    for i, spec in enumerate(specs):
        label = spec.label
        if scored and time.perf_counter() - t_start > 0.5 * max_seconds:
            rows.append(CandidateScore(label, f"skipped: over half of max_seconds={max_seconds}"))
            continue
        f = Fitted(spec, period, prep.start, cad, 0)
        try:
            f = fit(spec, train, period=period, start_epoch=prep.start, cadence_s=cad)
            sc = _backtest(f, y, origins=origins, hb=hb, level=level, mase_den=mase_den)
        except Exception as exc:  # loop boundary: one failed candidate must not sink the rest
            warns.extend(f.warnings)
            warns.append(f"{label} failed: {type(exc).__name__}: {exc}")
            rows.append(CandidateScore(label, f"failed: {type(exc).__name__}: {exc}"))
            continue
        warns.extend(f.warnings)
        row = CandidateScore(
            label,
            "scored",
            sc.interval_score * scale,
            sc.coverage,
            sc.mape,
            sc.mase,
            round(f.fit_seconds, 4),
        )
        rows.append(row)
        scored.append((sc.interval_score, i, spec, row, sc))
    if not scored:
        raise SeriesError(f"{what}: no candidate model could be fitted ({warns[-1]})")
    scored.sort(key=lambda r: (r[0] if math.isfinite(r[0]) else math.inf, r[1]))
    final: Fitted | None = None
    for _, _, spec, row, sc in scored:
        try:
            final = fit(spec, y, period=period, start_epoch=prep.start, cadence_s=cad)
            mean, lo, hi = predict(final, y, steps, level)
        except Exception as exc:  # loop boundary: fall back to the next-best candidate
            warns.append(f"{spec.label} final fit failed ({type(exc).__name__}: {exc})")
            final = None
            continue
        if np.isfinite(mean).all() and np.isfinite(lo).all() and np.isfinite(hi).all():
            chosen, chosen_sc = row, sc
            break
        warns.append(f"{spec.label}: non-finite forecast on the full history; next best")
        final = None
    if final is None:
        raise SeriesError(f"{what}: no candidate model forecasts the full history ({warns[-1]})")
    warns.extend(final.warnings)
    rows = [CandidateScore(**{**asdict(r), "status": "chosen"}) if r is chosen else r for r in rows]
    sc = chosen_sc
    best = final.spec
    method = (
        best.label + (f" seasonal={period}" if best.seasonal and period else "") + f" @{cad:g}s"
    )
    assumptions.append(
        "chosen by the lowest mean interval score in the backtest among: "
        + ", ".join(f"{r.method} ({r.status})" for r in rows)
    )
    assumptions.append(
        f"backtest: {len(origins)} origins, {hb} steps each"
        + (f" (of the {steps} forecast)" if hb < steps else "")
        + ", parameters estimated once before the first origin, states re-filtered at each; "
        f"coverage and errors pool {sc.points} serially correlated points: indicative"
    )
    if hb < steps:
        assumptions.append(f"steps {hb + 1}..{steps} go beyond what the backtest checked")
    if steps * cad > horizon_s + 1e-6:
        assumptions.append(f"horizon rounded up to {steps} whole buckets of {cad:g} s")
    if steps * cad > n * cad:
        assumptions.append(
            f"horizon {horizon_s / 3600:.1f} h exceeds the {span_h:.1f} h history: extrapolation"
        )
    assumptions.append(
        f"intervals at {level:.0%}: Gaussian errors, parameters treated as known "
        "(no parameter uncertainty), so they can be narrow; the backtest coverage checks them"
    )
    mean, lo, hi = mean * scale, lo * scale, hi * scale
    clipped = int(np.sum(lo < 0) + np.sum(mean < 0))
    if clipped:
        assumptions.append(f"{clipped} negative bounds/means clipped to 0: demand is non-negative")
    mean, lo, hi = np.maximum(mean, 0.0), np.maximum(lo, 0.0), np.maximum(hi, 0.0)
    t_pts = prep.end + cad * np.arange(steps)
    points = tuple(
        (float(t), float(m), float(a), float(b))
        for t, m, a, b in zip(t_pts, mean, lo, hi, strict=True)
    )
    ts = ts_lo = ts_hi = prob = None
    note = "no capacity given"
    if capacity is not None:
        if agg == "mean":
            assumptions.append(
                "saturation judged on bucket means: peaks inside a bucket run higher "
                "(agg='max' forecasts the bucket peaks instead)"
            )
        if float(prep.values.max()) >= 0.95 * capacity:
            assumptions.append(
                "history reaches >= 95 % of capacity: observed usage is censored there "
                "(vLLM queues or preempts instead of exceeding it), so demand above capacity "
                "is unseen and the trend may be understated"
            )
        last = float(prep.values[-1])
        if last >= capacity:
            ts = ts_lo = ts_hi = 0.0
            prob = 1.0
            note = f"already saturated: the last bucket ({last:.6g}) >= capacity {capacity:.6g}"
        else:
            ts = _crossing(last, mean, capacity, cad)
            ts_lo = _crossing(last, hi, capacity, cad)
            ts_hi = _crossing(last, lo, capacity, cad)
            note = (
                f"reaches capacity: point forecast {_hours(ts)}, "
                f"upper bound {_hours(ts_lo)}, lower bound {_hours(ts_hi)}; "
                f"peak forecast {mean.max() / capacity:.0%} of capacity"
            )
            if time.perf_counter() - t_start < 0.8 * max_seconds:
                seen = len(final.warnings)
                prob = crossing_probability(
                    final, y, steps, capacity / scale, seed=seed, paths=SIMULATED_PATHS
                )
                warns.extend(final.warnings[seen:])
            else:
                note += "; crossing probability skipped (time budget)"
    return Forecast(
        what=what,
        method=method,
        cadence_s=cad,
        seasonal_period=period if best.seasonal else None,
        level=level,
        origin_epoch=prep.end,
        points=points,
        backtest_coverage=sc.coverage,
        backtest_mape=sc.mape,
        backtest_mase=sc.mase,
        backtest_origins=len(origins),
        backtest_horizon_steps=hb,
        backtest_points=sc.points,
        capacity=capacity,
        time_to_saturation_s=ts,
        time_to_saturation_lo_s=ts_lo,
        time_to_saturation_hi_s=ts_hi,
        saturation_probability=prob,
        saturation_note=note,
        history_points=n,
        raw_points=prep.raw_points,
        candidates=tuple(rows),
        warnings=_collapse(warns),
        assumptions=tuple(assumptions),
        fit_seconds=round(time.perf_counter() - t_start, 4),
        seed=seed,
    )
