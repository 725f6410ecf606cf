"""planner.forecast.saturation.rule_of_three: a simulated P(saturation) of exactly 0 or 1 gets
the 95 % rule-of-three bound (Hanley & Lippman-Hand 1983), on a table and on real forecasts
where no path / every path saturates."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from planner.forecast.demand import forecast_demand
from planner.forecast.saturation import rule_of_three

T0 = 1_699_920_000.0
HOUR = 3600.0


@pytest.mark.parametrize(
    ("p", "paths", "lo", "hi"),
    [
        (0.0, 1000, 0.0, 0.003),
        (1.0, 1000, 0.997, 1.0),
        (0.0, 200, 0.0, 0.015),
        (1.0, 200, 0.985, 1.0),
        (0.0, 2, 0.0, 1.0),  # 3/paths capped at 1
    ],
)
def test_rule_of_three_none_or_all_paths_gives_the_bound(
    p: float, paths: int, lo: float, hi: float
) -> None:
    b = rule_of_three(p, paths)
    assert b is not None
    assert (b["lo"], b["hi"]) == (pytest.approx(lo), pytest.approx(hi))
    assert b["level"] == 0.95 and b["paths"] == paths
    assert b["saturating_paths"] == (0 if p == 0.0 else paths)
    assert "Hanley & Lippman-Hand 1983" in b["method"]


@pytest.mark.parametrize(("p", "paths"), [(0.5, 1000), (0.001, 1000), (None, 1000),
                                          (0.0, None), (1.0, None), (0.0, 0)])  # fmt: skip
def test_rule_of_three_inner_or_unsimulated_probability_gives_none(
    p: float | None, paths: int | None
) -> None:
    assert rule_of_three(p, paths) is None


def _series(slope_per_h: float, seed: int) -> pd.Series:
    rng = np.random.default_rng(seed)
    t = T0 + 60.0 * np.arange(720)  # 12 h of minutes
    return pd.Series(2e5 + slope_per_h * (t - T0) / HOUR + rng.normal(0, 1e3, t.size), index=t)


@pytest.mark.parametrize(
    ("slope", "capacity", "horizon_h", "p"),
    [(0.0, 1e7, 2, 0.0), (1e4, 2e5 + 1e4 * 15, 24, 1.0)],  # far below / crossing in ~3 h
)
def test_rule_of_three_on_real_forecasts_none_or_all_saturate(
    slope: float, capacity: float, horizon_h: float, p: float
) -> None:
    f = forecast_demand(_series(slope, 7), horizon_s=horizon_h * HOUR, capacity=capacity,
                        seed=0, max_seconds=60)  # fmt: skip
    assert f.saturation_probability == p and f.saturation_paths
    assert f.saturation_probability_se == 0.0  # the error that overstates certainty
    b = rule_of_three(f.saturation_probability, f.saturation_paths)
    assert b is not None
    width = 3 / f.saturation_paths
    assert (b["lo"], b["hi"]) == ((0.0, width) if p == 0.0 else (1 - width, 1.0))


def test_rule_of_three_already_saturated_is_not_simulated_so_no_bound() -> None:
    f = forecast_demand(_series(0.0, 5), horizon_s=HOUR, capacity=5e4, seed=0, max_seconds=60)
    assert f.saturation_probability == 1.0 and f.saturation_paths is None
    assert rule_of_three(f.saturation_probability, f.saturation_paths) is None
