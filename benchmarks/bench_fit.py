"""Cost of every planner fit on 100 engines × 7 days of 1-minute windows, on one core.

Measures, on a seeded synthetic cluster (benchmarks.accuracy.fitsynth) of ~1M engine-windows:
* the frame build (planner.frames.frames.engine_frame) from ~12M columnar windows, with string and
  with categorical source/engine/signal columns;
* each fit of planner.fit.orchestrate.fit_all (preemption knee, gain per offload mode, MFU, hit
  rate) and the whole report.

Baselines (same run):
* one plain ``numpy.linalg.lstsq`` on the gain fit's design matrix (1M × 10) — the least a
  regression on this data can cost;
* the fits before they moved onto statsmodels (issue 14): ``--baseline-rev`` (default
  468587f, the last commit with the hand-written IRLS and OLS) is exported with
  ``git archive`` into a temporary directory and its ``fit_all`` run on the same frame in a
  subprocess (the frame passed as a pickle). The run prints new ÷ old per fit and for the
  whole report, and how far the two reports' numbers are apart: point estimates (relative),
  interval ends, and the gain intervals' width ratio (the Bell–McCaffrey degrees of freedom
  widen them where CR2 is used: fewer than 10 engines, e.g. ``--engines 8``).

Ratios, not absolute times, are what to compare across machines. BLAS threads are pinned
to one before numpy loads.

    .venv/bin/python benchmarks/bench_fit.py [--engines 100] [--days 7] [--baseline-rev REV]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pickle  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from benchmarks.gitrev import revision_tree  # noqa: E402

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


# A baseline revision from before the fit registry names its fits in its own report shape.
_BEFORE_REGISTRY = {"preemption": "preemption_knee", "mfu": "prefill_mfu",
                    "hitrate": "lmcache_hitrate", "gain/native": "equal_kv_native",
                    "gain/lmcache": "equal_kv_lmcache"}  # fmt: skip


def fit_results(report: Any) -> list[tuple[str, Any]]:
    """(registry name, result or None) of each fit in ``report``, of this tree or a baseline's."""
    if hasattr(report, "fits"):
        return [(o.name, o.result) for o in report.fits]
    fits = [("preemption", report.preemption), ("mfu", report.mfu), ("hitrate", report.hitrate)]
    fits += [(f"gain/{g.offload}", g) for g in report.gains]
    return [(_BEFORE_REGISTRY.get(name, name), fit) for name, fit in fits]


def seconds_of(report: Any) -> dict[str, float]:
    """Each fit's wall time by registry name, of this tree or a baseline's report."""
    return {_BEFORE_REGISTRY.get(name, name): s for name, s in report.seconds}


def numbers(report: Any) -> dict[str, Any]:
    """Every fit's point estimates and interval ends, and each gain grid point's interval."""
    out: dict[str, Any] = {}
    for name, fit in fit_results(report):
        if fit is None:
            continue
        row = {"estimate": fit.estimate, "lo": fit.interval.lo, "hi": fit.interval.hi}
        for extra in ("slope", "base_rate", "seconds_per_flop", "overhead_s"):
            est = getattr(fit, extra, None)
            if est is not None:
                row |= {extra: est.value, f"{extra}_lo": est.interval.lo,
                        f"{extra}_hi": est.interval.hi}  # fmt: skip
        if hasattr(fit, "grid"):
            row["grid"] = [(p.relative, p.relative_interval.lo, p.relative_interval.hi)
                           for p in fit.grid]  # fmt: skip
            row["cov_type"] = fit.cov_type
        out[name] = row
    return out


def timed_fit_all(frame: pd.DataFrame) -> tuple[float, Any]:
    from benchmarks.accuracy.fitsynth import H100_BF16_FLOPS, llama8b_prefill_flops  # noqa: PLC0415 - baseline: this module also runs with a git revision's tree first on sys.path (bench --baseline); ours import there, after the path is set
    from planner.fit.orchestrate import fit_all  # noqa: PLC0415 - baseline: this module also runs with a git revision's tree first on sys.path (bench --baseline); ours import there, after the path is set

    t0 = time.perf_counter()
    report = fit_all(frame, prefill_flops=llama8b_prefill_flops, peak_flops=H100_BF16_FLOPS)
    return time.perf_counter() - t0, report


def worker(frame_path: str, out_path: str, tree: str) -> None:
    """Run in the baseline tree (its directory first on sys.path): time fit_all, dump."""
    import planner  # noqa: PLC0415 - baseline: this module also runs with a git revision's tree first on sys.path (bench --baseline); ours import there, after the path is set

    if not str(Path(planner.__file__).resolve()).startswith(str(Path(tree).resolve())):
        raise SystemExit(f"baseline worker imported planner from {planner.__file__}, not {tree}")

    with open(frame_path, "rb") as fh:
        frame = pickle.load(fh)
    total, report = timed_fit_all(frame)
    with open(out_path, "wb") as fh:
        pickle.dump({"total": total, "seconds": seconds_of(report),
                     "numbers": numbers(report)}, fh)  # fmt: skip


def baseline_fits(frame: pd.DataFrame, rev: str) -> dict[str, Any]:
    """fit_all of revision ``rev`` (git archive into a temp dir) on ``frame``, subprocess."""
    with (
        revision_tree(rev, ("core", "store", "collector", "planner"), who="bench_fit") as tree,
        tempfile.TemporaryDirectory(prefix="bench-fit-") as tmp,
    ):
        # the benchmark's own synthetic-data helpers come from this checkout
        (tree / "benchmarks").symlink_to(ROOT / "benchmarks")
        frame_path, out_path = Path(tmp) / "frame.pkl", Path(tmp) / "out.pkl"
        with open(frame_path, "wb") as fh:
            pickle.dump(frame, fh)
        # bench_fit puts this checkout first on sys.path when imported: the baseline tree
        # goes back in front before anything imports planner, and the worker checks it
        code = (f"import sys; sys.path.insert(0, {str(tree)!r}); "
                "from benchmarks.bench_fit import worker; "
                f"sys.path.insert(0, {str(tree)!r}); "
                f"worker({str(frame_path)!r}, {str(out_path)!r}, {str(tree)!r})")  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(tree)}
        subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=tree)
        with open(out_path, "rb") as fh:
            out: dict[str, Any] = pickle.load(fh)
    return out


def _rel(a: float, b: float) -> float:
    if a == b or (math.isnan(a) and math.isnan(b)):
        return 0.0
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


def compare(old: dict[str, Any], new: dict[str, Any]) -> None:
    """How far the new report's numbers are from the baseline's."""
    for name in sorted(set(old) | set(new)):
        if name not in old or name not in new:
            print(f"  {name:<12s} only in {'new' if name in new else 'baseline'}")
            continue
        o, n = old[name], new[name]
        skip = {"grid", "cov_type"}
        points = [k for k in o if k not in skip and not k.endswith(("lo", "hi"))]
        ends = [k for k in o if k.endswith(("lo", "hi"))]
        est = max(_rel(o[k], n[k]) for k in points)
        end = max(_rel(o[k], n[k]) for k in ends)
        line = f"  {name:<12s} estimates max rel diff {est:.1e}, interval ends {end:.1e}"
        if "grid" in o:
            go, gn = np.array(o["grid"]), np.array(n["grid"])
            line += f"; grid relative gain max rel diff {np.nanmax(np.abs(go[:, 0] - gn[:, 0]) / np.maximum(np.abs(go[:, 0]), 1e-12)):.1e}"  # noqa: E501
            with np.errstate(invalid="ignore"):
                ratio = (gn[:, 2] - gn[:, 1]) / (go[:, 2] - go[:, 1])
            fin = ratio[np.isfinite(ratio)]
            line += (f"; {n['cov_type']} interval width new/old median {np.median(fin):.3f} "
                     f"(range {fin.min():.3f}–{fin.max():.3f}, "
                     f"{int((~np.isfinite(ratio)).sum())} unbounded)")  # fmt: skip
        print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", type=int, default=100)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--baseline-rev",
        default="468587f",
        help="git revision of the fits to compare with (default: before statsmodels)",
    )
    args = ap.parse_args()
    from benchmarks.accuracy.fitsynth import synthetic_frame  # noqa: PLC0415 - baseline: this module also runs with a git revision's tree first on sys.path (bench --baseline); ours import there, after the path is set
    from planner.frames.frames import engine_frame  # noqa: PLC0415 - baseline: this module also runs with a git revision's tree first on sys.path (bench --baseline); ours import there, after the path is set

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

    # the frame above is what both implementations fit; the baseline runs first
    print(f"baseline: fit_all at {args.baseline_rev} (subprocess, same frame)", flush=True)
    old = baseline_fits(frame, args.baseline_rev)
    total, report = timed_fit_all(frame)
    print(f"{'fit_all (every fit)':<42s} {total:8.2f} s  ({total / lstsq:6.1f}× lstsq)")
    print(f"  {'fit':<40s} {'new':>8s}   {'baseline':>8s}   new/baseline")
    for what, seconds in report.seconds:
        before = old["seconds"].get(what, math.nan)
        print(f"  {what:<40s} {seconds:8.2f} s {before:8.2f} s   {seconds / before:6.2f}×")
    print(f"skipped: {[s.name for s in report.skipped]}")
    print("numbers, new vs baseline:")
    compare(old["numbers"], numbers(report))
    print(f"RESULT fit_all {total:.2f} s = {total / old['total']:.2f}× the baseline's "
          f"{old['total']:.2f} s ({args.baseline_rev}) = {total / lstsq:.1f}× lstsq "
          "(target ≤ 30 s on one core)")  # fmt: skip


if __name__ == "__main__":
    main()
