"""planner.fit.mfu: effective prefill MFU from TTFT vs prompt length at low load."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from benchmarks.accuracy.fitsynth import (
    H100_BF16_FLOPS,
    Truth,
    llama8b_prefill_flops,
    synthetic_frame,
)
from core.errors import ConfigError, InsufficientHistory
from planner.fit.cr2 import cr2
from planner.fit.mfu import fit_mfu

TRUTH = Truth()


def high_hit_frame(
    n_engines: int, n_windows: int, seed: int, hit: tuple[float, float]
) -> pd.DataFrame:
    """synthetic_frame with the local prefix-hit ratio redrawn uniformly in ``hit`` and the
    TTFT recomputed as the engine spends it: the uncached tokens attend to the cached ones,
    ttft = t0 + [F(P) − F(h·P)] / (MFU·peak) + queueing + noise."""
    frame = synthetic_frame(n_engines, n_windows, seed=seed)
    rng = np.random.default_rng(seed + 1000)
    h = rng.uniform(*hit, len(frame))
    p = frame["prompt_tokens_mean"].to_numpy()
    flops = np.array([llama8b_prefill_flops(x) for x in p]) - np.array(
        [llama8b_prefill_flops(x) for x in p * h]
    )
    ttft = (
        TRUTH.overhead_s
        + flops / (TRUTH.mfu * H100_BF16_FLOPS)
        + 0.05 * np.maximum(frame["running"].to_numpy() - 2.0, 0.0)
        + rng.normal(0.0, 0.01, len(frame))
    )
    return frame.assign(prefix_hit_ratio=h, ttft_mean_s=ttft)


def test_fit_mfu_synthetic_interval_covers_true_mfu_and_overhead() -> None:
    fit = fit_mfu(synthetic_frame(12, 720, seed=3), llama8b_prefill_flops, H100_BF16_FLOPS)
    assert fit.can_tell, fit.why
    assert fit.interval.covers(TRUTH.mfu)
    assert fit.interval.width < 0.05
    assert fit.overhead_s.interval.covers(TRUTH.overhead_s)
    assert fit.shape_p > 0.01  # the generating FLOPs shape is the fitted one
    # prefill rate at the median prompt: P / (F(P) / (MFU·peak))
    p = fit.reference_prompt_tokens
    true_rate = p / (llama8b_prefill_flops(p) / (TRUTH.mfu * H100_BF16_FLOPS))
    assert fit.prefill_tokens_per_s.interval.covers(true_rate)
    assert fit.warnings == ()


def test_fit_mfu_interval_is_cr2_by_engine_with_bell_mccaffrey_df() -> None:
    # 4 engines, 3 with low-load windows: θ's interval is CR2 by engine on the
    # √weight-scaled rows with the Bell–McCaffrey ν of θ (planner.fit.cr2), through 1/(θ·peak)
    frame = synthetic_frame(4, 720, seed=3)
    fit = fit_mfu(frame, llama8b_prefill_flops, H100_BF16_FLOPS)
    low = frame[(frame["running"] <= 2) & (frame["waiting"] <= 0.1)]
    engines = low["source"].nunique()
    assert fit.cov_type == "CR2"
    assert any(f"clustered by engine ({engines} engines" in a for a in fit.assumptions)
    p, h = low["prompt_tokens_mean"].to_numpy(), low["prefix_hit_ratio"].to_numpy()
    flops = np.array([llama8b_prefill_flops(x) for x in p]) - np.array(
        [llama8b_prefill_flops(x) if x >= 1 else 0.0 for x in p * h]
    )
    count = low["ttft_count"].to_numpy()
    root = np.sqrt(np.where(count > 0, count, 1.0))  # a window without a count weighs 1
    x = np.column_stack([np.ones(len(low)), flops]) * root[:, None]
    y = low["ttft_mean_s"].to_numpy() * root
    m = np.linalg.inv(x.T @ x)
    beta = m @ x.T @ y
    g = pd.factorize(low["source"])[0]
    v = cr2(x, y - x @ beta, g, m)
    nu = float(v.df(np.array([0.0, 1.0]))[0])
    half = stats.t.ppf(0.975, nu) * math.sqrt(v.cov[1, 1])
    want = (1 / ((beta[1] + half) * H100_BF16_FLOPS), 1 / ((beta[1] - half) * H100_BF16_FLOPS))
    assert (fit.interval.lo, fit.interval.hi) == pytest.approx(want, rel=1e-8)
    assert fit.estimate == pytest.approx(1 / (beta[1] * H100_BF16_FLOPS), rel=1e-10)
    assert nu < engines - 1  # below G − 1: the few-engine correction is in the interval


def test_fit_mfu_one_engine_says_windows_are_treated_as_independent() -> None:
    frame = synthetic_frame(1, 1500, seed=3)
    fit = fit_mfu(frame, llama8b_prefill_flops, H100_BF16_FLOPS)
    assert fit.cov_type == "HC3" and "HC3" in fit.method
    assert any("treats its windows as independent" in a for a in fit.assumptions)
    assert fit.interval.covers(TRUTH.mfu)


def test_fit_mfu_uses_only_low_load_windows() -> None:
    frame = synthetic_frame(12, 720, seed=3)
    fit = fit_mfu(frame, llama8b_prefill_flops, H100_BF16_FLOPS, max_running=2.0)
    busy = fit_mfu(frame, llama8b_prefill_flops, H100_BF16_FLOPS, max_running=60.0,
                   max_waiting=100.0)  # fmt: skip
    low = (frame["running"] <= 2) & (frame["waiting"] <= 0.1)
    assert fit.n == int(low.sum())
    assert busy.n > fit.n
    # queueing under load inflates TTFT: the busy windows' fitted overhead is larger
    assert busy.overhead_s.value > fit.overhead_s.interval.hi
    assert fit.overhead_s.interval.covers(TRUTH.overhead_s)


def test_fit_mfu_high_local_hit_ratios_covers_true_mfu_with_cached_context() -> None:
    # Shared system prompts: every window hits the local prefix cache 30–90 % (the demo's
    # range). The cached context's attention is counted, so the MFU is still recovered.
    frame = high_hit_frame(12, 720, seed=7, hit=(0.3, 0.9))
    fit = fit_mfu(frame, llama8b_prefill_flops, H100_BF16_FLOPS)
    assert fit.can_tell, fit.why
    assert fit.n == int(((frame["running"] <= 2) & (frame["waiting"] <= 0.1)).sum())
    assert fit.interval.covers(TRUTH.mfu)
    assert fit.interval.width < 0.08
    assert fit.shape_p > 0.01


def test_fit_mfu_ignoring_cached_context_would_miss_the_truth() -> None:
    # The same windows fitted as if the cached tokens were not attended to (F(P·(1−h))):
    # the compute per window is underestimated, so the same TTFT reads as a lower MFU.
    frame = high_hit_frame(12, 720, seed=7, hit=(0.3, 0.9))
    fit = fit_mfu(frame, llama8b_prefill_flops, H100_BF16_FLOPS)
    naive = fit_mfu(
        frame.assign(
            prompt_tokens_mean=frame["prompt_tokens_mean"] * (1 - frame["prefix_hit_ratio"]),
            prefix_hit_ratio=0.0,
        ),
        llama8b_prefill_flops,
        H100_BF16_FLOPS,
    )
    assert naive.interval.hi < TRUTH.mfu
    assert naive.estimate < fit.interval.lo


def test_fit_mfu_external_hits_above_cap_are_left_out() -> None:
    # Tokens loaded from an external KV cache take a transfer time the model lacks.
    frame = synthetic_frame(12, 720, seed=3)
    ext = np.where(np.arange(len(frame)) % 2 == 0, 0.5, 0.05)
    frame = frame.assign(external_hit_ratio=ext)
    fit = fit_mfu(frame, llama8b_prefill_flops, H100_BF16_FLOPS)
    low = (frame["running"] <= 2) & (frame["waiting"] <= 0.1) & (frame["external_hit_ratio"] <= 0.1)
    assert fit.n == int(low.sum()) < int((low | (ext > 0.1)).sum())
    loose = fit_mfu(frame, llama8b_prefill_flops, H100_BF16_FLOPS, max_external_hit=1.0)
    assert loose.n > fit.n


def test_fit_mfu_ttft_independent_of_prompt_cannot_tell() -> None:
    rng = np.random.default_rng(0)
    frame = synthetic_frame(4, 400, seed=1)
    frame = frame.assign(ttft_mean_s=0.2 + rng.normal(0, 0.02, len(frame)))
    fit = fit_mfu(frame, llama8b_prefill_flops, H100_BF16_FLOPS)
    assert not fit.can_tell
    assert "does not rise detectably" in fit.why
    assert math.isinf(fit.interval.hi)


def test_fit_mfu_constant_prompt_length_cannot_tell() -> None:
    frame = synthetic_frame(4, 400, seed=1).assign(prompt_tokens_mean=1024.0, prefix_hit_ratio=0.0)
    fit = fit_mfu(frame, llama8b_prefill_flops, H100_BF16_FLOPS)
    assert not fit.can_tell and "barely vary" in fit.why


def test_fit_mfu_wrong_peak_gives_implausible_mfu_flagged() -> None:
    fit = fit_mfu(synthetic_frame(12, 720, seed=3), llama8b_prefill_flops, H100_BF16_FLOPS / 10)
    assert fit.estimate > 1 and not fit.can_tell and "implausible" in fit.why


@pytest.mark.parametrize("peak", [0.0, -1.0, math.nan, math.inf])
def test_fit_mfu_bad_peak_is_a_config_error(peak: float) -> None:
    with pytest.raises(ConfigError, match="peak_flops"):
        fit_mfu(synthetic_frame(2, 10), llama8b_prefill_flops, peak)


@pytest.mark.parametrize(
    "frame",
    [
        synthetic_frame(4, 300, seed=1).assign(running=30.0),  # never idle
        synthetic_frame(4, 300, seed=1).drop(columns="ttft_mean_s"),
        pd.DataFrame(),
    ],
)
def test_fit_mfu_no_low_load_windows_raises_insufficient_history(frame: pd.DataFrame) -> None:
    with pytest.raises(InsufficientHistory) as err:
        fit_mfu(frame, llama8b_prefill_flops, H100_BF16_FLOPS, min_windows=20)
    assert (err.value.required, err.value.available) == (20, 0)


@pytest.mark.slow
def test_fit_mfu_coverage_over_seeded_replicates_with_high_hit_ratios() -> None:
    covered = sum(
        fit_mfu(
            high_hit_frame(12, 720, seed=4000 + s, hit=(0.0, 0.9)),
            llama8b_prefill_flops,
            H100_BF16_FLOPS,
            level=0.9,
        ).interval.covers(TRUTH.mfu)
        for s in range(40)
    )
    assert 30 <= covered <= 40  # nominal 36
