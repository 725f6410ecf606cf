"""Re-measure one held-out case's truth at extra offered rates (same seed, same engine).

    .venv/bin/python benchmarks/accuracy_recheck.py --heldout-set 2 --case 8 \\
        --rates 0.09,0.12,0.15 --report benchmarks/results/accuracy_heldout2.json

Used when a study's truth ladder was too coarse where a fitted break-even sits: the truth
interpolates straight between its measured rates, so a sign change between two of them
can be missed. Prints the truth curve's located crossings, every level and the gain at a
few utilizations; the fit is not involved.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.accuracy import scenarios
from benchmarks.accuracy.study import FULL
from benchmarks.accuracy.truth import LevelResult, run_level, served_levels, truth_curve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--heldout-set", type=int, required=True, choices=sorted(scenarios.HELDOUT_SETS),
        help="the held-out set (accuracy_scenarios.HELDOUT_SETS)",
    )  # fmt: skip
    ap.add_argument("--case", type=int, required=True, help="case index in the set")
    ap.add_argument("--rates", required=True, help="extra offered rates, comma-separated")
    ap.add_argument("--report", type=Path, required=True, help="the study's JSON for the case")
    ap.add_argument("--mode", default="native")
    args = ap.parse_args()
    d = scenarios.draw("heldout", args.case, args.heldout_set)
    report = json.loads(args.report.read_text(encoding="utf-8"))
    case = next(c for c in report["cases"] if c["name"] == d.name)
    extra = {float(x) for x in args.rates.split(",")}
    rates = sorted({float(p["rate"]) for p in case["truth_levels"]["none"]} | extra)
    b = FULL
    levels: list[LevelResult] = []
    for mode in ("none", args.mode):
        for rate in rates:
            duration = max(b.truth_s, b.truth_warmup_s + b.truth_min_requests / d.turns / rate)
            levels.append(
                run_level(d.raw, mode, rate, d.seed, duration_s=duration,
                          warmup_s=b.truth_warmup_s, batches=b.truth_batches)
            )  # fmt: skip
    both = served_levels(levels)
    tc = truth_curve(
        args.mode,
        [p for p in both if p.mode == "none"],
        [p for p in both if p.mode == args.mode],
        seed=d.seed,
    )
    print(
        d.name, "crossings", [(round(c.u, 3), round(c.lo, 3), round(c.hi, 3)) for c in tc.crossings]
    )
    for p in sorted(both, key=lambda p: (p.mode, p.rate)):
        print(p.mode, round(p.rate, 4), round(p.u, 4), round(p.served_tp, 1))
    for u in (0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.1):
        print(f"gain at u = {u:.2f}: {100 * tc.gain(u):.2f} %")


if __name__ == "__main__":
    main()
