"""Demand forecast: KV tokens in use or request rate, with intervals, backtest and saturation.

History prepared (data.py), candidates fitted (models.py), ranked by a rolling-origin
backtest's interval score (backtest.py), the winner refitted and forecast with intervals
clipped at 0, and its time to saturation found (saturation.py). Deterministic: seeded draws,
work bounded by counts; ``max_seconds`` only guards, and ``Forecast.truncated`` says what it
cut.

Method: planner/forecast/METHODS.md#demand
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from core.errors import ConfigError, InsufficientHistory
from planner.domain.values import json_ready
from planner.forecast.backtest import Scores, backtest, plan_backtest
from planner.forecast.data import (
    MIN_POINTS,
    Prepared,
    SeriesError,
    demand_series_from_windows,
    prepare,
)
from planner.forecast.models import (
    DEFAULT_NONSEASONAL,
    DEFAULT_SEASONAL,
    Fitted,
    ModelSpec,
    fit,
    min_train,
    predict,
    spec_of,
)
from planner.forecast.saturation import MAX_SIM_DRAWS, Saturation, capacity_notes, saturation

if TYPE_CHECKING:
    import numpy.typing as npt
    import pandas as pd

    FloatArray = npt.NDArray[np.float64]
    Band = tuple[FloatArray, FloatArray, FloatArray]  # mean, lo, hi per bucket

__all__ = [
    "CandidateScore",
    "Forecast",
    "SeriesError",
    "demand_series_from_windows",
    "forecast_demand",
    "plan_backtest",
]

MAX_HORIZON_STEPS = 10_000


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
    saturation_paths: int | None = None  # simulated paths behind saturation_probability
    saturation_probability_se: float | None = None  # its Monte Carlo standard error
    truncated: tuple[str, ...] = ()  # work the max_seconds guard cut: result speed-dependent

    def to_dict(self, *, timings: bool = True) -> dict[str, Any]:
        """JSON-ready (non-finite floats become None); ``timings=False`` drops the
        ``fit_seconds`` measurements, leaving what identical input must reproduce."""
        d = asdict(self)
        if not timings:
            d.pop("fit_seconds")
            d["candidates"] = [
                {k: v for k, v in c.items() if k != "fit_seconds"} for c in d["candidates"]
            ]
        out: dict[str, Any] = json_ready(d)
        return out


def _collapse(lines: list[str]) -> tuple[str, ...]:
    """Repeated warnings (one per backtest origin) as one line with a count, first-seen order."""
    counts: dict[str, int] = {}
    for line in lines:
        counts[line] = counts.get(line, 0) + 1
    return tuple(line if c == 1 else f"{line} (x{c})" for line, c in counts.items())


_KNOWN = {
    "naive": "the difference scale sigma (from the training data)",
    "ets": "smoothing/damping parameters and heuristic initial states",
    "sarimax": "the AR(1) coefficient and scale (regression coefficients are Kalman states: "
    "their uncertainty is included)",
}


@dataclass(frozen=True, slots=True)
class _Setup:
    """The prepared series, its scaled values, the candidates and the backtest's plan."""

    prep: Prepared
    steps: int  # the horizon in whole buckets
    scale: float  # the values are modelled divided by it
    y: FloatArray  # prep.values / scale
    specs: tuple[ModelSpec, ...]
    hb: int  # steps each backtest origin checks
    origins: list[int]
    mase_den: float
    span_h: float  # hours of history
    assumptions: tuple[str, ...]


@dataclass(slots=True)
class _Notes:
    """What a forecast says beside its numbers, gathered step by step."""

    assumptions: list[str]
    warnings: list[str] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)  # work the max_seconds guard cut

    def warn_if_cut(self, max_seconds: float) -> None:
        """A warning when the max_seconds guard cut work: the result depends on speed."""
        if self.truncated:
            self.warnings.append(
                f"max_seconds={max_seconds:g} guard cut the work ({'; '.join(self.truncated)}): "
                "this result depends on the machine's speed; rerun with a larger max_seconds"
            )


# (backtest interval score, candidate order, spec, its row, its scores)
_Scored = tuple[float, int, ModelSpec, CandidateScore, Scores]


def forecast_demand(  # noqa: PLR0913 - keyword-only forecast options with defaults
    series: pd.Series,
    *,
    horizon_s: float,
    capacity: float | None = None,
    level: float = 0.9,
    seed: int = 0,
    max_seconds: float = 30.0,
    what: str = "kv_tokens",
    models: tuple[str, ...] | None = None,
    agg: str = "mean",
) -> Forecast:
    """Forecast ``series`` ``horizon_s`` ahead; method: planner/forecast/METHODS.md#demand.

    ``models`` restricts the candidates (keys of planner.forecast.models.SPECS, e.g.
    ``("snaive",)`` for the baseline); ``agg="max"`` models each bucket's peak instead of
    its mean (saturation happens at peaks). The horizon is rounded up to whole buckets.
    Raises InsufficientHistory, SeriesError or ConfigError (bad argument).
    """
    # statsmodels' first import takes 1-3 s: a one-off process cost, kept out of the budget.
    import statsmodels.tsa.exponential_smoothing.ets  # noqa: PLC0415 - start-up: statsmodels (~0.7 s) loads when this fit runs, not on `import planner.plan`
    import statsmodels.tsa.statespace.sarimax  # noqa: PLC0415, F401 - start-up: statsmodels (~0.7 s) loads when this fit runs, not on `import planner.plan`

    t_start = time.perf_counter()
    _check_options(horizon_s, level, max_seconds, capacity, agg)
    s = _setup(series, horizon_s=horizon_s, what=what, models=models, agg=agg)
    notes = _Notes(list(s.assumptions))
    scored, rows = _backtest_candidates(
        s, level=level, max_seconds=max_seconds, t_start=t_start, notes=notes
    )
    if not scored:
        raise SeriesError(f"{what}: no candidate model could be fitted ({notes.warnings[-1]})")
    final, band, chosen, sc = _refit_best(scored, s, level=level, what=what, notes=notes)
    rows = [CandidateScore(**{**asdict(r), "status": "chosen"}) if r is chosen else r for r in rows]
    best = final.spec
    prep, period, cad = s.prep, s.prep.seasonal_period, s.prep.cadence_s
    method = (
        best.label + (f" seasonal={period}" if best.seasonal and period else "") + f" @{cad:g}s"
    )
    _choice_notes(s, rows, sc, best, horizon_s=horizon_s, level=level, notes=notes)
    band, points = _clipped(s, band, notes)
    sat = Saturation(None, None, None, None, "no capacity given")
    if capacity is not None:
        sat = _saturation(
            final, s, band, capacity=capacity, agg=agg, seed=seed, notes=notes,
            t_start=t_start, max_seconds=max_seconds,
        )  # fmt: skip
    notes.warn_if_cut(max_seconds)
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
        backtest_origins=len(s.origins),
        backtest_horizon_steps=s.hb,
        backtest_points=sc.points,
        capacity=capacity,
        time_to_saturation_s=sat.ts,
        time_to_saturation_lo_s=sat.lo,
        time_to_saturation_hi_s=sat.hi,
        saturation_probability=sat.probability,
        saturation_note=sat.note,
        history_points=len(prep.values),
        raw_points=prep.raw_points,
        candidates=tuple(rows),
        warnings=_collapse(notes.warnings),
        assumptions=tuple(notes.assumptions),
        fit_seconds=round(time.perf_counter() - t_start, 4),
        seed=seed,
        saturation_paths=sat.paths,
        saturation_probability_se=sat.se,
        truncated=tuple(notes.truncated),
    )


def _check_options(
    horizon_s: float, level: float, max_seconds: float, capacity: float | None, agg: str
) -> None:
    """ConfigError for an argument forecast_demand cannot use."""
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


def _setup(
    series: pd.Series, *, horizon_s: float, what: str, models: tuple[str, ...] | None, agg: str
) -> _Setup:
    """Prepare and scale the series, choose the candidates and plan the backtest; seasonal
    candidates are dropped without two full days of history or room to backtest them."""
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
    if not period and any(s.seasonal for s in specs):
        specs = [s for s in specs if not s.seasonal] or [spec_of("naive")]
        assumptions.append("seasonal models requested but the history is < 2 full days: dropped")
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
    return _Setup(
        prep, steps, scale, y, tuple(specs), hb, origins, mase_den, span_h, tuple(assumptions)
    )


def _backtest_candidates(
    s: _Setup, *, level: float, max_seconds: float, t_start: float, notes: _Notes
) -> tuple[list[_Scored], list[CandidateScore]]:
    """Each candidate fitted before the first origin and scored by the backtest (those left
    once ``max_seconds`` is spent are skipped, one at least is tried); the scored ones and
    every candidate's row."""
    prep, y, period, cad = s.prep, s.y, s.prep.seasonal_period, s.prep.cadence_s
    train = y[: s.origins[0]]
    scored: list[_Scored] = []
    rows: list[CandidateScore] = []
    warns = notes.warnings
    for i, spec in enumerate(s.specs):
        label = spec.label
        if scored and time.perf_counter() - t_start > max_seconds:
            rows.append(CandidateScore(label, f"skipped: max_seconds={max_seconds:g} spent"))
            notes.truncated.append(f"candidate {label} not tried")
            continue
        f = Fitted(spec, period, prep.start, cad, 0)
        try:
            f = fit(spec, train, period=period, start_epoch=prep.start, cadence_s=cad)
            sc = backtest(f, y, origins=s.origins, hb=s.hb, level=level, mase_den=s.mase_den)
        except Exception as exc:  # loop boundary: one failed candidate must not sink the rest
            warns.extend(f.warnings)
            warns.append(f"{label} failed: {type(exc).__name__}: {exc}")
            rows.append(CandidateScore(label, f"failed: {type(exc).__name__}: {exc}"))
            continue
        warns.extend(f.warnings)
        row = CandidateScore(
            label,
            "scored",
            sc.interval_score * s.scale,
            sc.coverage,
            sc.mape,
            sc.mase,
            round(f.fit_seconds, 4),
        )
        rows.append(row)
        scored.append((sc.interval_score, i, spec, row, sc))
    return scored, rows


def _refit_best(
    scored: list[_Scored], s: _Setup, *, level: float, what: str, notes: _Notes
) -> tuple[Fitted, Band, CandidateScore, Scores]:
    """The best-scored candidate that, refitted on the whole history, forecasts finite
    values: the fit, its (scaled) mean and bounds, its row and its backtest scores."""
    prep, y, warns = s.prep, s.y, notes.warnings
    scored.sort(key=lambda r: (r[0] if math.isfinite(r[0]) else math.inf, r[1]))
    for _, _, spec, row, sc in scored:
        try:
            final = fit(
                spec, y, period=prep.seasonal_period, start_epoch=prep.start,
                cadence_s=prep.cadence_s,
            )  # fmt: skip
            mean, lo, hi = predict(final, y, s.steps, level)
        except Exception as exc:  # loop boundary: fall back to the next-best candidate
            warns.append(f"{spec.label} final fit failed ({type(exc).__name__}: {exc})")
            continue
        if np.isfinite(mean).all() and np.isfinite(lo).all() and np.isfinite(hi).all():
            warns.extend(final.warnings)
            return final, (mean, lo, hi), row, sc
        warns.append(f"{spec.label}: non-finite forecast on the full history; next best")
    raise SeriesError(f"{what}: no candidate model forecasts the full history ({warns[-1]})")


def _choice_notes(
    s: _Setup,
    rows: list[CandidateScore],
    sc: Scores,
    best: ModelSpec,
    *,
    horizon_s: float,
    level: float,
    notes: _Notes,
) -> None:
    """The assumptions of the choice, the backtest, the horizon and the intervals."""
    steps, hb, cad, n = s.steps, s.hb, s.prep.cadence_s, len(s.prep.values)
    assumptions = notes.assumptions
    assumptions.append(
        "chosen by the lowest mean interval score in the backtest among: "
        + ", ".join(f"{r.method} ({r.status})" for r in rows)
    )
    assumptions.append(
        f"backtest: {len(s.origins)} origins, {hb} steps each"
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
            f"horizon {horizon_s / 3600:.1f} h exceeds the {s.span_h:.1f} h history: extrapolation"
        )
    assumptions.append(
        f"intervals at {level:.0%}: Gaussian errors, {_KNOWN[best.family]} treated as known "
        "(their uncertainty is not in the interval), so they can be narrow; the backtest "
        "coverage checks them"
    )


def _clipped(
    s: _Setup, band: Band, notes: _Notes
) -> tuple[Band, tuple[tuple[float, float, float, float], ...]]:
    """The band in the series' units, clipped at 0 (demand is non-negative), and the
    forecast's points (bucket start, mean, lo, hi)."""
    scale, cad, steps = s.scale, s.prep.cadence_s, s.steps
    mean, lo, hi = band
    mean, lo, hi = mean * scale, lo * scale, hi * scale
    clipped = int(np.sum(lo < 0) + np.sum(mean < 0))
    if clipped:
        notes.assumptions.append(
            f"{clipped} negative bounds/means clipped to 0: demand is non-negative"
        )
    mean, lo, hi = np.maximum(mean, 0.0), np.maximum(lo, 0.0), np.maximum(hi, 0.0)
    t_pts = s.prep.end + cad * np.arange(steps)
    points = tuple(
        (float(t), float(m), float(a), float(b))
        for t, m, a, b in zip(t_pts, mean, lo, hi, strict=True)
    )
    return (mean, lo, hi), points


def _saturation(  # noqa: PLR0913 - the forecast's parts, passed through once
    final: Fitted,
    s: _Setup,
    band: Band,
    *,
    capacity: float,
    agg: str,
    seed: int,
    notes: _Notes,
    t_start: float,
    max_seconds: float,
) -> Saturation:
    """The time to saturation at ``capacity``; the crossing probability is simulated only
    while ``max_seconds`` since ``t_start`` (perf_counter) are not spent."""
    values = s.prep.values
    notes.assumptions.extend(capacity_notes(values, capacity, agg))
    simulate = time.perf_counter() - t_start <= max_seconds
    if not simulate and float(values[-1]) < capacity:  # else nothing to simulate
        notes.truncated.append("crossing probability not simulated")
    seen = len(final.warnings)
    sat = saturation(
        final, s.y, band, scale=s.scale, capacity=capacity, seed=seed, simulate=simulate
    )
    notes.warnings.extend(final.warnings[seen:])
    if sat.paths:
        notes.assumptions.append(
            f"P(saturation) from {sat.paths} simulated paths (seed {seed}, at most "
            f"{MAX_SIM_DRAWS:,} draws): Monte Carlo standard error {sat.se:.1%}"
        )
    return sat
