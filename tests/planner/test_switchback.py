"""planner/fit/switchback.py: periods, washout, the fit against dense CR2 and Driscoll–Kraay
computations, and seeded Monte Carlo coverage on synthetic switchbacks
(tests/planner/switchsynth.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from core.errors import ConfigError, InsufficientHistory
from planner.fit.switchback import (
    carried_over,
    engine_keys,
    find_switchbacks,
    fit_switchback,
    switchback_periods,
)
from tests.planner.switchsynth import T0, WINDOW_S, switchback_frame

CANARY = "vllm-0/0"


def _fit(frame: pd.DataFrame, **kw: Any) -> Any:
    return fit_switchback(frame, offload="native", outcome="tokens_per_s", **kw)


def test_find_switchbacks_engine_with_two_known_modes_is_listed_with_its_periods() -> None:
    frame = switchback_frame(1, effect=0.1, schedule=("off", "on", "on", "off"), controls=2)
    # an engine whose record is unknown for a while is not a switchback
    frame.loc[(frame["source"] == "vllm-2") & (frame["start"] < T0 + 600), "offload_mode"] = (
        "unknown"
    )
    assert find_switchbacks(frame) == (CANARY,)
    periods = switchback_periods(frame, CANARY)
    assert [(b.mode, b.windows) for b in periods] == [("none", 20), ("native", 40), ("none", 20)]
    assert periods[1].start == T0 + 20 * WINDOW_S
    assert periods[1].end == periods[2].start == T0 + 60 * WINDOW_S
    assert periods[2].end == T0 + 80 * WINDOW_S  # the last window's end
    shuffled = frame.sample(frac=1.0, random_state=3)
    assert switchback_periods(shuffled, CANARY) == periods


def _monte_carlo(effect: float, reps: int, seed: int) -> tuple[float, float]:
    """Share of 90 % intervals covering ``effect`` and share excluding 0."""
    covered = excluded = 0
    for r in range(reps):
        fit = _fit(switchback_frame(seed + r, effect=effect, controls=2, period_windows=15))
        assert fit.can_tell
        covered += fit.interval.covers(effect)
        excluded += not fit.interval.covers(0.0)
    return covered / reps, excluded / reps


def test_fit_switchback_interval_covers_true_effect_near_nominal() -> None:
    # 200 seeded switchbacks (12 periods of 15 min in randomized pairs, 2 controls, AR(1)
    # φ = 0.6 across periods, a 3-window carry-over ramp, a common trend): 90 % intervals
    # covered the true log effect 0.1 in 0.915; binomial SD at 200 is 0.021
    covered, excluded = _monte_carlo(0.1, 200, seed=5000)
    assert 0.85 <= covered <= 0.95
    assert excluded >= 0.95  # a 10 % effect is seen


def test_fit_switchback_null_effect_rarely_excludes_zero() -> None:
    # seeded, 200 replicates: 0.085 of 90 % intervals excluded a null effect
    covered, excluded = _monte_carlo(0.0, 200, seed=9000)
    assert excluded <= 0.10 + 2 * 0.021
    assert covered == 1.0 - excluded


def test_fit_switchback_one_period_per_arm_cannot_tell() -> None:
    fit = _fit(switchback_frame(2, effect=0.1, schedule=("off", "on")))
    assert not fit.can_tell
    assert "only 1 block of none and 1 block of native" in fit.why
    assert fit.periods_by_arm == (("none", 1), ("native", 1))
    assert np.isfinite(fit.estimate)  # filled in, to be read with ``why``
    # two periods per arm are enough
    fit = _fit(switchback_frame(2, effect=0.1, schedule=("off", "on", "off", "on")))
    assert fit.can_tell and fit.periods_by_arm == (("none", 2), ("native", 2))


def test_fit_switchback_no_switching_engine_cannot_tell() -> None:
    frame = switchback_frame(3, effect=0.0, schedule=("off", "off"))
    fit = _fit(frame)
    assert not fit.can_tell and "no engine ran both none and native" in fit.why


@pytest.mark.parametrize(("washout_s", "per_switch"), [(0.0, 0), (150.0, 3), (300.0, 5)])
def test_fit_switchback_washout_drops_first_windows_after_each_switch(
    washout_s: float, per_switch: int
) -> None:
    schedule = ("off", "on", "off", "on")  # 3 switches; the first period follows none
    frame = switchback_frame(4, effect=0.1, schedule=schedule, controls=2)
    fit = _fit(frame, washout_s=washout_s)
    dropped = dict(fit.dropped)
    reason = f"washout ({washout_s:g} s after a switch, then while an inherited queue drains)"
    assert dropped[reason] == 3 * per_switch
    assert fit.n == len(frame) - 3 * per_switch
    assert fit.windows_by_arm == (("none", 40 - per_switch), ("native", 40 - 2 * per_switch))


def test_fit_switchback_washout_longer_than_a_period_cannot_tell() -> None:
    frame = switchback_frame(4, effect=0.1, schedule=("off", "on", "off", "on"), controls=2)
    fit = _fit(frame, washout_s=20 * WINDOW_S)
    assert not fit.can_tell
    assert fit.periods_by_arm == (("none", 1), ("native", 0))


def test_fit_switchback_too_few_windows_raises() -> None:
    frame = switchback_frame(5, effect=0.1, schedule=("off", "on"), controls=0, period_windows=10)
    with pytest.raises(InsufficientHistory):
        _fit(frame)
    with pytest.raises(InsufficientHistory):
        fit_switchback(frame, offload="native", outcome="no_such_column")
    with pytest.raises(ConfigError):
        _fit(frame, covariates=("no_such_column",))


def test_fit_switchback_without_controls_leaves_time_effects_out() -> None:
    frame = switchback_frame(6, effect=0.1, controls=0, n_periods=16)
    fit = _fit(frame)
    assert not fit.time_effects and fit.controls == ()
    assert any("no control engine" in a for a in fit.assumptions)
    assert fit.interval.covers(0.1)
    with_controls = _fit(switchback_frame(6, effect=0.1, controls=2, n_periods=16))
    assert with_controls.time_effects and with_controls.time_periods > 1


def test_fit_switchback_covariate_removes_a_traffic_mix_confounder() -> None:
    # the canary gets longer prompts while offload is on, and longer prompts lower the
    # throughput: without the covariate the effect is biased by -0.0002 · 500 = -0.1
    frame = switchback_frame(7, effect=0.1, controls=2, n_periods=16)
    on = (frame["offload_mode"] == "native").to_numpy()
    frame.loc[on, "prompt_tokens_mean"] += 500.0
    frame["tokens_per_s"] *= np.exp(-0.0002 * (frame["prompt_tokens_mean"] - 1500.0))
    plain = _fit(frame)
    adjusted = _fit(frame, covariates=("prompt_tokens_mean",))
    assert not plain.interval.covers(0.1)
    assert adjusted.interval.covers(0.1)
    assert abs(adjusted.estimate - 0.1) < 0.3 * abs(plain.estimate - 0.1)
    assert any("covariates are not themselves changed" in a for a in adjusted.assumptions)


def _tiny() -> tuple[pd.DataFrame, Any, Any, Any, Any]:
    """A canary in 4 periods of 4 windows and one control; the dense design of the fit:
    X (intercept, control, 3 time periods, mode), y = log tokens/s, w, time period per row."""
    frame = switchback_frame(
        8, effect=0.1, schedule=("off", "on", "on", "off", "off", "on"), controls=1,
        period_windows=4, requests_mean=30.0,
    )  # fmt: skip
    n = len(frame)
    cell = np.searchsorted(T0 + WINDOW_S * np.array([0, 4, 12, 20]), frame["start"], "right") - 1
    d = (frame["offload_mode"] == "native").to_numpy(dtype=float)
    ctrl = (frame["source"] == "vllm-1").to_numpy(dtype=float)
    x = np.column_stack([np.ones(n), ctrl, *[(cell == k).astype(float) for k in (1, 2, 3)], d])
    y = np.log(frame["tokens_per_s"].to_numpy())
    w = np.maximum(frame["requests"].to_numpy(dtype=float), 1.0)
    return frame, x, y, w, cell


def _pinv_sqrt(a: Any) -> Any:
    """(a⁺)^(1/2): time-period effects put each period's own indicator in the column space,
    so I − H_gg is singular there (Pustejovsky & Tipton 2018 use the pseudo-inverse)."""
    lam, v = np.linalg.eigh(a)
    inv = np.where(lam > 1e-10, 1.0 / np.sqrt(np.maximum(lam, 1e-10)), 0.0)
    return v @ np.diag(inv) @ v.T


def test_fit_switchback_cr2_se_and_df_equal_dense_n_by_n_computation() -> None:
    frame, x, y, w, cell = _tiny()
    xs, ys = x * np.sqrt(w)[:, None], y * np.sqrt(w)
    n = len(y)
    m = np.linalg.inv(xs.T @ xs)
    beta = m @ xs.T @ ys
    e = ys - xs @ beta
    hat = xs @ m @ xs.T
    meat = np.zeros_like(m)
    cols = []
    c = np.zeros(x.shape[1])
    c[-1] = 1.0
    for g in np.unique(cell):
        rows = np.flatnonzero(cell == g)
        a = _pinv_sqrt(np.eye(rows.size) - hat[np.ix_(rows, rows)])
        s = xs[rows].T @ a @ e[rows]
        meat += np.outer(s, s)
        cols.append((np.eye(n) - hat)[rows].T @ (a @ xs[rows] @ m @ c))
    se = float(np.sqrt((m @ meat @ m)[-1, -1]))
    gtg = np.column_stack(cols).T @ np.column_stack(cols)
    lam = np.linalg.eigvalsh(gtg)
    nu = float(lam.sum() ** 2 / (lam**2).sum())
    fit = _fit(frame, washout_s=0.0, min_windows=10, min_periods_per_arm=1)
    assert fit.time_periods == 4 and fit.n == n
    assert fit.estimate == pytest.approx(beta[-1], rel=1e-9)
    assert fit.se == pytest.approx(se, rel=1e-9)
    # cr2.py caps leverages at 1 − 1e-9 where the pseudo-inverse sets them aside: on the
    # exact-1 leverages of the time-period effects ν moves by ~5e-8 (relative)
    assert fit.df == pytest.approx(nu, rel=1e-6)


def test_fit_switchback_hac_equals_driscoll_kraay_by_hand() -> None:
    frame, x, y, w, _ = _tiny()
    xs, ys = x * np.sqrt(w)[:, None], y * np.sqrt(w)
    n, p = xs.shape
    m = np.linalg.inv(xs.T @ xs)
    e = ys - xs @ (m @ xs.T @ ys)
    t = np.rint((frame["start"].to_numpy() - T0) / WINDOW_S).astype(int)
    sums = np.zeros((t.max() + 1, p))
    for i in range(n):
        sums[t[i]] += xs[i] * e[i]
    lags = 6  # the median period: runs of 4, 8, 8, 4 windows
    omega = sums.T @ sums
    for lag in range(1, lags + 1):
        gamma = sums[lag:].T @ sums[:-lag]
        omega += (1 - lag / (lags + 1)) * (gamma + gamma.T)
    cov = m @ omega @ m * n / (n - p)
    fit = _fit(frame, washout_s=0.0, min_windows=10, min_periods_per_arm=1, cov="hac")
    assert fit.cov_type == "HAC" and f"{lags} lags" in fit.method
    assert fit.se == pytest.approx(np.sqrt(cov[-1, -1]), rel=1e-9)
    assert fit.df == 3.0


def test_fit_switchback_linear_scale_has_no_ratio() -> None:
    fit = _fit(switchback_frame(9, effect=0.1, controls=2), log=False)
    assert fit.unit == "tokens_per_s" and np.isnan(fit.ratio.value)
    logged = _fit(switchback_frame(9, effect=0.1, controls=2))
    assert logged.ratio.value == pytest.approx(np.exp(logged.estimate))
    assert logged.ratio.interval.lo == pytest.approx(np.exp(logged.interval.lo))


# carried_over: 1-minute windows from the switch at t=0, washout 180 s (3 windows); the
# queue's fall must exceed max(5 % of finished, 1) window over window to extend it.
_W = float("nan")


@pytest.mark.parametrize(
    ("waiting", "finished", "expected"),
    [
        # no queue: the fixed washout only
        ([0, 0, 0, 0, 0, 0], [100] * 6, [1, 1, 1, 0, 0, 0]),
        # a backlog drained by 30 a window until window 5
        ([300, 270, 240, 210, 180, 150, 150], [100] * 7, [1, 1, 1, 1, 1, 1, 0]),
        # a fall of 5 with 100 finished is not more than 5 % of them: ends
        ([300, 270, 240, 235, 200], [100] * 5, [1, 1, 1, 0, 0]),
        # a growing queue after the washout: the new mode's own overload, kept
        ([10, 20, 30, 40, 50], [100] * 5, [1, 1, 1, 0, 0]),
        # the drain ends at the first window that does not fall, later falls are kept
        ([300, 270, 240, 210, 215, 150], [100] * 6, [1, 1, 1, 1, 0, 0]),
        # a queue that was not collected: the fixed washout only
        ([_W] * 5, [100] * 5, [1, 1, 1, 0, 0]),
        # finished unknown: the floor of 1 request
        ([30, 20, 10, 8, 8], [_W] * 5, [1, 1, 1, 1, 0]),
    ],
)
def test_carried_over_extends_the_washout_while_an_inherited_queue_drains(
    waiting: list[float], finished: list[float], expected: list[int]
) -> None:
    n = len(waiting)
    starts = np.arange(n, dtype=np.float64) * 60.0
    got = carried_over(starts, np.asarray(waiting, float), np.asarray(finished, float), 0.0, 180.0)
    assert got.astype(int).tolist() == expected
    # the windows' order does not matter
    perm = np.random.default_rng(n).permutation(n)
    shuffled = carried_over(starts[perm], np.asarray(waiting, float)[perm],
                            np.asarray(finished, float)[perm], 0.0, 180.0)  # fmt: skip
    assert shuffled.astype(int).tolist() == [expected[i] for i in perm]


def test_fit_switchback_drops_the_windows_that_drain_an_inherited_backlog() -> None:
    schedule = ("off", "on", "off", "on")
    frame = switchback_frame(4, effect=0.1, schedule=schedule, controls=2)
    base = _fit(frame, washout_s=300.0)
    # the canary's second period (on) inherits 400 waiting requests, drained 40 a window
    canary = engine_keys(frame) == CANARY
    b = switchback_periods(frame, CANARY)[1]
    rows = np.flatnonzero(canary & (frame["start"].to_numpy(float) >= b.start)
                          & (frame["start"].to_numpy(float) < b.end))  # fmt: skip
    rows = rows[np.argsort(frame["start"].to_numpy(float)[rows])]
    waiting = np.zeros(len(frame))
    waiting[rows[:10]] = 400.0 - 40.0 * np.arange(10)  # 400 … 40, then 0 from window 10
    frame = frame.assign(waiting=waiting)
    fit = _fit(frame, washout_s=300.0)
    assert fit.n == base.n - 6  # windows 5..10 still drain it, past the 300 s washout
