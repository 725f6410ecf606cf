"""planner.forecast.data.rebucket: a series on the buckets of a given cadence (as prepare)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from planner.forecast.data import SeriesError, prepare, rebucket

T0 = 1_699_920_000.0  # a UTC midnight


def test_rebucket_same_cadence_equals_prepare_buckets() -> None:
    rng = np.random.default_rng(1)
    t = T0 + 60.0 * np.arange(6 * 60)  # 6 h of 1-min points: prepare picks 5-min buckets
    series = pd.Series(1e5 + rng.normal(0, 1e3, t.size), index=t)
    prep = prepare(series, what="kv", agg="max")
    assert prep.cadence_s == 300.0
    got = rebucket(series, 300.0, agg="max")
    assert list(got) == prep.times.tolist()
    assert list(got.values()) == prep.values.tolist()


def test_rebucket_max_partial_ends_dropped_empty_buckets_absent() -> None:
    # 1-min points from 00:03 to 00:21, none in 00:10-00:15: buckets 00:00 (2 of 5 points:
    # partial, dropped), 00:05 (full), 00:10 (empty), 00:15 (full), 00:20 (2 points: dropped)
    minutes = [m for m in range(3, 22) if not 10 <= m < 15]
    series = pd.Series([float(m) for m in minutes], index=[T0 + 60.0 * m for m in minutes])
    assert rebucket(series, 300.0, agg="max") == {T0 + 300: 9.0, T0 + 900: 19.0}
    assert rebucket(series, 300.0) == {T0 + 300: 7.0, T0 + 900: 17.0}
    assert rebucket(pd.Series([], dtype=float), 300.0) == {}


@pytest.mark.parametrize(("cadence", "agg"), [(0.0, "max"), (float("nan"), "max"), (60.0, "p99")])
def test_rebucket_bad_argument_raises_series_error(cadence: float, agg: str) -> None:
    with pytest.raises(SeriesError):
        rebucket(pd.Series([1.0], index=[T0]), cadence, agg=agg)
