"""planner.fit.reuse against brute force: exact LRU simulations of random traces, recorded the
vLLM way (tests/planner/reusesynth.py), fitted, and the predicted hit ratios at 2x and 4x
HBM, of a write-through CPU tier and of a shared LMCache pool compared with the simulated
ones. Measured (seeds below): IRM Zipf(0.9) within 2.6 pp at 2x and 4x and 1.6 pp for a 3x
CPU tier; a renewal trace with a second reuse mode past T_hbm is "cannot tell" and its
interval covers the truth; disjoint pooled engines within 0.1 pp.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from core.catalog import KV_RESIDENCY_BUCKETS
from core.errors import ConfigError
from planner.domain.hardware import get_model
from planner.fit.reuse import (
    GIB,
    Histogram,
    ReuseFit,
    ReuseInputs,
    bytes_per_block,
    fit_reuse,
    lmcache_pool_gain,
    native_offload_gain,
)
from tests.planner.reusesynth import (
    Trace,
    clip,
    irm_trace,
    lognormal_mix,
    lru_hit_ratio,
    lru_record,
    pool_hit_ratio,
    renewal_trace,
    tiered_hit_ratio,
    to_inputs,
)

IRM_CAP = 2000
RENEWAL_CAP = 4000
TOL = 0.03  # pp of hit ratio, where the tail families agree


@pytest.fixture(scope="module")
def irm() -> tuple[Trace, ReuseFit]:
    trace = irm_trace(100_000, 0.9, 200.0, 250_000, seed=11)
    return trace, fit_reuse(to_inputs(lru_record(trace, IRM_CAP), IRM_CAP, name="irm"))


@pytest.fixture(scope="module")
def renewal() -> tuple[Trace, ReuseFit]:
    trace = renewal_trace(100.0, 0.7, lognormal_mix(5.0, 120.0, 1.0), 250_000, seed=12)
    rec = lru_record(trace, RENEWAL_CAP)
    return trace, fit_reuse(to_inputs(rec, RENEWAL_CAP, name="renewal"))


def _covers(lo: float, hi: float, x: float) -> bool:
    return lo - 1e-12 <= x <= hi + 1e-12


# --- the brute force itself ----------------------------------------------------------------------
def test_recorder_keeps_vllm_semantics() -> None:
    """Allocation is not an access, only the last 4 hits are kept, idle counts from the last
    hit: A allocated at 0, hit at 1, 3, 6, 10, 15, evicted by B at 21 (capacity 1)."""
    times = np.array([0.0, 1.0, 3.0, 6.0, 10.0, 15.0, 21.0])
    items = np.array([0, 0, 0, 0, 0, 0, 1], dtype=np.int64)
    rec = lru_record((times, items), 1, warm=0.0)
    assert rec.gaps == [3.0, 4.0, 5.0]
    assert rec.idle == [6.0]
    assert rec.life == [21.0]
    assert (rec.hits, rec.accesses) == (5, 7)


# --- IRM Zipf: the tail is inside the histogram range --------------------------------------------
def test_irm_reproduces_todays_hbm_hit_ratio(irm: tuple[Trace, ReuseFit]) -> None:
    _, fit = irm
    assert fit.can_tell
    assert abs(fit.reproduction.error) < 0.01
    assert fit.reproduction.measured == pytest.approx(fit.hit_ratio)
    assert fit.reproduction.eviction_time_s == pytest.approx(fit.t_hbm, rel=0.15)
    (today,) = fit.curve([IRM_CAP])
    assert not today.extrapolated
    assert today.hit_ratio.value == pytest.approx(fit.hit_ratio, abs=0.01)
    assert _covers(today.hit_ratio.interval.lo, today.hit_ratio.interval.hi, fit.hit_ratio)
    # skewed popularity: far fewer gaps recorded than renewal predicts, hot-block hits moved
    assert fit.rho < 0.5
    assert fit.excess_share > 0.3


def test_irm_hit_ratio_at_2x_and_4x_hbm_matches_brute_force(irm: tuple[Trace, ReuseFit]) -> None:
    trace, fit = irm
    p2, p4 = fit.curve([2 * IRM_CAP, 4 * IRM_CAP])
    for point, mult in ((p2, 2), (p4, 4)):
        truth = lru_hit_ratio(trace, mult * IRM_CAP)
        est = point.hit_ratio
        assert abs(est.value - truth) < TOL, (mult, est, truth)
        assert _covers(est.interval.lo, est.interval.hi, truth), (mult, est, truth)
        assert point.extrapolated
        assert not point.beyond_histogram
        assert point.eviction_time_s > fit.t_hbm
    assert p2.can_tell
    assert p2.why.startswith("extrapolated")


def test_irm_native_offload_is_inclusive_and_matches_two_tier_brute_force(
    irm: tuple[Trace, ReuseFit],
) -> None:
    trace, fit = irm
    sizes = [0.5 * IRM_CAP / GIB, 3 * IRM_CAP / GIB]
    gain = native_offload_gain(fit, sizes, bytes_per_block=1.0)
    assert gain.mode == "native" and not gain.lower_bound
    small, large = gain.points
    base, both = tiered_hit_ratio(trace, IRM_CAP, IRM_CAP // 2)
    assert both - base < 0.002  # a CPU tier smaller than HBM holds nothing HBM does not
    assert small.extra_hit_ratio.value == 0.0
    assert small.extra_hit_ratio.interval.hi == 0.0
    assert small.avoided_prefill_tokens_per_s.value == 0.0
    base, both = tiered_hit_ratio(trace, IRM_CAP, 3 * IRM_CAP)
    truth = both - base
    est = large.extra_hit_ratio
    assert abs(est.value - truth) < TOL, (est, truth)
    assert _covers(est.interval.lo, est.interval.hi, truth)
    # HBM + a 3x tier is an HBM of 3x, not of 4x
    (h3,) = fit.curve([3 * IRM_CAP])
    assert est.value == pytest.approx(h3.hit_ratio.value - fit.hit_ratio, abs=0.02)
    # block_size 1: avoided re-prefill tokens/s = extra hits/s
    lookups = fit.inputs.lookups_per_s
    assert large.avoided_prefill_tokens_per_s.value == pytest.approx(est.value * lookups, rel=0.05)
    assert set(large.families) == set(fit.families)


def test_irm_knee_lies_past_the_onset_and_moves_with_the_fraction(
    irm: tuple[Trace, ReuseFit],
) -> None:
    _, fit = irm
    loose = native_offload_gain(fit, [1.0], bytes_per_block=1.0, knee_fraction=0.3).knee
    tight = native_offload_gain(fit, [1.0], bytes_per_block=1.0, knee_fraction=0.05).knee
    assert loose.onset_gib == pytest.approx(IRM_CAP / GIB, rel=1e-6)
    assert loose.size_gib is not None and tight.size_gib is not None
    assert loose.onset_gib < loose.size_gib.value < tight.size_gib.value
    assert loose.size_gib.interval.lo <= loose.size_gib.value <= loose.size_gib.interval.hi
    assert loose.extrapolated


def test_sampled_recording_keeps_the_estimate_and_widens_the_interval(
    irm: tuple[Trace, ReuseFit],
) -> None:
    trace, full = irm
    rec = lru_record(trace, IRM_CAP, sample_rate=0.1, seed=3)
    fit = fit_reuse(to_inputs(rec, IRM_CAP, sample_rate=0.1, name="sampled"))
    truth = lru_hit_ratio(trace, 2 * IRM_CAP)
    (p,) = fit.curve([2 * IRM_CAP])
    (q,) = full.curve([2 * IRM_CAP])
    assert abs(p.hit_ratio.value - truth) < TOL
    assert _covers(p.hit_ratio.interval.lo, p.hit_ratio.interval.hi, truth)
    assert p.hit_ratio.interval.width > q.hit_ratio.interval.width


# --- renewal with a second reuse mode past T_hbm: the histogram cannot see it -------------------
def test_renewal_second_mode_is_cannot_tell_and_covered(renewal: tuple[Trace, ReuseFit]) -> None:
    trace, fit = renewal
    assert fit.rho == pytest.approx(1.0, abs=0.1)  # renewal: the weights are exact
    assert fit.excess_share < 0.05
    assert abs(fit.reproduction.error) < 0.03
    p2, p4 = fit.curve([2 * RENEWAL_CAP, 4 * RENEWAL_CAP])
    for point, mult in ((p2, 2), (p4, 4)):
        truth = lru_hit_ratio(trace, mult * RENEWAL_CAP)
        iv = point.hit_ratio.interval
        assert _covers(iv.lo, iv.hi, truth), (mult, point.hit_ratio, truth)
        assert not point.can_tell
        assert "disagree widely" in point.why and "pp apart" in point.why
    gain = native_offload_gain(fit, [3 * RENEWAL_CAP / GIB], bytes_per_block=1.0)
    base, both = tiered_hit_ratio(trace, RENEWAL_CAP, 3 * RENEWAL_CAP)
    iv = gain.points[0].extra_hit_ratio.interval
    assert _covers(iv.lo, iv.hi, both - base)
    assert not gain.points[0].can_tell


# --- LMCache pool: merged streams --------------------------------------------------------------
@pytest.mark.parametrize("shared", [False, True])
def test_pool_of_two_engines_matches_or_bounds_brute_force(shared: bool) -> None:
    a = irm_trace(50_000, 0.9, 100.0, 150_000, seed=21)
    times, items = irm_trace(50_000, 0.9, 100.0, 150_000, seed=22)
    b = (times, items if shared else items + 10**6)  # disjoint catalogues unless shared
    t0, t1 = max(a[0][0], b[0][0]), min(a[0][-1], b[0][-1])
    a, b = clip(a, t0, t1), clip(b, t0, t1)
    fits = [
        fit_reuse(to_inputs(lru_record(tr, 1000), 1000, name=name), n_boot=50)
        for tr, name in ((a, "a"), (b, "b"))
    ]
    gain = lmcache_pool_gain(fits, [1000 / GIB, 4000 / GIB], bytes_per_block=1.0)
    assert gain.lower_bound and gain.engines == ("a", "b")
    for size, point in zip((1000, 4000), gain.points, strict=True):
        base, both = pool_hit_ratio([a, b], [1000, 1000], size)
        est = point.extra_hit_ratio
        assert point.why.startswith("lower bound")
        if shared:  # cross-engine reuse the per-engine histograms cannot see
            assert est.value <= both - base + 0.005
        else:
            assert abs(est.value - (both - base)) < TOL, (size, est, both - base)
            assert _covers(est.interval.lo, est.interval.hi, both - base)
    assert gain.points[0].extra_hit_ratio.value == 0.0  # 1000 merged < each engine's reach


# --- the cold floor, determinism, units ----------------------------------------------------------
def test_unhittable_floor_caps_every_gain(irm: tuple[Trace, ReuseFit]) -> None:
    _, fit = irm
    inp = fit.inputs  # every access that misses today can never hit
    capped = fit_reuse(dataclasses.replace(inp, unhittable_per_s=inp.lookups_per_s), n_boot=20)
    (point,) = capped.curve([4 * IRM_CAP])
    assert point.hit_ratio.interval.hi == pytest.approx(capped.hit_ratio, abs=1e-6)
    gain = native_offload_gain(capped, [4 * IRM_CAP / GIB], bytes_per_block=1.0)
    assert gain.points[0].extra_hit_ratio.interval.hi == pytest.approx(0.0, abs=1e-9)
    assert gain.knee.size_gib is None and "no gain" in gain.knee.why


def test_same_seed_same_numbers_and_no_bootstrap_is_the_envelope(
    irm: tuple[Trace, ReuseFit],
) -> None:
    _, fit = irm
    a = fit_reuse(fit.inputs, n_boot=30, seed=5).curve([3 * IRM_CAP])[0]
    b = fit_reuse(fit.inputs, n_boot=30, seed=5).curve([3 * IRM_CAP])[0]
    c = fit_reuse(fit.inputs, n_boot=30, seed=6).curve([3 * IRM_CAP])[0]
    assert a == b
    assert a.hit_ratio.value == c.hit_ratio.value  # the point uses the original counts
    assert a.hit_ratio.interval != c.hit_ratio.interval
    bare = fit_reuse(fit.inputs, n_boot=0)
    (p,) = bare.curve([3 * IRM_CAP])
    assert bare.n_boot == 0
    assert p.hit_ratio.interval.lo < p.hit_ratio.value < p.hit_ratio.interval.hi


def test_bytes_per_block_of_llama_8b() -> None:
    # 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 131072 B/token
    assert bytes_per_block(get_model("llama-3.1-8b"), 16) == 16 * 131072


# --- bad input ---------------------------------------------------------------------------------
def _hist(counts: list[float]) -> Histogram:
    return Histogram(tuple(KV_RESIDENCY_BUCKETS), tuple(counts))


def _inputs(**over: object) -> ReuseInputs:
    n = len(KV_RESIDENCY_BUCKETS) + 1
    gap = [0.0] * n
    gap[10] = 50.0
    gap[12] = 80.0
    idle = [0.0] * n
    idle[13] = 200.0
    base: dict[str, object] = {
        "reuse_gap": _hist(gap),
        "idle_before_evict": _hist(idle),
        "lifetime": _hist(idle),
        "window_s": 100.0,
        "lookups_per_s": 10.0,
        "hits_per_s": 4.0,
        "hbm_blocks": 100,
        "block_size": 16,
        "sample_rate": 1.0,
    }
    base.update(over)
    return ReuseInputs(**base)  # type: ignore[arg-type]


def test_a_small_valid_input_fits() -> None:
    fit = fit_reuse(_inputs(), n_boot=5)
    assert fit.t_hbm == pytest.approx(15.0)  # linear within the (10, 20] bucket
    assert fit.hit_ratio == pytest.approx(0.4)


N = len(KV_RESIDENCY_BUCKETS) + 1  # buckets with +Inf
NONE = [0.0] * N


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"reuse_gap": _hist(NONE)}, "reuse-gap histogram is empty"),
        ({"reuse_gap": _hist([0.0] * (N - 1) + [7.0])}, "every reuse gap is past"),
        ({"idle_before_evict": _hist(NONE)}, "idle-before-evict histogram is empty"),
        ({"idle_before_evict": _hist([1.0] + [0.0] * (N - 2) + [5.0])}, "past the top finite"),
        ({"lifetime": _hist(NONE)}, "lifetime histogram is empty"),
    ],
)
def test_empty_or_unplaceable_histograms_are_clear_errors(
    over: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        fit_reuse(_inputs(**over))


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"lookups_per_s": 0.0}, "lookups_per_s must be > 0"),
        ({"hits_per_s": 11.0}, "exceeds lookups_per_s"),
        ({"hits_per_s": -1.0}, "hits_per_s must be >= 0"),
        ({"window_s": 0.0}, "window_s must be"),
        ({"hbm_blocks": 0}, "hbm_blocks"),
        ({"hbm_blocks": 10.5}, "hbm_blocks must be an integer"),
        ({"block_size": 0}, "block_size must be > 0"),
        ({"sample_rate": 0.0}, r"sample_rate must be in \(0, 1\]"),
        ({"sample_rate": 1.5}, r"sample_rate must be in \(0, 1\]"),
        ({"unhittable_per_s": -1.0}, "unhittable_per_s"),
        ({"reuse_gap": Histogram((1.0, 2.0), (1.0, -1.0, 0.0))}, "reuse_gap: counts must be"),
        ({"reuse_gap": Histogram((2.0, 1.0), (1.0, 1.0, 0.0))}, "reuse_gap: bounds must ascend"),
        ({"lifetime": Histogram((1.0, 2.0), (1.0, 1.0))}, "lifetime: 2 counts for 2 finite"),
        ({"idle_before_evict": Histogram((0.0, 2.0), (1.0, 1.0, 0.0))}, "finite and > 0"),
        ({"idle_before_evict": Histogram((), (1.0,))}, "no finite bounds"),
    ],
)  # fmt: skip
def test_bad_input_names_what_is_wrong(over: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _inputs(**over)


def test_from_cumulative_buckets() -> None:
    h = Histogram.from_cumulative((1.0, 2.0, 5.0), (3.0, 3.0, 7.0), 9.0)
    assert h.counts == (3.0, 0.0, 4.0, 2.0)
    assert h.total == 9.0
    with pytest.raises(ConfigError, match="must not decrease"):
        Histogram.from_cumulative((1.0, 2.0), (3.0, 2.0), 9.0)
    with pytest.raises(ConfigError, match="2 cumulative counts for 3 finite bounds"):
        Histogram.from_cumulative((1.0, 2.0, 3.0), (1.0, 2.0), 9.0)


def test_bad_tier_arguments_are_clear_errors() -> None:
    fit = fit_reuse(_inputs(), n_boot=0)
    with pytest.raises(ConfigError, match="sizes_gib"):
        native_offload_gain(fit, [-1.0], bytes_per_block=1.0)
    with pytest.raises(ConfigError, match="sizes_gib"):
        native_offload_gain(fit, [], bytes_per_block=1.0)
    with pytest.raises(ConfigError, match="bytes_per_block"):
        native_offload_gain(fit, [1.0], bytes_per_block=0.0)
    with pytest.raises(ConfigError, match="knee_fraction"):
        native_offload_gain(fit, [1.0], bytes_per_block=1.0, knee_fraction=1.0)
    with pytest.raises(ConfigError, match="at least one engine"):
        lmcache_pool_gain([], [1.0], bytes_per_block=1.0)
    with pytest.raises(ConfigError, match="capacities"):
        fit.curve([0.0])
    with pytest.raises(ConfigError, match="n_boot"):
        fit_reuse(_inputs(), n_boot=-1)
    assert math.isfinite(fit.reproduction.hit_ratio)


def _long_residency(hbm_blocks: int) -> ReuseFit:
    """Gaps from 20 s to 600 s, evictions in (600, 1200] s: T_hbm = 900 s, 7 accesses/s."""
    gap, idle = [0.0] * N, [0.0] * N
    gap[14:19] = [40.0, 60.0, 80.0, 90.0, 70.0]
    idle[19] = 300.0
    inp = _inputs(
        reuse_gap=_hist(gap),
        idle_before_evict=_hist(idle),
        lifetime=_hist(idle),
        hbm_blocks=hbm_blocks,
        lookups_per_s=7.0,
    )
    return fit_reuse(inp, n_boot=20)


def test_tail_past_the_top_bucket_is_cannot_tell_with_the_bounds() -> None:
    fit = _long_residency(4000)
    assert fit.t_hbm == pytest.approx(900.0)
    assert fit.can_tell
    near, far = fit.curve([6000, 16000])
    assert near.can_tell and not near.beyond_histogram
    assert far.beyond_histogram and far.eviction_time_s > 1800.0
    assert not far.can_tell
    assert "top finite bucket (1800 s)" in far.why and "families give" in far.why
    assert far.hit_ratio.interval.lo < far.hit_ratio.interval.hi


def test_an_inconsistent_capacity_fails_the_reproduction_check() -> None:
    fit = _long_residency(100)  # 100 blocks cannot hold 900 s of 7 accesses/s
    assert fit.reproduction.error < -0.5
    assert not fit.can_tell and "does not reproduce" in fit.why
    (point,) = fit.curve([150])
    assert not point.can_tell and point.why == fit.why


def test_no_gap_below_the_eviction_time_leaves_no_tail() -> None:
    gap, idle = [0.0] * N, [0.0] * N
    gap[13] = 40.0  # all in (10, 20], the bucket holding T_hbm = 15 s
    idle[13] = 300.0
    fit = fit_reuse(_inputs(reuse_gap=_hist(gap), idle_before_evict=_hist(idle)), n_boot=5)
    assert fit.families == () and not fit.can_tell
    (point,) = fit.curve([200])
    assert math.isnan(point.hit_ratio.value) and not point.can_tell
    gain = native_offload_gain(fit, [1.0], bytes_per_block=1.0)
    assert gain.knee.size_gib is None and "no tail" in gain.knee.why


def test_decode_time_allocations_never_count_as_hits(irm: tuple[Trace, ReuseFit]) -> None:
    """Only lookups can hit: when most allocations are decode-time blocks (no lookup asks
    for them), no CPU tier, however large, adds more hits than today's lookups miss."""
    _, fit = irm
    inp = fit.inputs
    misses = inp.lookups_per_s - inp.hits_per_s
    decode = dataclasses.replace(
        inp, lookups_per_s=inp.hits_per_s + misses / 4, allocations_per_s=misses
    )  # 3/4 of the allocations are decode-time blocks
    capped = fit_reuse(decode, n_boot=20)
    room = 1.0 - capped.hit_ratio
    gain = native_offload_gain(capped, [1000 * IRM_CAP / GIB], bytes_per_block=1.0)
    (point,) = gain.points
    assert point.extra_hit_ratio.interval.hi <= room + 1e-9
    assert point.extra_hit_ratio.value > 0.5 * room  # a large tier still catches most
    assert point.avoided_prefill_tokens_per_s.interval.hi <= misses * inp.block_size + 1e-9
    (far,) = capped.curve([1000 * IRM_CAP])
    assert far.hit_ratio.interval.hi <= 1.0 + 1e-9
