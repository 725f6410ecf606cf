"""Benchmark: one cluster-level demand forecast from 7 days of 1-minute windows.

Run: .venv/bin/python benchmarks/bench_forecast.py [--engines N] [--repeat N]

Builds 7 days × 1,440 one-minute ``kv_cache_usage_ratio`` Window records for N engines
(daily cycle + growth + noise, seeded), sums them into KV tokens in use with
demand_series_from_windows, then times, in the same run:
  * baseline  forecast_demand(models=("snaive",)): seasonal naive + its rolling-origin backtest,
  * full      forecast_demand with every candidate (naive, 3 ETS, SARIMAX + Fourier), backtest,
              final refit, intervals, saturation and the 1,000-path crossing probability,
and prints wall times (median of --repeat), the ratio full / baseline and the forecast's own
figures. The target is a few seconds for the full forecast on one core. No asserts.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import statsmodels.tsa.exponential_smoothing.ets  # noqa: E402
import statsmodels.tsa.statespace.sarimax  # noqa: E402, F401

from core.records import Window, labels_of  # noqa: E402
from planner.forecast.demand import demand_series_from_windows, forecast_demand  # noqa: E402

T0 = 1_699_920_000.0  # a UTC midnight
BLOCKS_X_BLOCK_SIZE = 30_000 * 16  # illustrative engine: 30k blocks of 16 tokens


def windows(engines: int, days: int, seed: int) -> list[Window]:
    rng = np.random.default_rng(seed)
    n = days * 1440
    h = np.arange(n) / 60.0
    out: list[Window] = []
    for e in range(engines):
        phase = rng.uniform(-1, 1)
        usage = 0.45 + 0.002 * h + 0.2 * np.sin(2 * np.pi * (h + phase) / 24)
        usage = np.clip(usage + rng.normal(0, 0.03, n), 0.0, 1.0)
        lbl = labels_of({"engine": "0", "model_name": "m"})
        src = f"engine-{e}:8000"
        out.extend(
            Window(src, "kv_cache_usage_ratio", lbl, T0 + 60.0 * i, 60.0, "gauge", 4, mean=u)
            for i, u in enumerate(usage.tolist())
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--engines", type=int, default=8)
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    t = time.perf_counter()

    print(f"statsmodels import (one-off)  {time.perf_counter() - t:7.3f} s")
    wins = windows(args.engines, args.days, seed=0)
    t = time.perf_counter()
    series = demand_series_from_windows(wins, capacity_tokens=float(BLOCKS_X_BLOCK_SIZE))
    print(
        f"demand_series_from_windows    {time.perf_counter() - t:7.3f} s  "
        f"({len(wins):,} windows, {args.engines} engines -> {len(series):,} points)"
    )
    capacity = 0.95 * args.engines * BLOCKS_X_BLOCK_SIZE
    horizon = 3 * 86_400.0

    def run(models: tuple[str, ...] | None) -> tuple[float, object]:
        start = time.perf_counter()
        f = forecast_demand(series, horizon_s=horizon, capacity=capacity, models=models)
        return time.perf_counter() - start, f

    base_times, full_times = [], []
    full = None
    for _ in range(args.repeat):  # interleaved: the machine's noise hits both alike
        base_times.append(run(("snaive",))[0])
        dt, full = run(None)
        full_times.append(dt)
    base, fullt = statistics.median(base_times), statistics.median(full_times)
    print(f"baseline (seasonal naive)     {base:7.3f} s  median of {args.repeat}")
    print(f"full forecast                 {fullt:7.3f} s  median of {args.repeat}")
    print(f"ratio full / baseline         {fullt / base:7.1f} x   (target: full <= a few s)")
    assert full is not None
    d = full.to_dict()  # type: ignore[attr-defined]
    print(f"method {d['method']}; {d['history_points']} points; horizon {len(d['points'])} steps")
    print(
        f"backtest: {d['backtest_origins']} origins x {d['backtest_horizon_steps']} steps, "
        f"coverage {d['backtest_coverage']:.2f} at {d['level']:.0%}, "
        f"MAPE {d['backtest_mape']:.2f} %, MASE {d['backtest_mase']:.3f}"
    )
    for c in d["candidates"]:
        print(
            f"  {c['method']:<36} {c['status']:<8} interval score "
            f"{(c['interval_score'] or float('nan')):12.4g}  coverage {c['coverage']}"
        )
    print(f"saturation: {d['saturation_note']}; P(within horizon) {d['saturation_probability']}")


if __name__ == "__main__":
    main()
