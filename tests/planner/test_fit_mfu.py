"""planner.fit_mfu: effective prefill MFU from TTFT vs prompt length at low load."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from collector.errors import ConfigError, InsufficientHistory
from planner.fit_mfu import fit_mfu
from planner.fitsynth import H100_BF16_FLOPS, Truth, llama8b_prefill_flops, synthetic_frame

TRUTH = Truth()


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


def test_fit_mfu_uses_only_low_load_windows() -> None:
    frame = synthetic_frame(12, 720, seed=3)
    fit = fit_mfu(frame, llama8b_prefill_flops, H100_BF16_FLOPS, max_running=2.0)
    busy = fit_mfu(frame, llama8b_prefill_flops, H100_BF16_FLOPS, max_running=60.0,
                   max_waiting=100.0)  # fmt: skip
    low = (frame["running"] <= 2) & (frame["waiting"] <= 0.1) & (frame["prefix_hit_ratio"] <= 0.1)
    assert fit.n == int(low.sum())
    assert busy.n > fit.n
    # queueing under load inflates TTFT: the busy windows' fitted overhead is larger
    assert busy.overhead_s.value > fit.overhead_s.interval.hi
    assert fit.overhead_s.interval.covers(TRUTH.overhead_s)


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
