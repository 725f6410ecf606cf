"""planner.fit.hitrate: LMCache L1 hit ratio vs size, against a known saturating curve."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from benchmarks.accuracy.fitsynth import Truth, synthetic_frame
from collector.errors import ConfigError, InsufficientHistory
from planner.fit.hitrate import fit_hitrate

TRUTH = Truth()


def curve(c: float) -> float:
    return TRUTH.h_max * (1 - math.exp(-c / TRUTH.c0_bytes))


def test_fit_hitrate_recovers_curve_and_sizing_target() -> None:
    fit = fit_hitrate(synthetic_frame(12, 720, seed=3), target_fraction=0.9, target_hit=0.5)
    assert fit.can_tell, fit.why
    true_size = TRUTH.c0_bytes * -math.log(1 - 0.9)
    assert fit.interval.covers(true_size)
    assert fit.interval.hi / fit.interval.lo < 1.2
    assert fit.h_max.interval.covers(TRUTH.h_max)
    assert fit.c0_bytes.interval.covers(TRUTH.c0_bytes)
    assert fit.size_for_target_hit is not None
    assert fit.size_for_target_hit.interval.covers(-TRUTH.c0_bytes * math.log(1 - 0.5 / 0.6))
    assert fit.warnings == ()


def test_fit_hitrate_predictions_cover_truth_and_flag_extrapolation() -> None:
    sizes = [2e9, 8e9, 30e9, 200e9]
    fit = fit_hitrate(synthetic_frame(12, 720, seed=3), sizes=sizes)
    assert [p.size_bytes for p in fit.predictions] == sizes
    for p in fit.predictions:
        assert p.interval.covers(curve(p.size_bytes)), p
        assert 0.0 <= p.interval.lo <= p.hit_ratio <= p.interval.hi <= 1.0
    assert [p.extrapolated for p in fit.predictions] == [False, False, False, True]


def test_fit_hitrate_target_above_h_max_is_unreachable() -> None:
    fit = fit_hitrate(synthetic_frame(12, 720, seed=3), target_hit=0.9)
    assert fit.size_for_target_hit is not None
    assert math.isinf(fit.size_for_target_hit.value)


def test_fit_hitrate_sizes_past_saturation_cannot_tell_c0() -> None:
    rng = np.random.default_rng(1)
    n = 400
    frame = pd.DataFrame({
        "source": "a", "engine": "0",
        "l1_usage_bytes": rng.uniform(100e9, 120e9, n),  # far past C0: the curve is flat
        "lmcache_hit_ratio": 0.6 + rng.normal(0, 0.02, n),
        "lmcache_requested_tokens": 1e5,
    })  # fmt: skip
    fit = fit_hitrate(frame)
    assert not fit.can_tell
    assert "not pinned down" in fit.why or "barely varies" in fit.why


def test_fit_hitrate_constant_size_cannot_tell() -> None:
    frame = synthetic_frame(12, 200, seed=3).assign(l1_usage_bytes=5e9)
    fit = fit_hitrate(frame)
    assert not fit.can_tell and "barely varies" in fit.why


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
                                           ({"level": 1.5}, "level")])  # fmt: skip
def test_fit_hitrate_bad_arguments_are_config_errors(kw: dict[str, float], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        fit_hitrate(synthetic_frame(3, 50), **kw)  # type: ignore[arg-type]
