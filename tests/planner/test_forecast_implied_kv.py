"""Little's-law factors from history, the KV the request-rate forecast implies, and which
forecast sizing follows (planner/forecast/implied_kv.py), on seeded series whose truth is known."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from core.errors import InsufficientHistory
from planner.forecast.demand import Forecast, forecast_demand
from planner.forecast.implied_kv import LittleFactors, factors, implied_points, reconcile

T0 = 1_699_920_000.0
HOUR = 3600.0
W_TRUE = 4.0  # seconds a request spends running
K_TRUE = 500.0  # KV tokens per running request
CAPACITY = 25_000.0  # flat KV (10k) never reaches it; the rising rate implies it does


def _series(values: np.ndarray, t: np.ndarray) -> pd.Series:
    return pd.Series(values, index=t)


def history(
    hours: float, rate_slope: float, kv_follows_rate: bool, seed: int = 0
) -> tuple[pd.Series, pd.Series, pd.Series]:
    """(KV in use, request rate, running requests) at 1-minute points. The rate rises from 5
    req/s by ``rate_slope`` per hour; running = rate × W; KV = running × K (or held flat at
    its starting level when not ``kv_follows_rate``), each with noise."""
    rng = np.random.default_rng(seed)
    t = T0 + 60.0 * np.arange(int(hours * 60))
    h = (t - T0) / HOUR
    rate = 5.0 + rate_slope * h + rng.normal(0.0, 0.1, t.size)
    running = rate * W_TRUE * (1 + rng.normal(0.0, 0.02, t.size))
    base = running if kv_follows_rate else np.full(t.size, 5.0 * W_TRUE)
    kv = base * K_TRUE * (1 + rng.normal(0.0, 0.02, t.size))
    return _series(kv, t), _series(rate, t), _series(running, t)


def fc(series: pd.Series, capacity: float | None = None) -> Forecast:
    return forecast_demand(series, horizon_s=6 * HOUR, capacity=capacity, seed=1)


def test_factors_recover_time_in_engine_and_kv_per_request() -> None:
    kv, rate, running = history(6, 1.0, kv_follows_rate=True)
    f = factors(kv, rate, running, cadence_s=60.0, level=0.9)
    assert f.per_request_lo <= W_TRUE * K_TRUE <= f.per_request_hi
    assert f.per_request_hi - f.per_request_lo < 0.1 * f.per_request
    assert f.time_in_engine_s == pytest.approx(W_TRUE, rel=0.03)
    assert f.kv_per_request == pytest.approx(K_TRUE, rel=0.03)
    assert f.peak_factor == pytest.approx(1.0)  # one point per 60 s bucket: peak = mean
    # λ̄·W·K·P telescopes to c
    assert f.time_in_engine_s is not None and f.kv_per_request is not None
    product = f.time_in_engine_s * f.kv_per_request * f.peak_factor
    assert product == pytest.approx(f.per_request, rel=1e-9)
    assert f.stretch_s == 6 * HOUR and f.buckets == 360 and f.blocks == 8


def test_factors_use_the_last_six_hours_only() -> None:
    kv, rate, running = history(10, 1.0, kv_follows_rate=True)
    kv = kv.where(kv.index >= T0 + 4 * HOUR, kv * 3)  # a different mix before the stretch
    f = factors(kv, rate, running, cadence_s=60.0, level=0.9)
    assert f.buckets == 360 and f.per_request == pytest.approx(W_TRUE * K_TRUE, rel=0.02)


def test_factors_coarse_cadence_peak_factor_above_one() -> None:
    kv, rate, running = history(24, 0.0, kv_follows_rate=True)
    wiggle = 1 + 0.2 * np.sin(2 * np.pi * (kv.index.to_numpy() - T0) / 900.0)
    f = factors(kv * wiggle, rate, running, cadence_s=900.0, level=0.9)
    assert 1.1 < f.peak_factor < 1.25  # bucket peaks of a ±20 % wiggle over their means
    assert f.per_request == pytest.approx(f.kv_peak / f.rate)
    assert f.buckets == 24


def test_factors_without_running_leave_w_and_k_unknown() -> None:
    kv, rate, _ = history(6, 1.0, kv_follows_rate=True)
    f = factors(kv, rate, None, cadence_s=60.0, level=0.9)
    assert f.running is None and f.time_in_engine_s is None and f.kv_per_request is None
    assert f.per_request == pytest.approx(W_TRUE * K_TRUE, rel=0.03)


@pytest.mark.parametrize(
    ("points", "rate_value", "needle"),
    [(8, 5.0, "buckets"), (60, 0.0, "requests finished")],
)
def test_factors_too_little_raises_insufficient_history(
    points: int, rate_value: float, needle: str
) -> None:
    t = T0 + 60.0 * np.arange(points)
    kv, rate = _series(np.full(points, 1e4), t), _series(np.full(points, rate_value), t)
    with pytest.raises(InsufficientHistory, match=needle):
        factors(kv, rate, None, cadence_s=60.0, level=0.9)


def _factors_of(kv: pd.Series, rate: pd.Series, running: pd.Series) -> LittleFactors:
    return factors(kv, rate, running, cadence_s=60.0, level=0.9)


def test_reconcile_rising_rate_flat_kv_sizes_for_the_implied_kv() -> None:
    kv, rate, running = history(4, 2.5, kv_follows_rate=False)  # rate 5 -> 15 req/s
    f = _factors_of(kv, rate, running)
    kv_fc, rate_fc = fc(kv, CAPACITY), fc(rate)
    rec = reconcile(kv_fc, rate_fc, f, capacity=CAPACITY, unit="KV tokens")
    assert rec["driver"] == "request_rate" and rec["agree"] is False
    top = max(rate_fc.points, key=lambda p: (p[1], p[0]))
    assert rec["peak"]["estimate"] == pytest.approx(top[1] * f.per_request)
    assert rec["peak"]["lo"] == pytest.approx(
        min(top[2] * f.per_request_lo, rec["peak"]["estimate"])
    )
    assert rec["peak"]["hi"] == pytest.approx(top[3] * f.per_request_hi)
    assert rec["peak"]["lo"] > rec["kv_forecast_peak"][3]  # beyond the KV forecast's interval
    assert "wholly above" in rec["why"] and "KV tokens" in rec["why"]
    assert any(a.startswith("W = ") for a in rec["assumptions"])
    assert any(a.startswith("K = ") for a in rec["assumptions"])
    ts = rec["implied_time_to_saturation_s"]
    assert ts is not None and rec["implied_time_to_saturation_lo_s"] <= ts
    assert kv_fc.time_to_saturation_s is None  # the flat KV forecast alone never saturates


def test_reconcile_kv_following_the_rate_agrees_and_kv_drives() -> None:
    kv, rate, running = history(4, 1.0, kv_follows_rate=True)
    f = _factors_of(kv, rate, running)
    rec = reconcile(fc(kv), fc(rate), f, capacity=None, unit="KV tokens")
    assert rec["agree"] is True and rec["driver"] == "kv_demand"
    assert rec["peak"]["estimate"] == rec["kv_forecast_peak"][1]
    assert "overlap" in rec["why"] and "implied_time_to_saturation_s" not in rec


def test_reconcile_kv_growing_faster_than_the_rate_keeps_kv() -> None:
    kv, rate, running = history(4, 0.0, kv_follows_rate=True)
    growing = kv * (1 + 0.5 * (kv.index.to_numpy() - T0) / HOUR)  # KV per request grows
    f = _factors_of(growing, rate, running)
    rec = reconcile(fc(growing), fc(rate), f, capacity=None, unit="KV tokens")
    assert rec["driver"] == "kv_demand" and rec["agree"] is False
    assert "KV per request may be growing" in rec["why"]


def test_implied_points_scale_each_bound_by_the_same_side_factor() -> None:
    kv, rate, running = history(4, 1.0, kv_follows_rate=True)
    f = _factors_of(kv, rate, running)
    rate_fc = fc(rate)
    for (t, m, lo, hi), (ti, mi, loi, hii) in zip(
        rate_fc.points, implied_points(rate_fc, f), strict=True
    ):
        assert ti == t and mi == m * f.per_request
        assert loi == lo * f.per_request_lo and hii == hi * f.per_request_hi
        assert math.isfinite(hii)
