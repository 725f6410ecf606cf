"""The demand forecasts of `kvscope plan`: KV tokens in use against HBM KV capacity, and the
request rate, each with its interval, backtest and (for KV) time to saturation.

HBM KV capacity per engine from vLLM's cache-config facts, else the cost model's prior, else
demand in engines' worth of KV. Sizing follows the KV forecast unless the KV the rate
forecast implies (Little's law) lies wholly above it; ``demand_basis`` says which and why.

Method: planner/plan/METHODS.md#forecast
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from core import catalog
from core.durations import format_duration
from core.errors import InsufficientHistory, KvscopeError
from core.records import Window
from planner.decide.evidence import Evidence, ValueCI
from planner.domain import costmodel
from planner.domain.values import finite
from planner.forecast.data import SeriesError, demand_series_from_frame, prepare
from planner.forecast.demand import MAX_HORIZON_STEPS, forecast_demand
from planner.forecast.implied_kv import factors, reconcile
from planner.forecast.kv_rate_agreement import compare
from planner.forecast.saturation import rule_of_three
from planner.frames.table import WindowTable
from planner.plan.fits import Hardware, cannot_entry, value_ci
from planner.plan.needed import KV_SIGNAL, RATE_SIGNAL, RUNNING_SIGNAL

if TYPE_CHECKING:
    import pandas as pd

    Windows = Sequence[Window] | pd.DataFrame | WindowTable

    from planner.forecast.demand import Forecast

FORECAST_LEVEL = 0.9  # planner.forecast.demand's default level


@dataclass(frozen=True, slots=True, eq=False)
class Capacity:
    per_source: Mapping[str, float] | None  # None: demand in engines' worth of KV
    total: float
    engines: int
    unit: str
    basis: str


@dataclass(frozen=True, slots=True)
class ForecastEvidence:
    """The Evidence fields the forecasts fill (planner/decide/evidence.py says what each
    means); ``saturation_censored``: the latest saturation bound lies beyond the horizon."""

    demand_unit: str = "tokens/s"
    engine_capacity: float | None = None
    demand_now: float | None = None
    demand_peak: ValueCI | None = None
    demand_basis: str = ""
    time_to_saturation_s: ValueCI | None = None
    saturation_censored: bool = False

    def apply(self, ev: Evidence) -> Evidence:
        """``ev`` with the fields the forecasts fill."""
        return replace(
            ev,
            demand_unit=self.demand_unit,
            engine_capacity=self.engine_capacity,
            demand_now=self.demand_now,
            demand_peak=self.demand_peak,
            demand_basis=self.demand_basis,
            time_to_saturation_s=self.time_to_saturation_s,
        )


@dataclass(frozen=True, slots=True, eq=False)
class ForecastRun:
    """Both forecasts (None when they could not be made) and their JSON sections."""

    kv: Forecast | None
    kv_series: pd.Series | None
    rate: Forecast | None
    rate_series: pd.Series | None
    capacity: Capacity | None
    section: dict[str, Any]
    evidence: ForecastEvidence = ForecastEvidence()


def kv_capacity(
    windows: Windows, facts: Mapping[str, Mapping[str, Any]], hw: Hardware | None
) -> Capacity | None:
    """HBM KV capacity of every engine that reports KV usage (METHODS.md#forecast).

    ``windows``: Window records or their table (planner/frames/table.py).
    """
    t = WindowTable.of(windows)
    labels = t.codes(KV_SIGNAL, "labels")
    width = int(labels.max()) + 2 if labels.size else 1
    pairs = np.unique(t.codes(KV_SIGNAL, "source") * width + labels)
    # One (source, labels) pair per engine reporting KV usage, sorted (capacities are
    # integers of tokens: the order of the sum does not matter).
    names = t.names(KV_SIGNAL)
    series = sorted((names[p // width], p % width) for p in pairs.tolist())
    if not series:
        return None
    sources = sorted({s for s, _ in series})
    per: dict[str, float] = {}
    measured = prior = 0
    prior_tokens = None
    if hw is not None:
        try:
            prior_tokens = float(costmodel.hbm_kv_capacity_tokens(hw.model, hw.gpu, hw.tp))
        except KvscopeError:
            prior_tokens = None
    for s in sources:
        f = facts.get(s, {})
        blocks, size = f.get("num_gpu_blocks"), f.get("block_size")
        if isinstance(blocks, int) and isinstance(size, int) and blocks > 0 and size > 0:
            per[s] = float(blocks * size)
            measured += 1
        elif prior_tokens is not None:
            per[s] = prior_tokens
            prior += 1
    n = len(series)
    if len(per) < len(sources):
        return Capacity(
            None,
            float(n),
            n,
            "engines of KV",
            f"{len(sources) - len(per)} source(s) without num_gpu_blocks × block_size and no "
            "cost-model prior (model/gpu/tp unknown): demand = Σ KV usage ratios, capacity = "
            f"{n} engines",
        )
    total = sum(per[s] for s, _ in series)
    parts = []
    if measured:
        family = catalog.FACTS["cache_config"]  # the vendor name lives in the catalogue
        parts.append(f"{measured} source(s): num_gpu_blocks × block_size ({family})")
    if prior:
        parts.append(
            f"{prior} source(s): cost-model prior hbm_kv_capacity_tokens at "
            "gpu_memory_utilization 0.9"
        )
    return Capacity(per, total, n, "KV tokens", "; ".join(parts))


def _one(
    series: pd.Series | None,
    what: str,
    missing: str,
    *,
    horizon_s: float,
    capacity: float | None,
    seed: int,
    max_seconds: float,
    agg: str,
) -> tuple[Forecast | None, dict[str, Any]]:
    if series is None:
        return None, cannot_entry(what, missing)
    note = ""
    try:
        # The horizon never exceeds the modelled history: the backtest checks at most that far
        # ahead (planner/forecast/demand.py step 3), and past it a trend fitted on a few hours runs
        # on unchecked (4 h of history projected 7 d gave 836 req/s [0, 24,500] against a
        # peak of 16). The caller's horizon is kept in ``horizon_asked_s``.
        prep = prepare(series, what=what, agg=agg)
        cadence, span = prep.cadence_s, len(prep.values) * prep.cadence_s
        limit = min(span, MAX_HORIZON_STEPS * cadence)
        if horizon_s > limit:
            asked, kept = format_duration(horizon_s), format_duration(limit)
            note = (
                f"horizon shortened from {asked} to {kept}, the length of "
                "the modelled history: a forecast further ahead than the history is long is "
                "checked by no backtest; collect more history for a longer horizon"
                if limit == span
                else f"horizon shortened from {asked} to {kept}: at most "
                f"{MAX_HORIZON_STEPS} steps of the {cadence:g} s modelling cadence"
            )
            horizon_s = limit
        fc = forecast_demand(
            series,
            horizon_s=horizon_s,
            capacity=capacity,
            seed=seed,
            max_seconds=max_seconds,
            what=what,
            agg=agg,
        )
    except InsufficientHistory as exc:
        return None, cannot_entry(what, str(exc), exc.available)
    except KvscopeError as exc:
        return None, cannot_entry(what, f"forecast refused: {exc}")
    bound = rule_of_three(fc.saturation_probability, fc.saturation_paths)
    entry = {**fc.to_dict(), "saturation_probability_bound": bound}
    return fc, {**entry, "can_tell": True, "why": "", "horizon_note": note, "horizon_s": horizon_s}


def run_forecasts(
    windows: Windows,
    cap: Capacity | None,
    *,
    horizon_s: float,
    seed: int,
    max_seconds: float,
) -> ForecastRun:
    """KV demand (modelled at each bucket's peak: saturation happens at peaks) and the
    request rate (bucket means); both from planner.forecast.demand with its default level."""
    t = WindowTable.of(windows)
    kv_series = rate_series = None
    kv_why = f"no {KV_SIGNAL} windows"
    rate_why = f"no {RATE_SIGNAL} windows"
    if cap is not None:
        try:
            kv_series = demand_series_from_frame(
                t.part(KV_SIGNAL), signal=KV_SIGNAL, capacity_tokens=cap.per_source
            )
        except SeriesError as exc:
            kv_why = str(exc)
    try:
        rate_series = demand_series_from_frame(t.part(RATE_SIGNAL), signal=RATE_SIGNAL)
    except SeriesError as exc:
        rate_why = str(exc)
    kv, kv_entry = _one(
        kv_series,
        "kv_demand",
        kv_why,
        horizon_s=horizon_s,
        capacity=cap.total if cap else None,
        seed=seed,
        max_seconds=max_seconds,
        agg="max",
    )
    rate, rate_entry = _one(
        rate_series,
        "request_rate",
        rate_why,
        horizon_s=horizon_s,
        capacity=None,
        seed=seed,
        max_seconds=max_seconds,
        agg="mean",
    )
    if cap is not None:
        kv_entry |= {
            "unit": cap.unit,
            "capacity_total": cap.total,
            "capacity_basis": cap.basis,
            "engines": cap.engines,
        }
    rate_entry["unit"] = "requests/s"
    # the horizon the KV forecast answered (it drives saturation and sizing), else the rate's
    asked, horizon_s = (
        horizon_s,
        kv_entry.get("horizon_s") or rate_entry.get("horizon_s", horizon_s),
    )
    section = {
        "kv_demand": kv_entry,
        "request_rate": rate_entry,
        "horizon_s": horizon_s,
        "horizon_asked_s": asked,
    }
    # both stay reported; a note says when their growth contradicts (forecast_agree.py)
    section["agreement"] = compare(kv, kv_series, rate, rate_series, cap.total if cap else None)
    try:
        running = demand_series_from_frame(t.part(RUNNING_SIGNAL), signal=RUNNING_SIGNAL)
    except SeriesError:
        running = None
    rec = reconciled(kv, kv_series, rate, rate_series, running, cap)
    section["reconciled"] = rec
    ev = kv_evidence(kv, kv_series, cap, horizon_s, rec)
    return ForecastRun(kv, kv_series, rate, rate_series, cap, section, ev)


def reconciled(  # noqa: PLR0917 - the two forecasts, their series and the capacity
    kv: Forecast | None,
    kv_series: pd.Series | None,
    rate: Forecast | None,
    rate_series: pd.Series | None,
    running: pd.Series | None,
    cap: Capacity | None,
) -> dict[str, Any]:
    """The KV forecast against the KV the request-rate forecast implies (forecast_little.py):
    ``driver`` names the one sizing follows; can_tell False (with why) when either is missing."""
    if kv is None or rate is None or kv_series is None or rate_series is None or cap is None:
        return {"can_tell": False, "why": "needs both the KV-demand and request-rate forecasts"}
    if not kv.points or not rate.points:
        return {"can_tell": False, "why": "a forecast without points"}
    try:
        f = factors(kv_series, rate_series, running, cadence_s=kv.cadence_s, level=kv.level)
    except KvscopeError as exc:
        return {"can_tell": False, "why": f"Little's-law factors: {exc}"}
    return {"can_tell": True, **reconcile(kv, rate, f, capacity=cap.total, unit=cap.unit)}


def kv_evidence(
    fc: Forecast | None,
    series: pd.Series | None,
    cap: Capacity | None,
    horizon_s: float,
    rec: Mapping[str, Any] | None = None,
) -> ForecastEvidence:
    """demand_now / demand_peak / engine_capacity / time_to_saturation_s / demand_basis.

    demand_now: mean of the last hour of history; engine_capacity: mean capacity per engine
    (so sizing counts engines whose HBM holds the peak). A saturation time whose latest bound
    lies beyond the horizon is reported with hi = the horizon (censored; noted in basis).
    ``rec`` (:func:`reconciled`) with driver "request_rate": demand_peak and the saturation
    times come from the KV the request-rate forecast implies, and demand_basis says why.
    """
    if cap is None:
        return ForecastEvidence()
    now: float | None = None
    if series is not None and len(series):
        last = series[series.index >= float(series.index.max()) - 3600.0]
        now = finite(float(last.mean()))
    base = ForecastEvidence(
        demand_unit=cap.unit, engine_capacity=cap.total / cap.engines, demand_now=now
    )
    if fc is None:
        return base
    peak: ValueCI | None = None
    if fc.points:
        top = max(fc.points, key=lambda p: (p[1], p[0]))  # ties: the latest, widest
        peak = value_ci(top[1], min(top[2], top[1]), max(top[3], top[1]), fc.level)
    ts, lo, hi = fc.time_to_saturation_s, fc.time_to_saturation_lo_s, fc.time_to_saturation_hi_s
    basis = f"KV-demand forecast ({fc.method})" + (
        f": {rec['why']}" if rec and rec.get("can_tell") else ""
    )
    if rec and rec.get("can_tell") and rec["driver"] == "request_rate":
        p = rec["peak"]
        peak = value_ci(p["estimate"], p["lo"], p["hi"], fc.level)
        basis = f"request-rate forecast × Little's-law KV per request: {rec['why']}"
        ts, lo, hi = (rec.get(f"implied_time_to_saturation{k}_s") for k in ("", "_lo", "_hi"))
    ttl: ValueCI | None = None
    if lo is not None:
        est = ts if ts is not None else horizon_s
        ttl = value_ci(est, min(lo, est), hi if hi is not None else max(horizon_s, est), fc.level)
    return replace(
        base,
        demand_peak=peak,
        demand_basis=basis,
        time_to_saturation_s=ttl,
        saturation_censored=ttl is not None and (ts is None or hi is None),
    )
