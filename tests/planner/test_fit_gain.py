"""planner.fit.gain: offload gain vs utilization and the break-even, against known truth."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pytest

from benchmarks.accuracy.fitsynth import Truth, synthetic_frame
from core.errors import ConfigError, InsufficientHistory
from planner.fit.gain import fit_gain, located_crossings

MODES = ("none", "native")


def two_modes(n_engines: int = 20, n_windows: int = 240, seed: int = 0, **kw: Any) -> pd.DataFrame:
    return synthetic_frame(n_engines, n_windows, seed=seed, modes=MODES, **kw)


def test_fit_gain_known_crossing_interval_covers_truth() -> None:
    fit = fit_gain(two_modes(seed=1), offload="native", level=0.9)
    assert fit.can_tell, fit.why
    assert fit.verdict == "crosses"
    assert fit.direction == "offload better above u*"
    assert fit.interval.covers(0.7)
    assert fit.interval.width < 0.15
    assert fit.cov_type == "cluster"
    assert dict(fit.engines_by_mode) == {"none": 10, "native": 10}
    assert fit.warnings == ()


def test_fit_gain_grid_reports_absolute_and_relative_gain_with_intervals() -> None:
    truth = Truth()
    fit = fit_gain(two_modes(seed=2), offload="native", n_grid=11)
    lo, hi = fit.support
    assert [p.u for p in fit.grid] == pytest.approx(np.linspace(lo, hi, 11).tolist())
    for p in fit.grid:
        assert p.gain_interval.lo <= p.gain <= p.gain_interval.hi
        assert p.relative_interval.lo <= p.relative <= p.relative_interval.hi
        true_gain = truth.gain_slope * (p.u - truth.break_even["native"])
        assert p.gain_interval.lo - 150 <= true_gain <= p.gain_interval.hi + 150
    # the relative gain is the absolute gain over the no-offload curve, so signs agree
    assert all(np.sign(p.gain) == np.sign(p.relative) for p in fit.grid)


def test_fit_gain_pooled_offload_modes_compare_every_offload_engine() -> None:
    fit = fit_gain(synthetic_frame(18, 240, seed=3), offload=None)
    assert fit.offload == "offload"
    assert dict(fit.engines_by_mode) == {"none": 6, "offload": 12}


def test_fit_gain_no_overlap_of_utilization_cannot_tell() -> None:
    frame = two_modes(util_range={"none": (0.05, 0.4), "native": (0.6, 0.95)})
    fit = fit_gain(frame, offload="native")
    assert not fit.can_tell
    assert "do not overlap" in fit.why
    assert fit.verdict == "undetermined"


def test_fit_gain_positive_throughout_reports_no_break_even() -> None:
    frame = two_modes(seed=4, truth=Truth(break_even={"native": -1.0}))
    fit = fit_gain(frame, offload="native")
    assert not fit.can_tell
    assert fit.verdict == "positive_throughout"
    assert "gain > 0 throughout" in fit.why
    assert fit.roots == ()


def test_fit_gain_positive_but_undetermined_at_the_low_end_claims_only_a_bound() -> None:
    # true u* = 0.15, just below the support (from 0.19): at its low end the gain is too
    # small to tell its sign, so the fit locates no crossing and says only u* <= where the
    # gain turns significantly positive
    frame = synthetic_frame(8, 240, seed=1, modes=MODES, truth=Truth(break_even={"native": 0.15}))
    fit = fit_gain(frame, offload="native", level=0.9)
    assert fit.verdict == "positive_above" and not fit.can_tell
    lo, _ = fit.support
    assert fit.interval.lo == lo and lo < fit.interval.hi < lo + 0.1
    assert fit.interval.hi >= 0.15 and np.isnan(fit.estimate)
    assert f"u* <= {fit.interval.hi:.3g} if there is one" in fit.why
    assert fit.direction == "offload better above u*"


def test_fit_gain_negative_throughout_reports_no_break_even() -> None:
    frame = two_modes(seed=5, truth=Truth(break_even={"native": 2.0}))
    fit = fit_gain(frame, offload="native")
    assert fit.verdict == "negative_throughout" and not fit.can_tell


def test_fit_gain_no_difference_between_modes_cannot_tell_the_sign() -> None:
    frame = two_modes(seed=6, truth=Truth(gain_slope=0.0), noise_tokens_per_s=800.0)
    fit = fit_gain(frame, offload="native")
    assert not fit.can_tell
    assert fit.verdict == "undetermined"
    assert "cannot tell its sign" in fit.why


def test_fit_gain_too_few_windows_of_one_mode_cannot_tell() -> None:
    frame = two_modes()
    frame = frame[(frame["offload_mode"] == "none") | (frame.index % 100 == 0)]
    fit = fit_gain(frame, offload="native", min_per_mode=30)
    assert not fit.can_tell and "too few windows for mode native" in fit.why


def test_fit_gain_short_history_raises_insufficient_history() -> None:
    with pytest.raises(InsufficientHistory) as err:
        fit_gain(two_modes(2, 20), offload="native", min_windows=60)
    assert (err.value.required, err.value.available) == (60, 40)


def test_fit_gain_bootstrap_is_seeded_and_covers_truth() -> None:
    frame = two_modes(seed=7)
    a = fit_gain(frame, offload="native", interval_method="bootstrap", n_boot=199, seed=11)
    b = fit_gain(frame, offload="native", interval_method="bootstrap", n_boot=199, seed=11)
    c = fit_gain(frame, offload="native", interval_method="bootstrap", n_boot=199, seed=12)
    assert a.interval == b.interval
    assert a.interval != c.interval
    assert a.interval.covers(0.7)
    assert "199 replicates, seed 11" in a.method


def test_fit_gain_bootstrap_time_budget_bounds_replicates() -> None:
    fit = fit_gain(two_modes(seed=8), offload="native", interval_method="bootstrap",
                   n_boot=10**6, time_budget_s=0.2)  # fmt: skip
    done = int(fit.method.split("bootstrap, ")[1].split(" replicates")[0])
    assert 0 < done < 10**6


def test_fit_gain_unknown_interval_method_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="interval_method"):
        fit_gain(two_modes(), offload="native", interval_method="delta")


def test_fit_gain_break_even_coverage_over_seeded_replicates() -> None:
    """The 90 % Fieller interval covers the true break-even 80–97 % of the time."""
    covered = sum(
        fit_gain(two_modes(seed=1000 + s), offload="native", level=0.9).interval.covers(0.7)
        for s in range(50)
    )
    assert 40 <= covered <= 48


def _proportional_gain_frame(seed: int, relative: Callable[[Any], Any]) -> pd.DataFrame:
    """Throughput ∝ utilization in both modes (so the absolute gain → 0 as u → 0) times
    1 + ``relative(u)`` with offload; 4 + 4 engines of 200 windows."""
    rng = np.random.default_rng(seed)
    parts = []
    for e in range(8):
        u = rng.uniform(0.01, 0.9, 200)
        tp = 20000.0 * u * (1.0 + (relative(u) if e % 2 else 0.0))
        tp = tp * (1.0 + rng.normal(0.0, 0.08, u.size)) + rng.normal(0.0, 30.0, u.size)
        parts.append(pd.DataFrame({"source": f"e{e}", "engine": "0", "kv_util": u,
                                   "tokens_per_s": tp,
                                   "offload_mode": "native" if e % 2 else "none"}))  # fmt: skip
    return pd.concat(parts, ignore_index=True)


def _hockey_stick(u: Any) -> Any:
    return np.where(u < 0.5, -0.01, 0.4 * (u - 0.5))  # -1 % until 0.5, then rising


def test_fit_gain_sign_change_at_the_low_edge_does_not_hide_the_located_break_even() -> None:
    # seed 6, linear scale: the estimate also crosses 0 near u = 0, where its interval
    # contains 0 (the absolute gain goes to 0 with the throughput)
    frame = _proportional_gain_frame(6, _hockey_stick)
    fit = fit_gain(frame, offload="native", level=0.9, scale="linear")
    assert fit.roots[0] < 0.15 and len(fit.roots) > 1
    assert fit.can_tell, fit.why
    assert fit.estimate == pytest.approx(0.5, abs=0.05)
    assert fit.interval.covers(0.5)
    assert fit.direction == "offload better above u*"
    # on the log scale (the default) the same located break-even
    log = fit_gain(frame, offload="native", level=0.9)
    assert log.can_tell, log.why
    assert log.estimate == pytest.approx(0.5, abs=0.05) and log.interval.covers(0.5)


def test_fit_gain_knee_after_a_flat_stretch_is_placed_at_the_turn() -> None:
    # gain −1 % up to u = 0.5, then rising; seed 5: along the flat stretch the estimate
    # crosses 0 three times, shallowly; the break-even reported is the steep crossing at
    # the turn, not the first root (0.16)
    fit = fit_gain(_proportional_gain_frame(5, _hockey_stick), offload="native", level=0.9)
    assert fit.can_tell, fit.why
    assert len([r for r in fit.roots if r <= fit.interval.hi]) == 3
    assert fit.estimate == pytest.approx(0.5, abs=0.05)
    assert fit.interval.covers(0.5)


def test_fit_gain_sign_change_only_at_the_low_edge_reaches_the_edge() -> None:
    # offload 10 % better everywhere; seed 3: on the linear scale the absolute gain goes to
    # 0 with the throughput, and its estimate dips below 0 near u = 0 only
    frame = _proportional_gain_frame(3, lambda u: 0.1)
    fit = fit_gain(frame, offload="native", level=0.9, scale="linear", knots=3)
    assert fit.verdict == "crosses"
    assert not fit.can_tell
    assert "reaches the edge" in fit.why
    assert fit.interval.lo == fit.support[0] and fit.interval.hi < 0.06


def test_located_crossings_skip_sign_changes_not_bounded_by_significant_gain() -> None:
    u = np.linspace(0.0, 1.0, 11)
    gain = np.array([0.1, -0.1, -2.0, -3.0, -1.0, 0.2, 0.5, 3.0, 4.0, 0.3, 5.0])
    ok = np.abs(gain) <= 0.6  # interval contains 0
    # wiggle at the low edge (0.1 -> -0.1) and the dip at 0.9 are inside accepted stretches
    [(root, lo, hi, rising)] = located_crossings(u, gain, ok)
    assert (root, lo, hi) == pytest.approx((0.4 + 0.1 / 1.2, 0.4 + 0.1 / 1.2, 0.6))
    assert rising
    assert located_crossings(u, np.abs(gain) + 1.0, np.zeros(11, dtype=bool)) == []


def test_fit_gain_log_scale_constant_relative_gain_is_positive_throughout() -> None:
    # the same data on the (default) log scale: the gain is a ratio, constant at +10 %, so
    # nothing goes to 0 at the low edge and there is no break-even
    fit = fit_gain(_proportional_gain_frame(3, lambda u: 0.1), offload="native", level=0.9)
    assert fit.verdict == "positive_throughout"
    mid = fit.grid[len(fit.grid) // 2]
    assert mid.relative_interval.lo < 0.1 < mid.relative_interval.hi


def test_fit_gain_excludes_saturated_windows_and_says_how_many() -> None:
    frame = _proportional_gain_frame(6, _hockey_stick)
    pinned = frame.copy()
    pinned["kv_util"] = 0.99  # the same windows again, pinned at capacity
    both = pd.concat([frame, pinned.assign(source=pinned["source"] + "-sat")])
    fit = fit_gain(both, offload="native", level=0.9)
    assert any(f"excluded: {len(pinned)} saturated windows" in b for b in fit.basis)
    assert fit.n == fit_gain(frame, offload="native", level=0.9).n


def test_fit_gain_rejects_unknown_scale_and_bad_saturation_level() -> None:
    frame = _proportional_gain_frame(6, _hockey_stick)
    with pytest.raises(ConfigError, match="scale"):
        fit_gain(frame, offload="native", scale="sqrt")
    with pytest.raises(ConfigError, match="saturated"):
        fit_gain(frame, offload="native", saturated=1.5)
