"""planner/plan/design.py: autocorrelation times against AR(1) truths and a direct sum, period
length and period noise, the schedule, the assignment, and the number of periods against a
seeded Monte Carlo of the switchback fit itself."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from core.errors import ConfigError, InsufficientHistory
from planner.fit.switchback import fit_switchback
from planner.plan.design import (
    autocorrelation_time,
    period_sigma,
    periods_needed,
    random_assignment,
    switchback_period_s,
    switchback_schedule,
)
from tests.planner.switchsynth import WINDOW_S, switchback_frame

CANARY = "vllm-0/0"


def _ar1(phi: float, n: int, seed: int) -> Any:
    """A stationary AR(1), one step at a time."""
    rng = np.random.default_rng(seed)
    e = rng.normal(size=n)
    x = np.empty(n)
    x[0] = e[0] / np.sqrt(1 - phi**2)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + e[i]
    return x


@pytest.mark.parametrize("method", ["sokal", "geyer"])
@pytest.mark.parametrize("phi", [0.0, 0.6, 0.9])
def test_autocorrelation_time_of_ar1_matches_its_known_tau(method: str, phi: float) -> None:
    # τ = (1 + φ)/(1 − φ); the estimate's relative SD on 20 000 steps is ~4 % at φ = 0.9
    truth = (1 + phi) / (1 - phi)
    got = [autocorrelation_time(_ar1(phi, 20_000, s), max_lag=2000, method=method)
           for s in range(3)]  # fmt: skip
    assert np.mean(got) == pytest.approx(truth, rel=0.1)


def test_autocorrelation_time_negative_correlation_needs_geyer() -> None:
    x = _ar1(-0.5, 20_000, 1)  # τ = 1/3
    assert autocorrelation_time(x, max_lag=200, method="geyer") == pytest.approx(1 / 3, rel=0.15)
    assert autocorrelation_time(x, max_lag=200) < 0.1  # Sokal's window stops at lag 1


def test_autocorrelation_time_equals_a_direct_sum_of_autocorrelations() -> None:
    x = _ar1(0.7, 3000, 2)
    xc = x - x.mean()
    rho = [float(xc[: x.size - k] @ xc[k:] / (xc @ xc)) for k in range(101)]
    tau, m = 1.0, 0
    for m in range(1, 101):  # Sokal: the first M with M >= 5 τ(M)
        tau = 1.0 + 2.0 * sum(rho[1 : m + 1])
        if m >= 5 * tau:
            break
    assert autocorrelation_time(x, max_lag=100) == pytest.approx(tau, rel=1e-9)
    gammas = [rho[2 * k] + rho[2 * k + 1] for k in range(50)]
    mono, run = [], np.inf
    for g in gammas:
        if g <= 0:
            break
        run = min(run, g)
        mono.append(run)
    geyer = autocorrelation_time(x, max_lag=100, method="geyer")
    assert geyer == pytest.approx(-1.0 + 2.0 * sum(mono), rel=1e-9)


def test_autocorrelation_time_gaps_constant_and_bad_input() -> None:
    x = _ar1(0.6, 20_000, 3)
    x[::7] = np.nan  # missing windows
    assert autocorrelation_time(x, max_lag=500) == pytest.approx(4.0, rel=0.15)
    assert autocorrelation_time(np.ones(50), max_lag=10) == 1.0
    with pytest.raises(InsufficientHistory):
        autocorrelation_time([1.0, np.nan, 2.0], max_lag=1)
    with pytest.raises(ConfigError):
        autocorrelation_time(x, max_lag=0)


def _history(seed: int, phi: float, windows: int = 1440, controls: int = 3) -> pd.DataFrame:
    """A day of 60 s windows of a canary and controls, all without offload."""
    return switchback_frame(
        seed, effect=0.0, schedule=("off", "off"), period_windows=windows // 2, phi=phi,
        controls=controls,
    )  # fmt: skip


def test_switchback_period_s_grows_with_the_autocorrelation_time() -> None:
    periods = {}
    for phi in (0.0, 0.6, 0.9):
        period, text = switchback_period_s(_history(1, phi), CANARY, "tokens_per_s", window_s=60)
        assert period % 300 == 0 and period >= 900
        assert "washout 300 s" in text and "net of the controls' common level" in text
        periods[phi] = period
    assert periods[0.0] == 900  # white noise: the floor
    # τ ≈ 4 windows: 300 + 5·4·60 = 1500 s; τ ≈ 19: about 6000 s
    assert periods[0.6] in (1500, 1800)
    assert 4800 <= periods[0.9] <= 8400
    period, text = switchback_period_s(
        _history(1, 0.0), CANARY, "tokens_per_s", window_s=60, min_period_s=0, washout_s=600
    )
    assert period == 900 and "600 s + 5 × τ_int" in text  # 600 + 5·1·60 = 900
    with pytest.raises(InsufficientHistory):
        switchback_period_s(_history(1, 0.6, windows=20), CANARY, "tokens_per_s", window_s=60)


def test_switchback_period_s_without_controls_uses_the_raw_series() -> None:
    _, text = switchback_period_s(_history(2, 0.6, controls=0), CANARY, "tokens_per_s", window_s=60)
    assert "net of" not in text


def test_period_sigma_equals_a_direct_computation_and_ignores_common_period_shifts() -> None:
    frame = _history(3, 0.6, windows=240, controls=2)
    got, n = period_sigma(frame, CANARY, "tokens_per_s", period_s=1200, window_s=WINDOW_S)
    y = np.log(frame["tokens_per_s"].to_numpy())
    t = ((frame["start"] - frame["start"].min()) / WINDOW_S).to_numpy().astype(int)
    src = frame["source"].to_numpy()
    diffs = []
    for b in range(12):
        late = (src == "vllm-0") & (t >= 20 * b + 5) & (t < 20 * b + 20)
        ctrl_means = []
        for c in ("vllm-1", "vllm-2"):
            mine = src == c
            ctrl_means.append(y[mine & (t >= 20 * b) & (t < 20 * b + 20)] - y[mine].mean())
        diffs.append(y[late].mean() - np.concatenate(ctrl_means).mean())
    assert n == 12
    assert got == pytest.approx(np.std(diffs, ddof=1), rel=1e-9)
    shifted = frame.copy()
    shift = np.random.default_rng(0).normal(0.0, 0.5, 12)[t // 20]
    shifted["tokens_per_s"] *= np.exp(shift)  # the same shift for every engine in a period
    again, _ = period_sigma(shifted, CANARY, "tokens_per_s", period_s=1200, window_s=WINDOW_S)
    assert again == pytest.approx(got, rel=1e-9)


def test_switchback_schedule_is_balanced_in_pairs_and_reproducible() -> None:
    s = switchback_schedule(12, seed=7)
    assert s == switchback_schedule(12, seed=7)
    assert all({s[i], s[i + 1]} == {"on", "off"} for i in range(0, 12, 2))
    odd = switchback_schedule(7, seed=7)
    assert odd[:6] == s[:6] and odd[6] in ("on", "off")
    firsts = [switchback_schedule(2, seed=k)[0] for k in range(400)]
    assert stats.binomtest(firsts.count("on"), 400).pvalue > 0.01
    assert len({switchback_schedule(12, seed=k) for k in range(50)}) > 25
    with pytest.raises(ConfigError):
        switchback_schedule(1, seed=0)


def test_random_assignment_is_reproducible_order_free_and_load_blind() -> None:
    engines = [f"e{i}" for i in range(8)]
    load = {e: i / 7 for i, e in enumerate(engines)}  # e7 the busiest
    a = random_assignment(engines, 2, seed=11)
    assert a == random_assignment(list(reversed(engines)), 2, seed=11)
    assert len(a) == 2 and set(a) <= set(engines)
    counts = dict.fromkeys(engines, 0)
    loads = []
    for seed in range(2000):
        chosen = random_assignment(engines, 2, seed=seed)
        for e in chosen:
            counts[e] += 1
        loads.append(np.mean([load[e] for e in chosen]))
    # every engine chosen 2/8 of the time, whatever its load
    assert stats.chisquare(list(counts.values())).pvalue > 0.01
    assert stats.spearmanr(list(load.values()), list(counts.values())).pvalue > 0.01
    assert np.mean(loads) == pytest.approx(0.5, abs=0.02)


def test_random_assignment_takes_whole_lmcache_pools() -> None:
    engines = ["a", "b", "c", "d", "e"]
    pools = {"a": "p1", "b": "p1", "c": "p2", "d": "p2"}  # e on its own
    seen = set()
    for seed in range(60):
        chosen = set(random_assignment(engines, 1, seed=seed, pools=pools))
        assert chosen in ({"a", "b"}, {"c", "d"}, {"e"})
        seen.add(frozenset(chosen))
    assert len(seen) == 3
    with pytest.raises(ConfigError):
        random_assignment(engines, 4, seed=0, pools=pools)  # 3 units


def test_periods_needed_is_monotone_in_effect_and_sigma() -> None:
    kw: dict[str, Any] = {"level": 0.9, "power": 0.8, "max_periods": 400}
    by_effect = [periods_needed(0.03, e, **kw) for e in (0.01, 0.02, 0.04, 0.08)]
    by_sigma = [periods_needed(s, 0.03, **kw) for s in (0.01, 0.02, 0.04, 0.08)]
    assert by_effect == sorted(by_effect, reverse=True) and by_effect[0] > by_effect[-1]
    assert by_sigma == sorted(by_sigma) and by_sigma[0] < by_sigma[-1]
    assert all(n % 2 == 0 and n >= 4 for n in by_effect + by_sigma)
    assert periods_needed(0.03, 0.0, **kw) == 0  # no effect is ever seen
    assert periods_needed(0.03, -0.04, **kw) == periods_needed(0.03, 0.04, **kw)
    higher = periods_needed(0.03, 0.03, level=0.9, power=0.95, max_periods=400)
    assert higher > periods_needed(0.03, 0.03, **kw)


def test_periods_needed_power_of_a_two_sample_t_test_on_period_means() -> None:
    # n/2 period means per arm of SD σ: the pooled two-sample t test is exact there
    sigma, effect = 0.03, 0.04
    n = periods_needed(sigma, effect, level=0.9, power=0.8, max_periods=200)
    rng = np.random.default_rng(4)
    reps = 20_000
    on = rng.normal(effect, sigma, (reps, n // 2))
    off = rng.normal(0.0, sigma, (reps, n // 2))
    power = float((stats.ttest_ind(on, off, axis=1).pvalue < 0.1).mean())
    assert 0.8 <= power <= 0.8 + 0.1
    fewer = float(
        (stats.ttest_ind(on[:, : n // 2 - 1], off[:, : n // 2 - 1], axis=1).pvalue < 0.1).mean()
    )
    assert fewer < 0.8  # n is the smallest


def test_periods_needed_reaches_its_power_in_the_switchback_fit() -> None:
    # σ from a day of history at 20-minute periods, then 200 seeded switchbacks of the
    # planned length (2 controls): 0.76 of the 90 % intervals excluded 0 (binomial SD 0.03);
    # the fit's median Bell–McCaffrey ν (5.2) is below the planned n − 2 = 8, since periods
    # of one mode that follow each other merge into one time period
    sigma, _ = period_sigma(_history(100, 0.6, controls=2), CANARY, "tokens_per_s", period_s=1200,
                           window_s=WINDOW_S)  # fmt: skip
    n = periods_needed(sigma, 0.05, level=0.9, power=0.8, max_periods=100)
    assert n == 10
    hits = 0
    for r in range(200):
        frame = switchback_frame(7000 + r, effect=0.05, n_periods=n, period_windows=20, controls=2)
        fit = fit_switchback(frame, offload="native", outcome="tokens_per_s")
        hits += fit.interval.lo > 0
    assert 0.72 <= hits / 200 <= 0.9
