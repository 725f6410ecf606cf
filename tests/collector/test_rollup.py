"""Rollup: counters with resets, gauges, histogram quantiles (checked against PromQL), ratios."""

from __future__ import annotations

import math
import shutil
import subprocess
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.parse import read_exposition
from collector.rollup import Rollup, histogram_quantile
from core.catalog import DERIVED_RATIOS
from core.errors import ConfigError
from core.records import Labels, SignalSample, Snapshot, Window

ENGINE: Labels = (("engine", "0"), ("model_name", "m"))
RATIO = ("hit_ratio", "hits_total", "queries_total")
BOUNDS = (0.1, 0.5, 1.0, math.inf)


def counter(signal: str, value: float, labels: Labels = ENGINE) -> SignalSample:
    return SignalSample(signal, "counter", labels, value)


def gauge(signal: str, value: float, labels: Labels = ENGINE) -> SignalSample:
    return SignalSample(signal, "gauge", labels, value)


def hist(
    counts: tuple[float, ...], total: float, bounds: tuple[float, ...] = BOUNDS
) -> SignalSample:
    buckets = tuple(zip(bounds, counts, strict=True))
    return SignalSample.histogram("ttft_seconds", ENGINE, counts[-1], buckets, total)


def snap(ts: float, *samples: SignalSample) -> Snapshot:
    return Snapshot("engine-a", ts, samples)


def run(points: list[tuple[float, list[SignalSample]]], **kw: object) -> list[Window]:
    """Feed snapshots, flush, and return every closed window."""
    rollup = Rollup("engine-a", ratios=(), **kw)  # type: ignore[arg-type]
    out: list[Window] = []
    for ts, samples in points:
        out += rollup.add(snap(ts, *samples))
    return out + rollup.flush()


def only(windows: list[Window], signal: str, start: float) -> Window:
    (found,) = [w for w in windows if w.signal == signal and w.start == start]
    return found


# -- counters ---------------------------------------------------------------------------------


def test_counter_steady_increase_delta_rate_and_boundary_step() -> None:
    values = [0, 10, 20, 30, 40, 50]  # one sample every 15 s from t=0
    windows = run([(15.0 * i, [counter("c", v)]) for i, v in enumerate(values)])
    first, second = only(windows, "c", 0.0), only(windows, "c", 60.0)
    assert (first.delta, first.rate, first.samples, first.resets) == (30, 30 / 45, 4, 0)
    # 30 -> 40 happened across the boundary: it belongs to the second window.
    assert (second.delta, second.rate, second.samples, second.last) == (20, 20 / 30, 2, 50)


def test_counter_reset_mid_window_counts_new_value_as_increase() -> None:
    points = [(0.0, 100), (45.0, 100), (60.0, 110), (75.0, 5), (90.0, 15)]
    windows = run([(t, [counter("c", v)]) for t, v in points])
    w = only(windows, "c", 60.0)
    assert (w.delta, w.resets) == (10 + 5 + 10, 1)
    assert w.rate == pytest.approx(25 / 45)


def test_counter_reset_at_boundary_belongs_to_new_window() -> None:
    windows = run([(30.0, [counter("c", 100)]), (50.0, [counter("c", 120)]),
                   (70.0, [counter("c", 3)]), (100.0, [counter("c", 9)])])  # fmt: skip
    before, after = only(windows, "c", 0.0), only(windows, "c", 60.0)
    assert (before.delta, before.resets) == (20, 0)
    assert (after.delta, after.resets, after.rate) == (9, 1, 9 / 50)


def test_counter_first_sample_only_delta_unknown_then_known() -> None:
    windows = run([(10.0, [counter("c", 7)]), (70.0, [counter("c", 12)])])
    first, second = only(windows, "c", 0.0), only(windows, "c", 60.0)
    assert (first.delta, first.rate, first.samples, first.last) == (None, None, 1, 7)
    assert (second.delta, second.rate) == (5, 5 / 60)


def test_counter_new_series_two_samples_delta_over_own_span() -> None:
    windows = run([(0.0, []), (20.0, [counter("c", 4)]), (50.0, [counter("c", 10)])])
    assert (only(windows, "c", 0.0).delta, only(windows, "c", 0.0).rate) == (6, 6 / 30)


def prometheus_increase(values: list[float]) -> tuple[float, int]:
    total, resets = 0.0, 0
    for prev, new in pairwise(values):
        total += new if new < prev else new - prev
        resets += new < prev
    return total, resets


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.floats(0.5, 200.0), st.integers(0, 1_000), st.booleans()),
        min_size=2,
        max_size=40,
    ),
    window_s=st.sampled_from([10.0, 60.0, 300.0]),
)
def test_counter_windows_conserve_total_increase(
    steps: list[tuple[float, int, bool]], window_s: float
) -> None:
    """Summed window deltas = PromQL-style increase over all samples, whatever the windows."""
    ts, value, points = 1_700_000_000.0, 0.0, []
    for gap, step, reset in steps:
        ts += gap
        value = float(step) if reset else value + step
        points.append((ts, value))
    windows = run([(t, [counter("c", v)]) for t, v in points], window_s=window_s,
                  stale_windows=10**6)  # fmt: skip
    total, resets = prometheus_increase([v for _, v in points])
    assert sum(w.delta or 0.0 for w in windows) == pytest.approx(total)
    assert sum(w.resets for w in windows) == resets
    assert sum(w.samples for w in windows) == len(points)
    assert all(w.start % window_s == 0 for w in windows)
    assert [w.start for w in windows] == sorted({w.start for w in windows})


# -- gauges -----------------------------------------------------------------------------------


def test_gauge_stats_time_weighted_mean() -> None:
    windows = run([(0.0, [gauge("g", 1.0)]), (10.0, [gauge("g", 3.0)]),
                   (40.0, [gauge("g", 2.0)]), (60.0, [gauge("g", 9.0)])])  # fmt: skip
    w = only(windows, "g", 0.0)
    # 1.0 for 10 s, 3.0 for 30 s, 2.0 for the last 20 s of the window.
    assert w.mean == pytest.approx((1 * 10 + 3 * 30 + 2 * 20) / 60)
    assert (w.min, w.max, w.last, w.samples, w.kind) == (1.0, 3.0, 2.0, 3, "gauge")
    assert w.delta is None and w.rate is None


def test_gauge_mean_starts_at_first_sample() -> None:
    windows = run([(30.0, [gauge("g", 4.0)]), (45.0, [gauge("g", 8.0)])])
    assert only(windows, "g", 0.0).mean == pytest.approx((4 * 15 + 8 * 15) / 30)


# -- histograms -------------------------------------------------------------------------------


def test_histogram_quantiles_hand_computed() -> None:
    windows = run([(0.0, [hist((0, 0, 0, 0), 0.0)]), (30.0, [hist((10, 30, 40, 40), 20.0)])])
    w = only(windows, "ttft_seconds", 0.0)
    assert (w.delta, w.sum_delta, w.mean, w.rate) == (40, 20.0, 0.5, 40 / 30)
    # p50: rank 20 in (0.1, 0.5] holding 20 obs, 10 below -> 0.1 + 0.4 * 10/20.
    assert w.p50 == pytest.approx(0.3)
    assert w.p90 == pytest.approx(0.5 + 0.5 * 6 / 10)
    assert w.p99 == pytest.approx(0.5 + 0.5 * 9.6 / 10)


def test_histogram_quantile_rank_in_inf_bucket_returns_highest_finite_bound() -> None:
    assert histogram_quantile(0.99, ((0.1, 1), (1.0, 2), (math.inf, 10))) == 1.0


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        (0.5, ((0.1, 0), (1.0, 0), (math.inf, 0)), None),  # no observations
        (0.5, ((0.1, 5), (1.0, 10)), None),  # no +Inf bucket
        (-0.5, ((0.1, 5), (1.0, 10)), -math.inf),  # q is checked first, as in PromQL
        (math.nan, ((1.0, 5), (math.inf, 10)), None),
        (0.5, ((math.inf, 10),), None),  # fewer than two buckets
        (-0.1, ((1.0, 5), (math.inf, 10)), -math.inf),
        (1.5, ((1.0, 5), (math.inf, 10)), math.inf),
        (0.5, ((-1.0, 8), (0.0, 9), (math.inf, 10)), -1.0),  # first bound <= 0
        (0.7, ((1.0, 6), (2.0, 4), (3.0, 9), (math.inf, 10)), 2.0 + 1 / 3),  # made monotonic
    ],
)
def test_histogram_quantile_edge_cases(
    q: float, buckets: tuple[tuple[float, float], ...], expected: float | None
) -> None:
    got = histogram_quantile(q, buckets)
    assert got == pytest.approx(expected) if expected is not None else got is None


@pytest.mark.parametrize("dist", ["exponential", "uniform", "lognormal"])
def test_histogram_quantile_known_distribution_within_bucket(dist: str) -> None:
    rng = np.random.default_rng(7)
    samples = {
        "exponential": rng.exponential(0.4, 50_000),
        "uniform": rng.uniform(0.0, 2.0, 50_000),
        "lognormal": rng.lognormal(-1.0, 0.6, 50_000),
    }[dist]
    # vLLM's TTFT buckets (vllm/v1/metrics/loggers.py), then +Inf.
    bounds = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
              2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0, math.inf)  # fmt: skip
    counts = tuple(float(np.count_nonzero(samples <= b)) for b in bounds)
    windows = run([(0.0, [hist((0.0,) * len(bounds), 0.0, bounds)]),
                   (5.0, [hist(counts, float(samples.sum()), bounds)])])  # fmt: skip
    w = only(windows, "ttft_seconds", 0.0)
    assert w.mean == pytest.approx(float(samples.mean()))
    for q, got in ((0.5, w.p50), (0.9, w.p90), (0.99, w.p99)):
        true = float(np.quantile(samples, q))
        i = next(i for i, b in enumerate(bounds) if true <= b)
        lo = bounds[i - 1] if i else 0.0
        assert got is not None and lo <= got <= bounds[i], (q, got, true)


def test_histogram_count_drop_is_reset() -> None:
    windows = run([(0.0, [hist((5, 10, 20, 20), 9.0)]), (20.0, [hist((6, 12, 24, 24), 11.0)]),
                   (40.0, [hist((1, 2, 2, 2), 0.5)])])  # fmt: skip
    w = only(windows, "ttft_seconds", 0.0)
    assert (w.delta, w.resets, w.sum_delta) == (4 + 2, 1, 2.0 + 0.5)
    # bucket deltas: (1,2,4,4) + (1,2,2,2) = (2,4,6,6); rank 3 in (0.1, 0.5]
    assert w.p50 == pytest.approx(0.1 + 0.4 * (3 - 2) / 2)


def test_histogram_layout_change_keeps_count_drops_quantiles() -> None:
    other = (0.2, 2.0, math.inf)
    windows = run([(0.0, [hist((1, 2, 3, 3), 1.0)]), (20.0, [hist((2, 4, 6, 6), 2.0)]),
                   (40.0, [hist((5, 7, 9), 4.0, other)])])  # fmt: skip
    w = only(windows, "ttft_seconds", 0.0)
    assert (w.delta, w.resets, w.p50, w.p99) == (3 + 9, 1, None, None)


def test_histogram_first_sample_only_unknown() -> None:
    w = only(run([(0.0, [hist((1, 2, 3, 3), 1.0)])]), "ttft_seconds", 0.0)
    assert (w.delta, w.sum_delta, w.p50, w.samples) == (None, None, None, 1)


def test_histogram_no_observations_quantiles_none() -> None:
    windows = run([(0.0, [hist((1, 2, 3, 3), 1.0)]), (30.0, [hist((1, 2, 3, 3), 1.0)])])
    w = only(windows, "ttft_seconds", 0.0)
    assert (w.delta, w.p50, w.p90, w.p99, w.mean) == (0, None, None, None, None)


PROMTOOL_CASES = [
    (0.5, (0.1, 0.5, 1.0, math.inf), (10, 30, 40, 40)),
    (0.99, (0.1, 0.5, 1.0, math.inf), (10, 30, 40, 40)),
    (0.9, (0.1, 0.5, 1.0, math.inf), (10, 30, 40, 50)),  # rank in +Inf
    (0.3, (-1.0, 0.0, 1.0, math.inf), (4, 4, 9, 10)),  # first bound <= 0
    (0.75, (0.001, 0.01, 0.1, 1.0, 10.0, math.inf), (3, 17, 170, 1234, 1300, 1301)),
    (0.2, (0.5, 1.0, 2.0, math.inf), (0, 0, 7, 7)),  # empty leading buckets
]


@pytest.mark.prometheus
def test_histogram_quantile_matches_promtool_exactly(tmp_path: Path) -> None:
    """Our port against Prometheus 2.42's own histogram_quantile (promtool compares exactly)."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed: run `make test`"
    tests = []
    for i, (q, bounds, counts) in enumerate(PROMTOOL_CASES):
        expected = histogram_quantile(q, tuple(zip(bounds, counts, strict=True)))
        assert expected is not None
        series = [
            {"series": f'h{i}_bucket{{le="{"+Inf" if b == math.inf else repr(b)}"}}',
             "values": str(c)}
            for b, c in zip(bounds, counts, strict=True)
        ]  # fmt: skip
        tests.append(
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": f"histogram_quantile({q}, h{i}_bucket)",
                        "eval_time": "0m",
                        "exp_samples": [{"labels": "{}", "value": expected}],
                    }
                ],
            }
        )

    path = tmp_path / "quantile_test.yml"
    path.write_text(yaml.safe_dump({"tests": tests}))
    proc = subprocess.run(
        [promtool, "test", "rules", str(path)], check=False, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- ratios -----------------------------------------------------------------------------------


def test_ratio_mean_is_delta_num_over_delta_den() -> None:
    other: Labels = (("engine", "1"), ("model_name", "m"))
    rollup = Rollup("engine-a", ratios=[RATIO])
    rollup.add(snap(0.0, counter("hits_total", 10), counter("queries_total", 100),
                    counter("queries_total", 5, other)))  # fmt: skip
    rollup.add(snap(30.0, counter("hits_total", 40), counter("queries_total", 160),
                    counter("queries_total", 5, other)))  # fmt: skip
    windows = rollup.add(snap(60.0))
    ratios = [w for w in windows if w.kind == "ratio"]
    assert len(ratios) == 1, "only label sets present in both numerator and denominator"
    (r,) = ratios
    assert (r.signal, r.labels, r.mean, r.delta, r.samples) == ("hit_ratio", ENGINE, 0.5, 60, 2)


def test_ratio_zero_denominator_is_none_and_unknown_delta_is_none() -> None:
    rollup = Rollup("engine-a", ratios=[RATIO])
    rollup.add(snap(0.0, counter("hits_total", 1), counter("queries_total", 3)))
    rollup.add(snap(30.0, counter("hits_total", 1), counter("queries_total", 3)))
    (idle,) = [w for w in rollup.add(snap(60.0, counter("hits_total", 1))) if w.kind == "ratio"]
    assert (idle.mean, idle.delta) == (None, 0)
    fresh = Rollup("engine-a", ratios=[RATIO])
    fresh.add(snap(0.0, counter("hits_total", 1), counter("queries_total", 3)))
    (unknown,) = [w for w in fresh.flush() if w.kind == "ratio"]
    assert (unknown.mean, unknown.delta) == (None, None)


def test_ratio_default_comes_from_catalog() -> None:
    assert Rollup("x").ratios == tuple(DERIVED_RATIOS)


# -- non-finite values, ordering, flush, memory -------------------------------------------------


@pytest.mark.parametrize(
    ("sample", "reason"),
    [
        (counter("c", math.nan), "nan"),
        (counter("c", math.inf), "inf"),
        (counter("c", -3.0), "negative"),
        (gauge("g", math.nan), "nan"),
        (gauge("g", math.inf), "inf"),
        (gauge("g", -math.inf), "inf"),
        (hist((1, 2, math.nan, 3), 1.0), "nan"),
        (hist((1, 2, 3, 3), math.nan), "nan"),
        (hist((1, 2, 3, math.inf), 1.0), "inf"),
        (  # no +Inf bucket
            SignalSample.histogram("ttft_seconds", ENGINE, 3.0, ((1.0, 3.0),), 1.0),
            "malformed_histogram",
        ),
        (SignalSample("r", "ratio", ENGINE, 0.5), "kind"),
    ],
)
def test_non_finite_sample_skipped_counted_and_window_unpoisoned(
    sample: SignalSample, reason: str
) -> None:
    good = {"counter": counter("c", 10), "gauge": gauge("g", 0.5)}.get(
        sample.kind, hist((1, 2, 3, 3), 1.0)
    )
    rollup = Rollup("engine-a", ratios=())
    rollup.add(snap(0.0, good))
    rollup.add(snap(20.0, sample))
    windows = rollup.flush()
    assert rollup.skipped == {reason: 1}
    assert all(math.isfinite(v) for w in windows for v in (w.mean, w.delta, w.min, w.max)
               if v is not None)  # fmt: skip
    if sample.kind in ("counter", "gauge"):
        (w,) = windows
        assert w.samples == 1


def test_windows_close_in_order_aligned_and_sorted() -> None:
    rollup = Rollup("engine-a", window_s=60.0, ratios=())
    b: Labels = (("engine", "b"),)
    a: Labels = (("engine", "a"),)
    assert rollup.add(snap(125.0, gauge("z", 1), gauge("g", 1, b), gauge("g", 2, a))) == []
    assert rollup.add(snap(179.9, gauge("g", 3, a))) == []
    closed = rollup.add(snap(180.0, gauge("g", 4, a)))  # at the end: closes [120, 180)
    assert [(w.start, w.signal, w.labels) for w in closed] == [
        (120.0, "g", a), (120.0, "g", b), (120.0, "z", ENGINE)
    ]  # fmt: skip
    closed = rollup.add(snap(600.0, gauge("g", 5, a)))  # gap: only [180, 240) had samples
    assert [(w.start, w.samples) for w in closed] == [(180.0, 1)]
    assert [w.start for w in rollup.flush()] == [600.0]


def test_flush_closes_once_and_refuses_late_snapshots() -> None:
    rollup = Rollup("engine-a", ratios=())
    rollup.add(snap(10.0, gauge("g", 1)))
    assert len(rollup.flush()) == 1
    assert rollup.flush() == []
    assert rollup.add(snap(20.0, gauge("g", 2))) == []  # inside the flushed window
    assert rollup.flush() == []
    assert rollup.skipped["out_of_order"] == 1


@pytest.mark.parametrize("ts", [5.0, 10.0, math.nan, math.inf])
def test_out_of_order_or_duplicate_snapshot_skipped(ts: float) -> None:
    rollup = Rollup("engine-a", ratios=())
    rollup.add(snap(10.0, counter("c", 1)))
    assert rollup.add(snap(ts, counter("c", 100))) == []
    (w,) = rollup.flush()
    assert (w.samples, w.last, rollup.skipped["out_of_order"]) == (1, 1, 1)


def test_stale_series_forgotten_after_n_windows() -> None:
    rollup = Rollup("engine-a", ratios=(), stale_windows=2)
    rollup.add(snap(0.0, counter("gone", 1), counter("kept", 1)))
    for minute in range(1, 4):
        rollup.add(snap(60.0 * minute, counter("kept", minute)))
    assert rollup.tracked_series == 1
    closed = rollup.add(snap(240.0, counter("gone", 50)))
    closed += rollup.flush()
    assert only(closed, "gone", 240.0).delta is None  # came back as a new series


@pytest.mark.parametrize("kwargs", [{"window_s": 0}, {"window_s": -5}, {"window_s": math.nan},
                                    {"stale_windows": 0}])  # fmt: skip
def test_rollup_bad_settings_raise_config_error(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        Rollup("engine-a", ratios=(), **kwargs)  # type: ignore[arg-type]


def test_rollup_real_exposition_windows_for_every_signal(fixtures_dir: Path) -> None:
    text = (fixtures_dir / "metrics" / "vllm-0.33.0-metrics-full.txt").read_text()
    rollup = Rollup("engine-a")
    windows: list[Window] = []
    for ts in (0.0, 15.0, 30.0, 45.0, 60.0):
        snapshot = read_exposition(text, "engine-a", ts)
        windows += rollup.add(snapshot)
    signals = {s.signal for s in read_exposition(text, "engine-a", 0.0).samples}
    assert {w.signal for w in windows if w.kind != "ratio"} == signals
    assert rollup.skipped == {}
    for w in windows:  # the same exposition four times: nothing moved
        if w.kind in ("counter", "histogram"):
            assert (w.delta, w.resets) == (0, 0), w
        if w.kind == "histogram":
            assert w.p50 is None
