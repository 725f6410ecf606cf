"""planner.fit.hitrate: LMCache L1 hit ratio vs size (binomial GLM, natural spline in ln C),
against a known saturating curve and brute-force covariances."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import patsy  # type: ignore[import-untyped]
import pytest
from scipy.optimize import brentq
from scipy.special import expit

from benchmarks.accuracy.fitsynth import Truth, synthetic_frame
from core.errors import ConfigError, InsufficientHistory
from planner.fit.hitrate import HitRateFit, fit_hitrate, hac_lags

TRUTH = Truth()


def curve(c: float) -> float:
    return TRUTH.h_max * (1 - math.exp(-c / TRUTH.c0_bytes))


def true_size_for(hit: float) -> float:
    return -TRUTH.c0_bytes * math.log(1 - hit / TRUTH.h_max)


def test_fit_hitrate_many_pools_cluster_and_recover_curve_and_sizes() -> None:
    # 36 engines, every third on LMCache: 12 pools carry CR1 for the 6-df spline
    fit = fit_hitrate(synthetic_frame(36, 720, seed=3), target_fraction=0.9, target_hit=0.5)
    assert fit.can_tell, fit.why
    assert (fit.cov_type, fit.clusters, fit.spline_df) == ("cluster", 12, 6)
    assert "CR1 by LMCache pool (12 pools), t(11)" in fit.method
    assert any("clustered by LMCache pool (12 sources" in a for a in fit.assumptions)
    c_max = fit.size_range[1]
    assert fit.interval.covers(true_size_for(0.9 * curve(c_max)))
    assert fit.interval.hi / fit.interval.lo < 1.1
    assert fit.size_for_target_hit is not None
    assert fit.size_for_target_hit.interval.covers(true_size_for(0.5))
    assert fit.hit_at_largest.value == pytest.approx(curve(c_max), abs=0.005)
    sizes = np.array([2e9, 8e9, 30e9])
    np.testing.assert_allclose(fit.curve(sizes), [curve(c) for c in sizes], atol=0.005)
    assert fit.warnings == ()


def test_fit_hitrate_few_pools_allow_correlation_within_each_pool() -> None:
    # 4 pools cannot carry a cluster-robust covariance of 6 coefficients (rank <= 3)
    fit = fit_hitrate(synthetic_frame(12, 720, seed=3), target_hit=0.5)
    assert fit.can_tell, fit.why
    assert (fit.cov_type, fit.clusters, fit.spline_df) == ("HAC", 4, 6)
    assert any("allow correlation between a pool's windows" in a and "needs 7" in a
               for a in fit.assumptions)  # fmt: skip
    assert fit.size_for_target_hit is not None
    assert fit.size_for_target_hit.interval.covers(true_size_for(0.5))
    sizes = np.array([2e9, 8e9, 30e9])
    np.testing.assert_allclose(fit.curve(sizes), [curve(c) for c in sizes], atol=0.005)


def _brute_cov(fit: HitRateFit, frame: pd.DataFrame) -> np.ndarray:
    """CR1 / HAC of the binomial GLM from its definition: B from patsy's own
    ``cr(x, df=k) - 1``, scores n_i(h_i − p_i)b_i summed per pool (CR1) or Newey–West with
    Bartlett weights over each pool's time-ordered series (HAC), bread
    (Σ n_i p_i(1 − p_i) b_i b_i')^-1 and the small-sample factor."""
    d = frame.dropna(subset=["l1_usage_bytes", "lmcache_hit_ratio"])
    d = d.sort_values(["source", "start"], kind="stable")
    lc = np.log(d["l1_usage_bytes"].to_numpy())
    b = np.asarray(patsy.dmatrix(f"cr(lc, df={fit.spline_df}) - 1", {"lc": lc}))
    n_tok, h = d["lmcache_requested_tokens"].to_numpy(), d["lmcache_hit_ratio"].to_numpy()
    p = expit(b @ np.asarray(fit.coef))
    scores = b * (n_tok * (h - p))[:, None]
    assert np.abs(scores.sum(axis=0)).max() < 1e-6 * np.abs(scores).sum()  # the MLE
    bread = np.linalg.inv((b * (n_tok * p * (1 - p))[:, None]).T @ b)
    n, k = b.shape
    if fit.cov_type == "cluster":
        pools = pd.factorize(d["source"])[0]
        summed = np.array([scores[pools == g].sum(axis=0) for g in range(pools.max() + 1)])
        g = summed.shape[0]
        meat, factor = summed.T @ summed, g / (g - 1) * (n - 1) / (n - k)
    else:
        lags = hac_lags(n)
        pools = pd.factorize(d["source"])[0]
        meat = np.zeros((k, k))
        for g in range(pools.max() + 1):
            sg = scores[pools == g]
            meat += sg.T @ sg
            for lag in range(1, lags + 1):
                gamma = sg[lag:].T @ sg[:-lag]
                meat += (1 - lag / (lags + 1)) * (gamma + gamma.T)
        factor = n / (n - k)  # statsmodels' small-sample correction of hac-panel
    out: np.ndarray = bread @ meat @ bread * factor
    return out


@pytest.mark.parametrize(("engines", "kind"), [(36, "cluster"), (12, "HAC")])
def test_fit_hitrate_covariance_equals_the_brute_force_sandwich(engines: int, kind: str) -> None:
    frame = synthetic_frame(engines, 240, seed=5)
    fit = fit_hitrate(frame)
    assert fit.cov_type == kind
    np.testing.assert_allclose(np.asarray(fit.coef_cov), _brute_cov(fit, frame), rtol=1e-7)


def _root(fit: HitRateFit, coef: np.ndarray, fraction: float) -> float:
    """ln C where the curve with coefficients ``coef`` reaches ``fraction`` of its value at
    the largest size seen."""
    f = dataclasses.replace(fit, coef=tuple(coef.tolist()))
    lo, hi = (math.log(x) for x in fit.size_range)
    goal = fraction * float(f.curve([fit.size_range[1]])[0])
    return float(brentq(lambda x: float(f.curve([math.exp(x)])[0]) - goal, lo, hi, xtol=1e-13))


def test_fit_hitrate_size_interval_is_the_delta_method_of_the_root() -> None:
    # ln C* as a function of the coefficients, differentiated numerically: its standard
    # error gives the interval's half-width on the log scale
    fit = fit_hitrate(synthetic_frame(36, 240, seed=5), target_fraction=0.8)
    beta = np.asarray(fit.coef)
    step = 1e-6
    grad = np.array([
        (_root(fit, beta + step * e, 0.8) - _root(fit, beta - step * e, 0.8)) / (2 * step)
        for e in np.eye(beta.size)
    ])  # fmt: skip
    se = math.sqrt(grad @ np.asarray(fit.coef_cov) @ grad)
    assert math.log(fit.estimate) == pytest.approx(_root(fit, beta, 0.8), abs=1e-9)
    half = math.log(fit.interval.hi / fit.interval.lo) / 2
    assert half == pytest.approx(fit.t_crit * se, rel=1e-4)


def test_fit_hitrate_predictions_flag_extrapolation_and_match_the_curve() -> None:
    sizes = [2e9, 8e9, 30e9, 200e9]
    fit = fit_hitrate(synthetic_frame(12, 720, seed=3), sizes=sizes)
    assert [p.size_bytes for p in fit.predictions] == sizes
    for p in fit.predictions:
        assert 0.0 < p.interval.lo <= p.hit_ratio <= p.interval.hi < 1.0
    assert [p.extrapolated for p in fit.predictions] == [False, False, False, True]
    np.testing.assert_allclose(fit.curve(sizes), [p.hit_ratio for p in fit.predictions])
    lo, hi = fit.curve_interval(sizes)
    np.testing.assert_allclose(lo, [p.interval.lo for p in fit.predictions])
    np.testing.assert_allclose(hi, [p.interval.hi for p in fit.predictions])


def test_fit_hitrate_target_outside_the_curve_seen_has_no_size() -> None:
    frame = synthetic_frame(12, 720, seed=3)
    above = fit_hitrate(frame, target_hit=0.9)  # the curve tops out near 0.6
    assert above.size_for_target_hit is not None
    assert math.isinf(above.size_for_target_hit.value)
    below = fit_hitrate(frame, target_hit=1e-4)  # reached at the smallest size seen
    assert below.size_for_target_hit is not None
    assert math.isnan(below.size_for_target_hit.value)
    assert below.size_for_target_hit.interval.hi == below.size_range[0]


def test_fit_hitrate_sizes_past_saturation_cannot_tell() -> None:
    rng = np.random.default_rng(1)
    n = 400
    frame = pd.DataFrame({
        "source": "a", "engine": "0",
        "l1_usage_bytes": rng.uniform(100e9, 120e9, n),  # far past saturation: flat
        "lmcache_hit_ratio": 0.6 + rng.normal(0, 0.02, n),
        "lmcache_requested_tokens": 1e5,
    })  # fmt: skip
    fit = fit_hitrate(frame)
    assert not fit.can_tell
    assert "not pinned down" in fit.why


def test_fit_hitrate_constant_size_cannot_tell() -> None:
    frame = synthetic_frame(12, 200, seed=3).assign(l1_usage_bytes=5e9)
    fit = fit_hitrate(frame)
    assert not fit.can_tell and "barely varies" in fit.why
    assert fit.coef == () and np.isnan(fit.curve([5e9])).all()


def test_fit_hitrate_only_evicting_keeps_windows_at_capacity() -> None:
    frame = synthetic_frame(12, 720, seed=3)
    every = fit_hitrate(frame)
    full = fit_hitrate(frame, only_evicting=True, min_windows=10)
    evicting = int((frame["l1_evicted_chunks"] > 0).sum())
    assert full.n == evicting < every.n
    assert every.evicting_share == pytest.approx(evicting / every.n)


def test_fit_hitrate_no_lmcache_windows_raises_insufficient_history() -> None:
    frame = synthetic_frame(4, 100, seed=0, modes=("none", "native"))
    with pytest.raises(InsufficientHistory) as err:
        fit_hitrate(frame, min_windows=30)
    assert (err.value.required, err.value.available) == (30, 0)


@pytest.mark.parametrize(("kw", "match"), [({"target_fraction": 1.0}, "target_fraction"),
                                           ({"target_hit": 0.0}, "target_hit"),
                                           ({"spline_df": 1}, "spline_df"),
                                           ({"level": 1.5}, "level")])  # fmt: skip
def test_fit_hitrate_bad_arguments_are_config_errors(kw: dict[str, float], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        fit_hitrate(synthetic_frame(3, 50), **kw)  # type: ignore[arg-type]
