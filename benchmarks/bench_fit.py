"""Cost of every planner fit on 100 engines × 7 days of 1-minute windows, on one core.

Measures, on a seeded synthetic cluster (benchmarks.accuracy.fitsynth) of ~1M engine-windows:
* the frame build (planner.frames.frames.engine_frame) from ~12M columnar windows, with string and
  with categorical source/engine/signal columns;
* each fit of planner.fit.run.fit_all (preemption knee, gain per offload mode, MFU, hit rate)
  and the whole report.

Baseline (same run): one plain ``numpy.linalg.lstsq`` on the gain fit's design matrix
(1M × 10) — the least a regression on this data can cost. Ratios, not absolute times, are
what to compare across machines. BLAS threads are pinned to one before numpy loads.

    .venv/bin/python benchmarks/bench_fit.py [--engines 100] [--days 7]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from benchmarks.accuracy.fitsynth import H100_BF16_FLOPS, llama8b_prefill_flops, synthetic_frame  # noqa: E402
from planner.fit.run import fit_all  # noqa: E402
from planner.frames.frames import engine_frame  # noqa: E402

# (signal, Window field, frame column) — the windows a store would hand back.
_SPEC = (
    ("preemptions_total", "delta", "preemptions"),
    ("prompt_tokens_total", "rate", "prompt_tokens_per_s"),
    ("generation_tokens_total", "rate", "output_tokens_per_s"),
    ("kv_cache_usage_ratio", "mean", "kv_util"),
    ("requests_running", "mean", "running"),
    ("requests_waiting", "mean", "waiting"),
    ("prefix_cache_hit_ratio", "mean", "prefix_hit_ratio"),
    ("ttft_seconds", "delta", "ttft_count"),
    ("request_prompt_tokens", "delta", "requests"),
    ("request_success_total", "delta", "requests"),
    ("lmcache_hit_ratio", "mean", "lmcache_hit_ratio"),
    ("lmcache_l1_usage_bytes", "mean", "l1_usage_bytes"),
)


def windows_table(frame: pd.DataFrame) -> pd.DataFrame:
    parts = [
        pd.DataFrame({"source": frame["source"], "engine": frame["engine"], "signal": signal,
                      "start": frame["start"], "length_s": frame["window_s"], field: frame[col]})
        for signal, field, col in _SPEC
    ]  # fmt: skip
    return pd.concat(parts, ignore_index=True)


def timed(label: str, fn: object, baseline: float | None = None) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()  # type: ignore[operator]
    dt = time.perf_counter() - t0
    ratio = f"  ({dt / baseline:6.1f}× lstsq)" if baseline else ""
    print(f"{label:<42s} {dt:8.2f} s{ratio}", flush=True)
    return dt, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", type=int, default=100)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    n_windows = int(args.days * 1440)
    frame = synthetic_frame(args.engines, n_windows, seed=args.seed)
    print(f"{args.engines} engines × {n_windows} 1-minute windows = {len(frame):,} rows")

    # Baseline: plain lstsq on the gain fit's design (piecewise-linear × mode, 10 columns).
    u = frame["kv_util"].to_numpy()
    d = (frame["offload_mode"] == "native").to_numpy(dtype=float)
    knots = np.quantile(u, [0.25, 0.5, 0.75])
    base = np.column_stack([np.ones_like(u), u, *(np.maximum(0, u - k) for k in knots)])
    design = np.hstack([base, base * d[:, None]])
    y = frame["tokens_per_s"].to_numpy()
    lstsq, _ = timed("baseline: numpy lstsq (1M × 10)",
                     lambda: np.linalg.lstsq(design, y, rcond=None))  # fmt: skip

    table = windows_table(frame)
    print(f"frame build from {len(table):,} columnar windows:")
    timed("  engine_frame (str columns)", lambda: engine_frame(table), lstsq)
    cat = table.astype({"source": "category", "engine": "category", "signal": "category"})
    timed("  engine_frame (categorical columns)", lambda: engine_frame(cat), lstsq)

    total, report = timed(
        "fit_all (every fit)",
        lambda: fit_all(frame, prefill_flops=llama8b_prefill_flops, peak_flops=H100_BF16_FLOPS),
        lstsq,
    )
    for what, seconds in report.seconds:  # type: ignore[attr-defined]
        print(f"  {what:<40s} {seconds:8.2f} s  ({seconds / lstsq:6.1f}× lstsq)")
    print(f"skipped: {[s.what for s in report.skipped]}")  # type: ignore[attr-defined]
    print(f"RESULT fit_all {total:.2f} s = {total / lstsq:.1f}× lstsq baseline "
          f"(target ≤ 30 s on one core)")  # fmt: skip


if __name__ == "__main__":
    main()
