"""KV demand implied by the request-rate forecast (Little's law), and which forecast sizes.

KV in use ≈ λ × W × K × P (Little 1961; P the bucket peak factor) telescopes to c = mean
bucket-peak KV / mean request rate, estimated with a batch-means interval; the implied KV
forecast is c × the rate forecast. ``reconcile`` sizes on the KV forecast unless the implied
one lies wholly above it.

Method: planner/forecast/METHODS.md#implied_kv
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from core.errors import InsufficientHistory
from planner.forecast.data import to_epoch_arrays
from planner.forecast.saturation import crossing

if TYPE_CHECKING:
    import numpy.typing as npt
    import pandas as pd

    from planner.forecast.demand import Forecast

    FloatArray = npt.NDArray[np.float64]

REF_MIN_S = 6 * 3600.0  # the stretch: the last 6 h of history …
REF_MIN_BUCKETS = 24  # … or the last 24 buckets when the cadence is coarse
MAX_BLOCKS = 8
MIN_BLOCKS = 3
Point = tuple[float, float, float, float]  # (bucket start, mean, lo, hi)


@dataclass(frozen=True, slots=True)
class LittleFactors:
    """Little's-law factors over the stretch (METHODS.md#implied_kv)."""

    per_request: float  # c: bucket-peak KV per (request/s), i.e. KV token·s per request × P
    per_request_lo: float
    per_request_hi: float
    level: float
    rate: float  # λ̄, requests/s
    kv_mean: float
    kv_peak: float
    peak_factor: float  # P
    running: float | None  # mean running requests (None: no requests_running windows)
    time_in_engine_s: float | None  # W
    kv_per_request: float | None  # K
    cadence_s: float
    stretch_s: float
    buckets: int
    blocks: int


def _bucketed(series: pd.Series, cadence: float, agg: str) -> dict[int, float]:
    t, v, _ = to_epoch_arrays(series)
    b = np.floor(t / cadence).astype(np.int64)
    keys, inv = np.unique(b, return_inverse=True)
    if agg == "max":
        out = np.full(keys.size, -np.inf)
        np.maximum.at(out, inv, v)
    else:
        out = np.bincount(inv, weights=v) / np.bincount(inv)
    return dict(zip(keys.tolist(), out.tolist(), strict=True))


def factors(
    kv: pd.Series,
    rate: pd.Series,
    running: pd.Series | None,
    *,
    cadence_s: float,
    level: float,
) -> LittleFactors:
    """c = λ̄·W·K·P from the last stretch of history; InsufficientHistory when it is too short."""
    from scipy.stats import t as student_t  # noqa: PLC0415 - start-up: scipy.stats (~0.6 s) loads when this runs, not on `import planner.plan`

    peak, mean = _bucketed(kv, cadence_s, "max"), _bucketed(kv, cadence_s, "mean")
    lam = _bucketed(rate, cadence_s, "mean")
    run = _bucketed(running, cadence_s, "mean") if running is not None and len(running) else {}
    common = sorted(set(peak) & set(lam))
    need = max(REF_MIN_BUCKETS, math.ceil(REF_MIN_S / cadence_s))
    keys = common[-need:]
    blocks = min(MAX_BLOCKS, len(keys) // 3)
    if blocks < MIN_BLOCKS:
        raise InsufficientHistory(
            "Little's-law factors (KV and request-rate buckets)", 9, len(keys)
        )
    k_peak = np.array([peak[k] for k in keys])
    k_mean = np.array([mean[k] for k in keys])
    k_lam = np.array([lam[k] for k in keys])
    if not float(k_lam.sum()) > 0:
        raise InsufficientHistory("Little's-law factors (requests finished)", 1, 0)
    c = float(k_peak.sum() / k_lam.sum())
    parts = np.array_split(np.arange(len(keys)), blocks)
    per_block = np.array([k_peak[p].sum() / k_lam[p].sum() for p in parts if k_lam[p].sum() > 0])
    if per_block.size >= 2:
        half = float(student_t.ppf(0.5 + level / 2, per_block.size - 1))
        half *= float(per_block.std(ddof=1)) / math.sqrt(per_block.size)
    else:
        half = math.inf
    lam_bar, kv_bar = float(k_lam.mean()), float(k_mean.mean())
    r_keys = [k for k in keys if k in run]
    n_run = float(np.mean([run[k] for k in r_keys])) if len(r_keys) == len(keys) else None
    return LittleFactors(
        per_request=c,
        per_request_lo=max(c - half, 0.0),
        per_request_hi=c + half,
        level=level,
        rate=lam_bar,
        kv_mean=kv_bar,
        kv_peak=float(k_peak.mean()),
        peak_factor=float(k_peak.mean()) / kv_bar if kv_bar > 0 else math.nan,
        running=n_run,
        time_in_engine_s=n_run / lam_bar if n_run is not None else None,
        kv_per_request=kv_bar / n_run if n_run else None,
        cadence_s=cadence_s,
        stretch_s=len(keys) * cadence_s,
        buckets=len(keys),
        blocks=int(per_block.size),
    )


def implied_points(rate_fc: Forecast, f: LittleFactors) -> tuple[Point, ...]:
    """The rate forecast × c: (bucket start, mean, lo, hi) in the KV forecast's units."""
    return tuple(
        (t, m * f.per_request, lo * f.per_request_lo, hi * f.per_request_hi)
        for t, m, lo, hi in rate_fc.points
    )


def peak_of(points: tuple[Point, ...] | list[Point], until: float) -> Point | None:
    """The highest point (by mean; ties: the latest) starting at or before ``until``."""
    kept = [p for p in points if p[0] <= until]
    return max(kept, key=lambda p: (p[1], p[0])) if kept else None


def _iv(p: Point) -> str:
    return f"{p[1]:,.0f} [{min(p[2], p[1]):,.0f}, {max(p[3], p[1]):,.0f}]"


def reconcile(
    kv_fc: Forecast,
    rate_fc: Forecast,
    f: LittleFactors,
    *,
    capacity: float | None,
    unit: str,
) -> dict[str, Any]:
    """Which peak sizing follows (``driver``: "kv_demand" | "request_rate"), why, and the
    implied forecast's peak and crossing times (seconds after the rate forecast's origin)."""
    implied = implied_points(rate_fc, f)
    until = min(kv_fc.points[-1][0], rate_fc.points[-1][0])
    kv_peak, rate_peak = peak_of(kv_fc.points, until), peak_of(implied, until)
    assert kv_peak is not None and rate_peak is not None  # both hold their first point
    kv_lo, kv_hi = min(kv_peak[2], kv_peak[1]), max(kv_peak[3], kv_peak[1])
    r_lo, r_hi = min(rate_peak[2], rate_peak[1]), max(rate_peak[3], rate_peak[1])
    ahead = f"{(until - kv_fc.origin_epoch) / 3600:.3g} h"
    overlap = not (r_lo > kv_hi or kv_lo > r_hi)
    if r_lo > kv_hi:
        driver, chosen = "request_rate", rate_peak
        why = (
            f"the KV implied by the request-rate forecast peaks at {_iv(rate_peak)} {unit}, "
            f"wholly above the KV forecast's {_iv(kv_peak)} within {ahead}: sized for the "
            "more demanding (the KV extrapolation may lag a rising request rate)"
        )
    elif kv_lo > r_hi:
        driver, chosen = "kv_demand", kv_peak
        why = (
            f"the KV forecast peaks at {_iv(kv_peak)} {unit}, wholly above the "
            f"{_iv(rate_peak)} the request rate implies within {ahead}: sized for the more "
            "demanding (KV per request may be growing, which a rate forecast cannot see)"
        )
    else:
        driver, chosen = "kv_demand", kv_peak
        why = (
            f"the KV forecast peak {_iv(kv_peak)} {unit} and the request-rate-implied "
            f"{_iv(rate_peak)} overlap within {ahead}: sized on the KV forecast, which "
            "measures the quantity directly"
        )
    out: dict[str, Any] = {
        "driver": driver,
        "agree": overlap,
        "why": why,
        "peak": {
            "estimate": chosen[1],
            "lo": min(chosen[2], chosen[1]),
            "hi": max(chosen[3], chosen[1]),
            "at_epoch": chosen[0],
        },
        "kv_forecast_peak": list(kv_peak),
        "implied_peak": list(rate_peak),
        "level": kv_fc.level,
        "factors": asdict(f),
        "assumptions": assumptions(f, kv_fc, rate_fc),
    }
    if capacity is not None and rate_fc.points:
        mean, lo, hi = (np.array([p[i] for p in implied]) for i in (1, 2, 3))
        last = f.kv_peak  # the stretch's mean peak stands for "now" (no observed bucket here)
        cad = rate_fc.cadence_s
        out["implied_time_to_saturation_s"] = crossing(last, mean, capacity, cad)
        out["implied_time_to_saturation_lo_s"] = crossing(last, hi, capacity, cad)
        out["implied_time_to_saturation_hi_s"] = crossing(last, lo, capacity, cad)
    return out


def assumptions(f: LittleFactors, kv_fc: Forecast, rate_fc: Forecast) -> list[str]:
    """Where each factor comes from and what the implied forecast rests on."""
    lines = [
        f"Little's law: KV peak ≈ λ × W × K × P over the last {f.stretch_s / 3600:.3g} h "
        f"({f.buckets} buckets of {f.cadence_s:g} s)",
        f"λ = {f.rate:.4g} requests/s: request_success_total rate summed over engines "
        "(finished requests = arrivals only while not saturated)",
    ]
    if f.time_in_engine_s is not None and f.kv_per_request is not None:
        lines += [
            f"W = {f.time_in_engine_s:.4g} s in the engine: mean requests_running "
            f"({f.running:.4g}) / λ (Little's law on the running set)",
            f"K = {f.kv_per_request:,.0f} KV per running request: mean KV in use "
            f"({f.kv_mean:,.0f}) / mean running requests",
        ]
    else:
        lines.append("W and K not separated: no requests_running windows (c = KV / λ directly)")
    lines += [
        f"P = {f.peak_factor:.3g}: mean bucket-peak KV / mean KV (the KV forecast models peaks)",
        f"c = λ̄·W·K·P / λ̄ = {f.per_request:,.4g} [{f.per_request_lo:,.4g}, "
        f"{f.per_request_hi:,.4g}] ({f.level:.0%}, t interval over {f.blocks} contiguous "
        "blocks, assumed roughly independent)",
        "implied KV = c × the request-rate forecast; bounds = same-side bounds multiplied "
        "(conservative); the request mix is assumed to stay as over the stretch",
    ]
    if rate_fc.cadence_s != kv_fc.cadence_s:
        lines.append(
            f"the rate forecast's cadence ({rate_fc.cadence_s:g} s) differs from the KV "
            f"forecast's ({kv_fc.cadence_s:g} s): P was measured at the latter"
        )
    return lines
