"""Prompt lengths read from the request_prompt_tokens histogram: exact mean, censored p90."""

from __future__ import annotations

import random

import numpy as np
import pytest

from collector.rollup import Rollup
from core.catalog import token_buckets
from core.records import SignalSample, Snapshot, Window, labels_of
from planner.frames.table import seq_sum
from planner.plan.observe import p90_censored, prompt_lengths, quantiles, weighted_median

LABELS = labels_of({"engine": "0", "model_name": "m"})


def _windows(prompts_per_window: list[list[int]], bounds: tuple[float, ...]) -> list[Window]:
    """Cumulative histogram snapshots of the prompts through the collector's real rollup
    (one window per list; a scrape at the start and the end of each window)."""
    rollup = Rollup("e", window_s=60.0)
    counts = [0.0] * (len(bounds) + 1)
    total = n = 0.0
    out: list[Window] = []

    def snap(ts: float) -> None:
        cumulative, run = [], 0.0
        for c in counts:
            run += c
            cumulative.append(run)
        buckets = tuple(zip((*bounds, float("inf")), cumulative, strict=True))
        sample = SignalSample.histogram("request_prompt_tokens", LABELS, n, buckets, total)
        out.extend(rollup.add(Snapshot("e", ts, (sample,))))

    snap(1.0)
    for i, prompts in enumerate(prompts_per_window):
        for p in prompts:
            counts[next((j for j, b in enumerate(bounds) if p <= b), len(bounds))] += 1
            total += p
            n += 1
        snap(60.0 * (i + 1) + 30.0)
    out.extend(rollup.flush())
    return [w for w in out if w.signal == "request_prompt_tokens" and w.delta]


def _prompts(mean: float, k: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [max(1, round(rng.gauss(mean, mean * 0.1))) for _ in range(k)]


def test_prompt_lengths_beyond_the_top_bucket_are_censored_mean_exact() -> None:
    """The demo's bug: 6.8 k-token prompts under vLLM's buckets for max_model_len 4096
    (top finite bound 2000) read as p90 = 2000."""
    prompts = [_prompts(6800, 200, s) for s in range(5)]
    windows = _windows(prompts, token_buckets(4096))
    assert windows and all(p90_censored(w) for w in windows)
    mean, p90, censored = prompt_lengths(windows)
    flat = [p for ws in prompts for p in ws]
    assert mean == pytest.approx(sum(flat) / len(flat))  # exact: Σ sum / Σ count
    assert p90 == 2000.0
    assert censored


def test_prompt_lengths_inside_the_buckets_are_not_censored() -> None:
    prompts = [_prompts(6800, 200, s) for s in range(5)]
    windows = _windows(prompts, token_buckets(131072))  # the model's context length
    assert windows and not any(p90_censored(w) for w in windows)
    mean, p90, censored = prompt_lengths(windows)
    assert p90 is not None and 5000 < p90 <= 10000
    assert mean is not None and mean < p90
    assert not censored


def test_prompt_lengths_censored_windows_above_the_median_leave_it_exact() -> None:
    """Censored windows hold the highest values; they move the median only when they are
    at or below it."""
    short = [_prompts(700, 200, s) for s in range(4)]
    long = [_prompts(6800, 50, 9)]
    windows = _windows([*short, *long], token_buckets(4096))
    assert [p90_censored(w) for w in windows] == [False] * 4 + [True]
    _, p90, censored = prompt_lengths(windows)
    assert p90 is not None and p90 < 2000
    assert not censored
    _, p90, censored = prompt_lengths(_windows([*short[:1], *[long[0] * 4] * 2], (1.0, 2000.0)))
    assert (p90, censored) == (2000.0, True)


@pytest.mark.parametrize(
    ("p90", "p99", "censored"),
    [(2000.0, 2000.0, True), (1500.0, 2000.0, False), (None, None, False), (0.0, 0.0, False)],
)
def test_p90_censored_reads_equal_quantiles(
    p90: float | None, p99: float | None, censored: bool
) -> None:
    w = Window("e", "request_prompt_tokens", LABELS, 0.0, 60.0, "histogram", 2, delta=10.0,
               p90=p90, p99=p99)  # fmt: skip
    assert p90_censored(w) is censored


@pytest.mark.parametrize("seed", range(6))
def test_weighted_median_and_quantiles_arrays_equal_the_list_loop(seed: int) -> None:
    """The array path (a plan's millions of windows) returns what the loop over lists does,
    with ties, NaN, inf, zero and negative weights mixed in."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 400))
    values = (rng.choice([0.5, 1.0, 2.0, np.nan, np.inf, -3.0], n) * rng.integers(1, 4, n)).astype(
        float
    )
    weights = rng.choice([0.0, 1.0, 2.5, np.nan, -1.0, 1e-3], n)
    assert weighted_median(values, weights) == weighted_median(values.tolist(), weights.tolist())
    qs = [0.0, 0.5, 0.95, 1.0]
    assert quantiles(values, qs) == quantiles(values.tolist(), qs)
    # distinct values (no ties to order by weight), as a plan's latencies mostly are
    spread = rng.lognormal(0.0, 1.0, n)
    spread[rng.random(n) < 0.1] = np.nan
    assert weighted_median(spread, weights) == weighted_median(spread.tolist(), weights.tolist())


def test_seq_sum_adds_left_to_right_as_a_loop() -> None:
    values = np.array([1e16, 1.0, -1e16, 1.0, 0.1, 0.2] * 50)
    total = 0.0
    for v in values.tolist():
        total += v
    assert seq_sum(values) == total != float(values.sum())  # numpy's pairwise sum differs
    assert seq_sum(np.zeros(0)) == 0.0
