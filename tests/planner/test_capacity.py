"""Capacity at the SLO (planner/fit/capacity.py): per unit, between modes, and its coverage."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from core.errors import ConfigError
from planner.domain.slo import Slo
from planner.fit.capacity import MIN_BIN, fit_capacity, unit_capacity, violations, welch
from planner.fit.units import unit_keys
from tests.planner.verdictsynth import TRUE_SLO_MULTIPLE, cluster_frame


def _fit(frame: pd.DataFrame, mode: str = "native", **kw: object) -> object:
    return fit_capacity(frame, unit_keys(frame, kw.pop("pools", None)), mode=mode, **kw)  # type: ignore[arg-type]


def test_unit_capacity_step_in_misses_is_found_between_two_windows() -> None:
    load = np.linspace(1000, 20000, 240)
    missed = load > 12_000
    value, status = unit_capacity(load, missed)
    assert status == "measured"
    assert abs(value - 12_000) <= (20_000 - 1000) / 239  # within one window's load step


def test_unit_capacity_sparse_middle_loads_do_not_pull_the_crossing() -> None:
    # a diurnal load: many windows at low and at high load, few in between; the misses start
    # at 6,500. Binned interpolation put this near the middle of the gap (~5,000).
    rng = np.random.default_rng(7)
    load = np.r_[rng.uniform(500, 4000, 120), rng.uniform(6000, 9000, 120)]
    missed = load > 6500
    value, status = unit_capacity(load, missed)
    below, above = load[load <= 6500].max(), load[load > 6500].min()
    assert status == "measured" and value == pytest.approx((below + above) / 2)


def _brute_crossing(x: np.ndarray, m: np.ndarray) -> float:
    """The monotone (non-decreasing) least-squares fit by enumeration of its level sets:
    PAVA's answer for 0/1 data is the max-min formula f_i = max_{a<=i} min_{b>=i} mean(m[a..b])."""
    o = np.argsort(x, kind="stable")
    xs, ms = x[o], m[o].astype(float)
    n = xs.size
    cum = np.r_[0.0, np.cumsum(ms)]
    f = np.array([max(min((cum[b + 1] - cum[a]) / (b + 1 - a) for b in range(i, n))
                      for a in range(i + 1)) for i in range(n)])  # fmt: skip
    i = int(np.flatnonzero(f > 0.5)[0])
    return float((xs[i - 1] + xs[i]) / 2)


@pytest.mark.parametrize("seed", range(6))
def test_unit_capacity_matches_a_brute_force_monotone_fit(seed: int) -> None:
    rng = np.random.default_rng(seed)
    load = rng.uniform(1000, 20000, 60)
    missed = rng.random(60) < 1 / (1 + np.exp(-(load - 11_000) / 2500))
    value, status = unit_capacity(load, missed)
    assert status == "measured"
    assert value == pytest.approx(_brute_crossing(load, missed))


@pytest.mark.parametrize(
    ("missed", "status", "rank"),
    [
        # never missed: a lower bound at the MIN_BIN-th highest load, not the single highest
        (np.zeros(240, bool), "above", -MIN_BIN),
        # always missed: an upper bound at the MIN_BIN-th lowest load
        (np.ones(240, bool), "below", MIN_BIN - 1),
    ],
)
def test_unit_capacity_without_a_crossing_is_a_bound(
    missed: np.ndarray, status: str, rank: int
) -> None:
    load = np.linspace(1000, 20000, 240)
    got, kind = unit_capacity(load, missed)
    assert (kind, got) == (status, load[rank])


def test_unit_capacity_noisy_misses_are_made_monotone_in_load() -> None:
    rng = np.random.default_rng(3)
    load = rng.uniform(1000, 20000, 400)
    missed = rng.random(400) < 1 / (1 + np.exp(-(load - 12_000) / 800))  # logistic, 1/2 at 12k
    value, status = unit_capacity(load, missed)
    assert status == "measured" and abs(value - 12_000) < 1500


def test_unit_capacity_too_few_windows_is_nan() -> None:
    value, status = unit_capacity(np.arange(10.0) + 1, np.zeros(10, bool))
    assert math.isnan(value) and status == "too few windows"


def test_violations_ttft_over_target_or_queue_growing() -> None:
    frame = pd.DataFrame(
        {
            "source": ["a"] * 4 + ["b"] * 2,
            "engine": ["0"] * 6,
            "start": [0.0, 60.0, 120.0, 180.0, 0.0, 60.0],
            "ttft_p90_s": [0.5, 3.0, 0.5, 0.5, 0.5, 0.5],
            "waiting": [0.0, 0.0, 10.0, 10.5, 0.0, 0.0],
            "requests": [100.0] * 6,
        }
    )
    # window 1: TTFT over 2 s; window 2: the queue rose by 10 (> 5 % of 100 requests);
    # window 3: it rose by 0.5 only; engine b's first window has no previous one
    assert violations(frame, Slo(2.0)).tolist() == [False, True, True, False, False, False]


@pytest.mark.parametrize(("ttft", "quantile"), [(0.0, "p90"), (-1.0, "p90"), (2.0, "p95")])
def test_slo_bad_values_raise_naming_the_field(ttft: float, quantile: str) -> None:
    with pytest.raises(ConfigError, match="SLO"):
        Slo(ttft, quantile)


def test_welch_equals_scipy_unequal_variance_interval() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.2, 0.1, 3), rng.normal(0.0, 0.3, 5)
    diff, df, (lo, hi) = welch(a, b, 0.9)
    ref = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.9)
    assert diff == pytest.approx(a.mean() - b.mean())
    assert (lo, hi) == pytest.approx((ref.low, ref.high))
    assert df == pytest.approx(stats.ttest_ind(a, b, equal_var=False).df)


def test_fit_capacity_recovers_the_ratio_between_modes() -> None:
    frame = cluster_frame(["none"] * 3 + ["native"] * 3, ratio={"native": 1.3}, seed=1, peak=2.0)
    c = _fit(frame)
    assert c.can_tell and c.bound == ""  # type: ignore[attr-defined]
    assert c.interval.lo < 1.3 < c.interval.hi  # type: ignore[attr-defined]
    assert c.none_capacity == pytest.approx(10_000 * TRUE_SLO_MULTIPLE, rel=0.1)  # type: ignore[attr-defined]
    assert (c.units_treated, c.units_control) == (3, 3)  # type: ignore[attr-defined]


def test_fit_capacity_one_unit_per_arm_cannot_tell_and_says_what_settles_it() -> None:
    frame = cluster_frame(["none", "none", "native"], ratio={"native": 1.3}, seed=2)
    c = _fit(frame)
    assert not c.can_tell and "at least 2" in c.why and "switchback" in c.settle  # type: ignore[attr-defined]


def test_fit_capacity_engines_of_one_pool_are_one_unit() -> None:
    modes = ["none"] * 3 + ["lmcache"] * 2
    frame = cluster_frame(modes, ratio={"lmcache": 1.3}, seed=3, pools={3: "p", 4: "p"})
    c = _fit(frame, mode="lmcache", pools={"e3": "p", "e4": "p"})
    assert c.units_treated == 1 and not c.can_tell  # type: ignore[attr-defined]
    unmapped = _fit(frame, mode="lmcache")  # no mapping: counted as one unknown pool
    assert unmapped.units_treated == 1 and not unmapped.can_tell  # type: ignore[attr-defined]


def test_fit_capacity_offload_never_saturating_gives_a_lower_bound() -> None:
    frame = cluster_frame(["none"] * 3 + ["native"] * 3, ratio={"native": 2.0}, seed=4)
    c = _fit(frame)
    assert c.can_tell and c.bound == "lower" and math.isinf(c.interval.hi)  # type: ignore[attr-defined]
    assert 1.0 < c.interval.lo < 2.0  # type: ignore[attr-defined]


def test_fit_capacity_no_saturation_without_offload_cannot_tell() -> None:
    frame = cluster_frame(["none"] * 3 + ["native"] * 3, ratio={"native": 1.0}, seed=5, peak=0.6)
    c = _fit(frame)
    assert not c.can_tell and "never missed" in c.why  # type: ignore[attr-defined]


def _coverage(ratio: float, reps: int) -> tuple[float, float]:
    covered = claimed = 0
    for seed in range(reps):
        frame = cluster_frame(["none"] * 3 + ["native"] * 3, ratio={"native": ratio},
                              seed=1000 + seed, unit_sd=0.08, peak=2.0)  # fmt: skip
        c = _fit(frame)
        assert c.can_tell and c.bound == ""  # type: ignore[attr-defined]
        covered += c.interval.lo <= ratio <= c.interval.hi  # type: ignore[attr-defined]
        claim = c.claim_interval  # type: ignore[attr-defined]
        claimed += claim.lo > 1 or claim.hi < 1
    return covered / reps, claimed / reps


def test_fit_capacity_interval_covers_the_true_ratio_near_nominal() -> None:
    covered, _ = _coverage(1.2, 120)
    # nominal 0.9; 120 replicates: 3 binomial SDs ≈ 0.08
    assert covered >= 0.82


def test_fit_capacity_null_ratio_rarely_claims() -> None:
    _, claimed = _coverage(1.0, 120)
    # nominal 0.05 for a 95 % claim interval; 3 binomial SDs ≈ 0.06
    assert claimed <= 0.11
