"""planner.forecast.demand on seeded synthetic series whose truth is known."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from statistics import NormalDist

import numpy as np
import pandas as pd
import pytest

from core.errors import ConfigError, InsufficientHistory
from core.records import Window, labels_of
from planner.forecast.demand import (
    Forecast,
    SeriesError,
    demand_series_from_windows,
    forecast_demand,
    plan_backtest,
)

T0 = 1_699_920_000.0  # 2023-11-14 00:00:00 UTC: a midnight, so "hour of day" is h % 24
HOUR = 3600.0

Truth = Callable[[np.ndarray], np.ndarray]


def minutes(days: float, truth: Truth, noise: float, seed: int = 0) -> pd.Series:
    """1-minute points of truth(hours since T0) + Gaussian noise, indexed by epoch seconds."""
    rng = np.random.default_rng(seed)
    t = T0 + 60.0 * np.arange(int(days * 1440))
    return pd.Series(truth((t - T0) / HOUR) + rng.normal(0.0, noise, t.size), index=t)


def seasonal_truth(h: np.ndarray) -> np.ndarray:
    return 1e6 + 2e3 * h + 2e5 * np.sin(2 * np.pi * h / 24)


def bucket_truth(f: Forecast, truth: Truth) -> np.ndarray:
    """The true mean of each forecast bucket (averaged over 60 sub-points)."""
    starts = np.array([p[0] for p in f.points])
    fine = np.stack([truth((starts + f.cadence_s * (k + 0.5) / 60 - T0) / HOUR) for k in range(60)])
    out: np.ndarray = fine.mean(axis=0)
    return out


@pytest.fixture(scope="module")
def seasonal_forecast() -> Forecast:
    series = minutes(7, seasonal_truth, 3e4)
    return forecast_demand(series, horizon_s=24 * HOUR, capacity=2e6)


def test_forecast_daily_seasonal_with_trend_chooses_seasonal_model(
    seasonal_forecast: Forecast,
) -> None:
    f = seasonal_forecast
    assert f.seasonal_period == 24
    assert "seasonal=24" in f.method and f.method.endswith("@3600s")
    assert f.cadence_s == HOUR and f.history_points == 168 and f.raw_points == 7 * 1440
    assert len(f.points) == 24
    assert any("daily seasonality" in a for a in f.assumptions)
    chosen = [c for c in f.candidates if c.status == "chosen"]
    assert len(chosen) == 1 and f.method.startswith(chosen[0].method)
    # the baseline is beaten by the chosen model
    naive = next(c for c in f.candidates if c.method == "seasonal naive")
    assert naive.interval_score is not None and chosen[0].interval_score is not None
    assert chosen[0].interval_score < naive.interval_score


def test_forecast_daily_seasonal_backtest_coverage_near_nominal_and_mape_small(
    seasonal_forecast: Forecast,
) -> None:
    f = seasonal_forecast
    assert f.level == 0.9
    assert f.backtest_origins >= 3 and f.backtest_horizon_steps == 24
    assert f.backtest_points == f.backtest_origins * f.backtest_horizon_steps
    assert f.backtest_coverage is not None and 0.75 <= f.backtest_coverage <= 1.0
    assert f.backtest_mape is not None and f.backtest_mape < 2.0
    assert f.backtest_mase is not None and f.backtest_mase < 0.5


def test_forecast_daily_seasonal_point_forecast_tracks_truth(seasonal_forecast: Forecast) -> None:
    f = seasonal_forecast
    truth = bucket_truth(f, seasonal_truth)
    mean = np.array([p[1] for p in f.points])
    lo = np.array([p[2] for p in f.points])
    hi = np.array([p[3] for p in f.points])
    assert np.all(lo <= mean) and np.all(mean <= hi)
    # hourly-mean noise sd is 3e4 / sqrt(60) ~ 3.9e3; a 2 % error would be 2e4+
    assert np.max(np.abs(mean - truth) / truth) < 0.01
    assert np.mean((truth >= lo) & (truth <= hi)) >= 0.75
    # starts right after the history, one hour apart
    assert f.points[0][0] == f.origin_epoch == T0 + 7 * 24 * HOUR
    assert all(b[0] - a[0] == HOUR for a, b in zip(f.points, f.points[1:], strict=False))


def test_forecast_daily_seasonal_to_dict_is_strict_json(seasonal_forecast: Forecast) -> None:
    d = seasonal_forecast.to_dict()
    text = json.dumps(d, allow_nan=False)
    back = json.loads(text)
    assert back["method"] == seasonal_forecast.method
    assert len(back["points"]) == 24 and len(back["points"][0]) == 4
    assert {c["status"] for c in back["candidates"]} >= {"chosen", "scored"}


def test_forecast_linear_trend_saturation_time_inside_interval() -> None:
    slope, base = 1e3, 2e5  # tokens per hour
    cross_after_h = 30.0
    capacity = base + slope * (72 + cross_after_h)
    series = minutes(3, lambda h: base + slope * h, 5e3, seed=3)
    f = forecast_demand(series, horizon_s=72 * HOUR, capacity=capacity)
    assert f.time_to_saturation_s is not None and f.time_to_saturation_lo_s is not None
    latest = math.inf if f.time_to_saturation_hi_s is None else f.time_to_saturation_hi_s
    truth_s = cross_after_h * HOUR
    assert f.time_to_saturation_lo_s <= truth_s <= latest
    assert f.time_to_saturation_lo_s <= f.time_to_saturation_s <= latest
    assert abs(f.time_to_saturation_s - truth_s) < 4 * HOUR
    assert f.saturation_probability is not None and f.saturation_probability > 0.9
    assert "point forecast in" in f.saturation_note


def test_forecast_saturation_beyond_horizon_is_none_with_reason() -> None:
    series = minutes(0.5, lambda h: 1e5 + 0 * h, 1e3, seed=4)
    f = forecast_demand(series, horizon_s=2 * HOUR, capacity=1e7)
    assert f.time_to_saturation_s is None and f.time_to_saturation_lo_s is None
    assert f.time_to_saturation_hi_s is None
    assert "not within the horizon" in f.saturation_note
    assert f.saturation_probability == 0.0


def test_forecast_capacity_already_exceeded_gives_zero() -> None:
    series = minutes(0.5, lambda h: 1e5 + 0 * h, 1e3, seed=5)
    f = forecast_demand(series, horizon_s=HOUR, capacity=5e4)
    assert f.time_to_saturation_s == 0.0 == f.time_to_saturation_lo_s == f.time_to_saturation_hi_s
    assert f.saturation_note.startswith("already saturated")


def test_forecast_six_hours_non_seasonal_model_no_seasonal_claim() -> None:
    series = minutes(0.25, lambda h: 5e5 + 2e4 * np.sin(2 * np.pi * h / 24), 5e3, seed=1)
    f = forecast_demand(series, horizon_s=HOUR)
    assert f.seasonal_period is None
    assert "seasonal" not in f.method and f.cadence_s == 300.0
    assert f.history_points == 72 and len(f.points) == 12
    seasonal_models = {"seasonal naive", "ETS(A,Ad,A)", "ETS(A,A,A)"}
    assert not {c.method for c in f.candidates} & seasonal_models
    assert not any("Fourier" in c.method for c in f.candidates)
    assert any("no seasonality modelled" in a for a in f.assumptions)
    assert f.backtest_origins >= 3 and f.backtest_coverage is not None


def test_forecast_exactly_two_days_drops_seasonal_models_without_backtest_room() -> None:
    f = forecast_demand(minutes(2, seasonal_truth, 3e4, seed=2), horizon_s=6 * HOUR)
    assert f.cadence_s == HOUR and f.history_points == 48
    assert f.seasonal_period is None and "seasonal" not in f.method
    assert any("seasonal models dropped" in a for a in f.assumptions)


def test_forecast_ten_points_raises_insufficient_history() -> None:
    series = pd.Series(np.linspace(1.0, 2.0, 10), index=T0 + 60.0 * np.arange(10))
    with pytest.raises(InsufficientHistory) as err:
        forecast_demand(series, horizon_s=HOUR)
    assert err.value.required == 24 and err.value.available == 10
    assert "kv_tokens" in err.value.what


def test_forecast_short_gaps_are_filled_and_noted() -> None:
    series = minutes(3, lambda h: 1e5 + 500 * h, 2e3, seed=6)
    hours = (series.index.to_numpy() - T0) / HOUR
    holes = ((hours >= 10) & (hours < 12)) | ((hours >= 40.2) & (hours < 40.4))
    f = forecast_demand(series[~holes], horizon_s=6 * HOUR)
    assert f.history_points == 72  # 2 empty hourly buckets interpolated, nothing dropped
    assert any("2 empty buckets" in a and "interpolation" in a for a in f.assumptions)


def test_forecast_long_gap_drops_older_history_with_note() -> None:
    series = minutes(7, seasonal_truth, 3e4, seed=7)
    hours = (series.index.to_numpy() - T0) / HOUR
    f = forecast_demand(series[(hours < 24) | (hours >= 48)], horizon_s=6 * HOUR)
    assert f.history_points == 120
    assert any("24.0 h gap" in a and "dropped" in a for a in f.assumptions)


def test_forecast_long_gap_leaving_too_little_raises() -> None:
    series = minutes(2, lambda h: 1e5 + 0 * h, 1e3, seed=8)
    hours = (series.index.to_numpy() - T0) / HOUR
    with pytest.raises(InsufficientHistory) as err:
        forecast_demand(series[(hours < 40) | (hours >= 47.9)], horizon_s=HOUR)
    assert err.value.available < err.value.required
    assert "gap" in err.value.what


@pytest.mark.parametrize("value", [0.0, 7.0])
def test_forecast_constant_series_does_not_crash(value: float) -> None:
    series = pd.Series(np.full(1440, value), index=T0 + 60.0 * np.arange(1440))
    f = forecast_demand(series, horizon_s=HOUR, capacity=100.0)
    assert all(p[1] == pytest.approx(value, abs=1e-9) for p in f.points)
    assert f.backtest_mase is None  # the naive in-sample error is 0: MASE undefined
    assert f.time_to_saturation_s is None


def test_forecast_zero_series_records_statsmodels_warnings() -> None:
    series = pd.Series(np.zeros(1440), index=T0 + 60.0 * np.arange(1440))
    f = forecast_demand(series, horizon_s=HOUR)
    # statsmodels complains about the zero variance: recorded (once, with a count), not raised
    assert any("ETS" in w and "Warning" in w for w in f.warnings)
    assert len(f.warnings) == len(set(f.warnings))
    assert f.backtest_mape is None  # actuals at 0: MAPE withheld


def test_forecast_negative_values_clipped_with_note() -> None:
    series = minutes(0.5, lambda h: 50.0 + 0 * h, 40.0, seed=9)
    assert (series < 0).any()
    f = forecast_demand(series, horizon_s=HOUR)
    assert any("negative values" in a and "clipped" in a for a in f.assumptions)
    assert all(p[1] >= 0 and p[2] >= 0 for p in f.points)


def test_forecast_agg_max_models_bucket_peaks_above_means() -> None:
    series = minutes(0.5, lambda h: 1e4 + 0 * h, 500.0, seed=13)
    mean = forecast_demand(series, horizon_s=HOUR, capacity=2e4)
    peak = forecast_demand(series, horizon_s=HOUR, capacity=2e4, agg="max")
    assert peak.points[0][1] > mean.points[0][1] + 500.0  # max of 15 draws ~ +1.7 sd
    assert any("the max of the raw points" in a for a in peak.assumptions)
    assert any("saturation judged on bucket means" in a for a in mean.assumptions)
    assert not any("saturation judged on bucket means" in a for a in peak.assumptions)


def test_forecast_history_near_capacity_warns_of_censoring() -> None:
    series = minutes(0.5, lambda h: 0.97 + 0 * h, 0.005, seed=14).clip(upper=1.0)
    f = forecast_demand(series, horizon_s=HOUR, capacity=1.0, what="kv_usage_ratio")
    assert any("censored" in a for a in f.assumptions)


def test_forecast_datetime_index_equals_epoch_index() -> None:
    series = minutes(0.5, lambda h: 1e4 + 100 * h, 50.0, seed=10)
    as_dt = series.copy()
    as_dt.index = pd.to_datetime(series.index, unit="s", utc=True)
    a = forecast_demand(series, horizon_s=HOUR, capacity=2e4)
    b = forecast_demand(as_dt, horizon_s=HOUR, capacity=2e4)
    assert a.points == b.points and a.method == b.method
    assert a.saturation_probability == b.saturation_probability


def test_forecast_same_seed_same_result_crossing_probability() -> None:
    series = minutes(0.5, lambda h: 1e4 + 1e3 * h, 300.0, seed=11)
    a = forecast_demand(series, horizon_s=4 * HOUR, capacity=1.8e4, seed=3)
    b = forecast_demand(series, horizon_s=4 * HOUR, capacity=1.8e4, seed=3)
    assert a.saturation_probability == b.saturation_probability
    assert a.saturation_probability is not None and 0.0 <= a.saturation_probability <= 1.0


def test_forecast_baseline_only_models_argument() -> None:
    f = forecast_demand(minutes(3, seasonal_truth, 3e4), horizon_s=6 * HOUR, models=("snaive",))
    assert f.method == "seasonal naive seasonal=24 @3600s"
    assert [c.status for c in f.candidates] == ["chosen"]


def test_forecast_tiny_budget_keeps_the_simplest_model_and_says_so() -> None:
    series = minutes(0.5, lambda h: 1e4 + 0 * h, 50.0)
    f = forecast_demand(series, horizon_s=HOUR, capacity=2e4, max_seconds=1e-6)
    assert f.method.startswith("naive")
    assert len(f.candidates) == 4
    assert all(c.status.startswith("skipped") for c in f.candidates[1:])
    assert "time budget" in f.saturation_note and f.saturation_probability is None


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"horizon_s": 0.0}, "horizon_s"),
        ({"horizon_s": math.nan}, "horizon_s"),
        ({"horizon_s": HOUR, "level": 1.5}, "level"),
        ({"horizon_s": HOUR, "level": 0.0}, "level"),
        ({"horizon_s": HOUR, "capacity": -1.0}, "capacity"),
        ({"horizon_s": HOUR, "max_seconds": 0.0}, "max_seconds"),
        ({"horizon_s": HOUR, "models": ("prophet",)}, "prophet"),
        ({"horizon_s": HOUR, "agg": "median"}, "agg"),
        ({"horizon_s": 1e9}, "horizon_s"),
    ],
)
def test_forecast_bad_argument_raises_config_error(kwargs: dict[str, object], needle: str) -> None:
    series = minutes(0.5, lambda h: 1e4 + 0 * h, 50.0)
    with pytest.raises(ConfigError, match=needle):
        forecast_demand(series, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("series", "needle"),
    [
        (pd.Series(np.ones(50), index=[f"x{i}" for i in range(50)]), "index"),
        (pd.Series(["a"] * 50, index=T0 + 60.0 * np.arange(50)), "numeric"),
        ([1.0, 2.0, 3.0], "pandas Series"),
    ],
)
def test_forecast_bad_series_raises_series_error(series: object, needle: str) -> None:
    with pytest.raises(SeriesError, match=needle):
        forecast_demand(series, horizon_s=HOUR)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("n", "steps", "train_min"),
    [(168, 24, 48), (72, 24, 48), (168, 168, 48), (72, 1, 16), (30, 12, 16), (24, 6, 16)],
)
def test_plan_backtest_origins_leave_training_and_end_at_history_end(
    n: int, steps: int, train_min: int
) -> None:
    hb, origins = plan_backtest(n, steps, train_min)
    assert 1 <= hb <= steps
    assert origins == sorted(origins) and origins[0] >= train_min
    assert origins[-1] + hb == n
    assert len(origins) >= 3 or hb == 1


def test_plan_backtest_no_room_returns_empty() -> None:
    assert plan_backtest(48, 24, 48) == (0, [])


def _gauge(source: str, start: float, mean: float, signal: str = "kv_cache_usage_ratio") -> Window:
    return Window(source, signal, labels_of({"engine": "0"}), start, 60.0, "gauge", 4, mean=mean)


def test_demand_series_from_windows_sums_engines_times_capacity() -> None:
    windows = [
        _gauge("a:8000", T0, 0.5),
        _gauge("a:8000", T0 + 60, 0.6),
        _gauge("a:8000", T0 + 180, 0.8),  # T0 + 120 missing: interpolated inside a's lifetime
        _gauge("b:8000", T0 + 120, 0.25),  # b joins later: contributes 0 before
        _gauge("b:8000", T0 + 180, 0.25),
        _gauge("a:8000", T0, 99.0, signal="requests_running"),  # other signal: ignored
    ]
    s = demand_series_from_windows(windows, capacity_tokens={"a:8000": 1000, "b:8000": 4000})
    assert list(s.index) == [T0, T0 + 60, T0 + 120, T0 + 180]
    assert list(s) == pytest.approx([500.0, 600.0, 700.0 + 1000.0, 800.0 + 1000.0])
    assert s.name == "kv_cache_usage_ratio"


def test_demand_series_from_windows_request_rate_from_counter_and_histogram() -> None:
    lbl = labels_of({"engine": "0"})
    windows = [
        Window("a", "request_success_total", lbl, T0, 60.0, "counter", 4, delta=120.0, rate=2.0),
        Window("b", "request_success_total", lbl, T0, 60.0, "counter", 4, delta=60.0, rate=1.0),
        Window("a", "e2e_latency_seconds", lbl, T0, 60.0, "histogram", 4, delta=30.0),
    ]
    rate = demand_series_from_windows(windows, signal="request_success_total")
    assert list(rate) == [3.0]
    hist = demand_series_from_windows(windows, signal="e2e_latency_seconds")
    assert list(hist) == [0.5]


def test_demand_series_from_windows_missing_capacity_names_source() -> None:
    with pytest.raises(SeriesError, match="b:8000"):
        demand_series_from_windows(
            [_gauge("a:8000", T0, 0.5), _gauge("b:8000", T0, 0.5)], capacity_tokens={"a:8000": 1}
        )


def test_demand_series_from_windows_no_matching_windows_raises() -> None:
    with pytest.raises(SeriesError, match="no windows"):
        demand_series_from_windows([_gauge("a", T0, 0.5)], signal="requests_waiting")


def test_demand_series_from_windows_feeds_forecast() -> None:
    rng = np.random.default_rng(12)
    windows = [
        _gauge(src, T0 + 60 * i, float(np.clip(0.3 + 0.0004 * i + rng.normal(0, 0.01), 0, 1)))
        for i in range(8 * 60)
        for src in ("a", "b")
    ]
    s = demand_series_from_windows(windows, capacity_tokens=50_000.0)
    f = forecast_demand(s, horizon_s=2 * HOUR, capacity=100_000.0)
    assert f.raw_points == 480 and f.points[0][1] > 0.3 * 100_000


@pytest.mark.slow
def test_forecast_interval_calibration_study_over_seeds() -> None:
    """Over 10 seeds: backtest coverage and true out-of-sample coverage near 90 %."""
    sd_hour = 3e4 / math.sqrt(60)  # noise of an hourly mean of 60 one-minute points
    backtest: list[float] = []
    true_cov: list[float] = []
    for seed in range(10):
        f = forecast_demand(minutes(7, seasonal_truth, 3e4, seed=100 + seed), horizon_s=86_400)
        assert f.backtest_coverage is not None
        backtest.append(f.backtest_coverage)
        truth = bucket_truth(f, seasonal_truth)
        norm = NormalDist(0.0, sd_hour)
        true_cov.extend(
            norm.cdf(hi - mu) - norm.cdf(lo - mu)
            for (_, _, lo, hi), mu in zip(f.points, truth, strict=True)
        )
    assert 0.8 <= float(np.mean(backtest)) <= 0.97
    assert 0.8 <= float(np.mean(true_cov)) <= 0.97
