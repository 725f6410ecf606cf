"""KV-demand vs request-rate forecasts: growth ratios compared, a note when they contradict."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from planner.forecast.demand import Forecast, forecast_demand
from planner.forecast.kv_rate_agreement import compare

T0 = 1_699_920_000.0
HOUR = 3600.0


def _minutes(hours: float, level: float, slope_per_h: float, noise: float, seed: int) -> pd.Series:
    rng = np.random.default_rng(seed)
    t = T0 + 60.0 * np.arange(int(hours * 60))
    h = (t - T0) / HOUR
    return pd.Series(level + slope_per_h * h + rng.normal(0.0, noise, t.size), index=t)


def _fc(series: pd.Series, capacity: float | None = None) -> Forecast:
    return forecast_demand(series, horizon_s=6 * HOUR, capacity=capacity, seed=1, max_seconds=5)


@pytest.fixture(scope="module")
def rising_rate() -> tuple[Forecast, pd.Series]:
    s = _minutes(4, 10.0, 2.5, 0.3, seed=1)  # 10 -> 20 req/s over 4 h, still rising
    return _fc(s), s


def test_compare_rising_rate_flat_kv_disagree_and_both_are_reported(
    rising_rate: tuple[Forecast, pd.Series],
) -> None:
    rate, rate_s = rising_rate
    kv_s = _minutes(4, 2e5, 0.0, 4e3, seed=2)  # KV flat while the rate doubles
    kv = _fc(kv_s, capacity=4.6e5)
    out = compare(kv, kv_s, rate, rate_s, 4.6e5)
    assert out is not None
    g_rate, g_kv = out["request_rate"], out["kv_demand"]
    assert g_rate["ratio_lo"] > g_kv["ratio_hi"]  # the intervals do not overlap
    assert out["agree"] is False
    note = out["note"]
    assert "disagree" in note
    for g in (g_rate, g_kv):  # both forecasts with their backtest scores
        assert g["method"] in note and g["backtest_origins"] > 0
        assert f"MASE {g['backtest_mase']:.2f}" in note
    assert g_rate["at_epoch"] == g_kv["at_epoch"]  # compared at the same time


def test_compare_kv_following_the_rate_agrees_without_a_note(
    rising_rate: tuple[Forecast, pd.Series],
) -> None:
    rate, rate_s = rising_rate
    kv_s = _minutes(4, 1e5, 2.5e4, 4e3, seed=3)  # KV ∝ rate (1e4 KV tokens per req/s)
    kv = _fc(kv_s, capacity=1e6)
    out = compare(kv, kv_s, rate, rate_s, 1e6)
    assert out is not None
    assert out["agree"] is True and out["note"] == ""
    assert out["kv_demand"]["ratio"] == pytest.approx(out["request_rate"]["ratio"], rel=0.25)


def test_compare_rate_growth_beyond_capacity_names_the_implied_kv(
    rising_rate: tuple[Forecast, pd.Series],
) -> None:
    rate, rate_s = rising_rate
    kv_s = _minutes(4, 2e5, 0.0, 4e3, seed=2)
    out = compare(_fc(kv_s, capacity=2.5e5), kv_s, rate, rate_s, 2.5e5)
    assert out is not None and not out["agree"]
    assert out["kv_implied_by_rate"] > 2.5e5
    assert "the HBM KV capacity" in out["note"]


def test_compare_without_both_forecasts_is_none(rising_rate: tuple[Forecast, pd.Series]) -> None:
    rate, rate_s = rising_rate
    assert compare(None, None, rate, rate_s, 1e6) is None
    assert compare(rate, rate_s, None, None, None) is None
