"""planner.fit.preempt: the preemption knee, recovered from data whose truth is known."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm

from benchmarks.accuracy.fitsynth import Truth, synthetic_frame
from core.errors import InsufficientHistory
from planner.fit.common import engine_groups
from planner.fit.preempt import _bin, _collapse, _design, _fit_glm, _robust_cov, fit_preemption

TRUTH = Truth()


def overdispersed(frame: pd.DataFrame, alpha: float, seed: int) -> pd.DataFrame:
    """Same utilization, preemptions drawn NegBin2(μ, α) (gamma-mixed Poisson)."""
    rng = np.random.default_rng(seed)
    u = frame["kv_util"].to_numpy()
    mu = (
        frame["window_s"].to_numpy()
        * TRUTH.base_rate_per_s
        * np.exp(TRUTH.slope * np.maximum(0.0, u - TRUTH.knee))
    )
    mix = rng.gamma(1.0 / alpha, alpha, u.size)
    return frame.assign(preemptions=rng.poisson(mu * mix).astype(float))


def test_fit_preemption_synthetic_knee_interval_covers_truth_and_is_narrow() -> None:
    fit = fit_preemption(synthetic_frame(12, 720, seed=3))
    assert fit.can_tell, fit.why
    assert fit.interval.covers(TRUTH.knee)
    assert fit.interval.width < 0.08
    assert fit.slope.interval.covers(TRUTH.slope)
    assert fit.base_rate.interval.covers(TRUTH.base_rate_per_s)
    assert fit.family == "poisson"
    assert (fit.cov_type, fit.clusters) == ("cluster", 12)
    assert "CR1 by engine (12 engines), t(11)" in fit.method
    assert fit.n == 12 * 720
    assert fit.warnings == ()
    assert min(lr for _, lr in fit.profile) == 0.0


def test_fit_preemption_few_engines_cluster_and_say_the_bias() -> None:
    fit = fit_preemption(synthetic_frame(4, 720, seed=3))
    assert (fit.cov_type, fit.clusters) == ("cluster", 4)
    assert any("clustered by engine (4 engines" in a and "biased down" in a
               for a in fit.assumptions)  # fmt: skip
    assert fit.slope.interval.covers(TRUTH.slope)


def test_fit_preemption_one_engine_treats_windows_as_independent() -> None:
    fit = fit_preemption(synthetic_frame(1, 3000, seed=3))
    assert (fit.cov_type, fit.clusters) == ("HC0", 1)
    assert any("treat its windows as independent" in a for a in fit.assumptions)
    assert "HC0 Wald" in fit.method


def peak_driven(frame: pd.DataFrame, seed: int) -> pd.DataFrame:
    """Preemptions driven by the window's *peak* utilization (what a dense scrape's
    ``kv_util_max`` measures): peak = mean + a random excursion, the hinge on the peak."""
    rng = np.random.default_rng(seed)
    u = frame["kv_util"].to_numpy() * 0.8
    peak = np.minimum(u + rng.gamma(2.0, 0.06, u.size), 1.0)
    mu = (
        frame["window_s"].to_numpy()
        * TRUTH.base_rate_per_s
        * np.exp(TRUTH.slope * np.maximum(0.0, peak - TRUTH.knee))
    )
    return frame.assign(kv_util=u, kv_util_max=peak, preemptions=rng.poisson(mu).astype(float))


def test_fit_preemption_on_the_peak_column_recovers_a_peak_driven_knee() -> None:
    frame = peak_driven(synthetic_frame(12, 720, seed=6), seed=6)
    fit = fit_preemption(frame, util="kv_util_max")
    assert fit.can_tell, fit.why
    assert fit.util_column == fit.unit == "kv_util_max"
    assert fit.interval.covers(TRUTH.knee)
    assert fit.slope.interval.covers(TRUTH.slope)
    assert "kv_util_max in [" in fit.basis[1]
    # The window mean only blurs what drives the preemptions: no sharper knee from it.
    mean = fit_preemption(frame)
    assert mean.util_column == "kv_util"
    assert not mean.can_tell or mean.interval.width > fit.interval.width


def test_fit_preemption_rate_falling_to_the_lowest_utilization_says_no_flat_base() -> None:
    # Log-linear throughout (the demo's shape): no flat base rate, the knee's lower end is open.
    frame = synthetic_frame(12, 720, seed=8)
    mu = frame["window_s"].to_numpy() * 0.05 * np.exp(8.0 * (frame["kv_util"].to_numpy() - 0.9))
    frame = frame.assign(preemptions=np.random.default_rng(8).poisson(mu).astype(float))
    fit = fit_preemption(frame)
    assert not fit.can_tell
    assert "lower end is not bounded" in fit.why
    assert "keeps falling down to the lowest kv_util seen" in fit.why


def test_fit_preemption_overdispersed_counts_switch_to_negative_binomial() -> None:
    frame = overdispersed(synthetic_frame(12, 720, seed=4), alpha=1.5, seed=4)
    fit = fit_preemption(frame)
    assert fit.family == "negative_binomial"
    assert fit.dispersion_p < 0.05
    assert fit.dispersion_alpha == pytest.approx(1.5, rel=0.5)
    assert fit.interval.covers(TRUTH.knee)
    assert "negative_binomial" in fit.method


def test_fit_preemption_no_preemptions_cannot_tell_and_says_where_they_would_start() -> None:
    frame = synthetic_frame(4, 100, seed=1).assign(preemptions=0.0)
    fit = fit_preemption(frame)
    assert not fit.can_tell
    assert "no preemptions" in fit.why and "above the largest kv_util" in fit.why
    assert math.isnan(fit.estimate) and math.isnan(fit.interval.lo)


def test_fit_preemption_constant_utilization_cannot_tell() -> None:
    frame = synthetic_frame(4, 100, seed=1).assign(kv_util=0.9, preemptions=1.0)
    fit = fit_preemption(frame)
    assert not fit.can_tell and "barely varies" in fit.why


def test_fit_preemption_knee_above_observed_range_is_not_bounded() -> None:
    # Utilization never reaches the knee: the profile is flat, no interval end is found.
    frame = synthetic_frame(6, 400, seed=2)
    frame = frame.assign(kv_util=frame["kv_util"] * 0.6)
    frame = frame.assign(preemptions=np.random.default_rng(2).poisson(0.02, len(frame)) * 1.0)
    fit = fit_preemption(frame)
    assert not fit.can_tell
    assert "not bounded" in fit.why or "no detectable rise" in fit.why


@pytest.mark.parametrize(
    ("frame", "available"),
    [
        (synthetic_frame(2, 50, seed=0), 100),
        (synthetic_frame(2, 50, seed=0).drop(columns="preemptions"), 0),
        (synthetic_frame(2, 80, seed=0).assign(kv_util=np.nan), 0),
    ],
)
def test_fit_preemption_short_history_raises_insufficient_history(
    frame: pd.DataFrame, available: int
) -> None:
    with pytest.raises(InsufficientHistory) as err:
        fit_preemption(frame, min_windows=120)
    assert (err.value.required, err.value.available) == (120, available)


@pytest.mark.parametrize("alpha", [0.0, 0.5])
@pytest.mark.parametrize("cluster", [True, False])
def test_glm_and_robust_cov_on_cells_equal_statsmodels_glm_on_the_windows(
    alpha: float, cluster: bool
) -> None:
    # the binned cells are exact sufficient statistics: the fit on a few hundred cells is
    # the fit on the 3,600 windows
    frame = synthetic_frame(12, 300, seed=5)
    u = _bin(frame["kv_util"].to_numpy(), 2000)
    y, t = frame["preemptions"].to_numpy(), frame["window_s"].to_numpy()
    g = engine_groups(frame)
    beta, _ = _fit_glm(_collapse(u, t, y, g, by_engine=False), 0.85, alpha, None, 100)
    cov = _robust_cov(_collapse(u, t, y, g, by_engine=True), 0.85, beta, alpha, cluster)
    family = sm.families.Poisson() if alpha == 0 else sm.families.NegativeBinomial(alpha=alpha)
    model = sm.GLM(y, _design(u, 0.85), family=family, offset=np.log(t))
    ref = (model.fit(cov_type="cluster", cov_kwds={"groups": g}) if cluster
           else model.fit(cov_type="HC0"))  # fmt: skip
    np.testing.assert_allclose(beta, ref.params, rtol=1e-6)
    np.testing.assert_allclose(cov, ref.cov_params(), rtol=1e-5)


@pytest.mark.slow
def test_fit_preemption_knee_coverage_over_seeded_replicates() -> None:
    covered = sum(
        fit_preemption(synthetic_frame(12, 720, seed=2000 + s), level=0.9).interval.covers(
            TRUTH.knee
        )
        for s in range(50)
    )
    assert 40 <= covered <= 50  # nominal 45; the profile-LR interval is mildly conservative


@pytest.mark.slow
def test_fit_preemption_peak_column_knee_coverage_over_seeded_replicates() -> None:
    covered = sum(
        fit_preemption(
            peak_driven(synthetic_frame(12, 720, seed=3000 + s), seed=3000 + s),
            util="kv_util_max",
            level=0.9,
        ).interval.covers(TRUTH.knee)
        for s in range(50)
    )
    assert 40 <= covered <= 50  # nominal 45
