"""Benchmark: the cost of vLLM's --kv-cache-metrics in the simulator (engine.kv_cache_metrics).

Run: .venv/bin/python benchmarks/bench_kv_metrics.py [--scenario NAME] [--seconds S]
     [--sample RATE ...] [--rounds N]

Simulates a bundled scenario (default saturated_16x_h100, the simulator benchmark's: 16
engines, HBM saturated) for S simulated seconds with the metrics off and on at each sample
rate (default vLLM's 0.01, and 1.0: every block tracked), alternately `--rounds` times in
this process, and prints the CPU seconds of each (best of the rounds), the on/off ratios and
whether every run's summary is the same as the run without the metrics (it must be: the
sampling has its own random stream; `parameters` differ by construction and are left out).

No asserts: machines are noisy (the ratio of bests, taken alternately, is the number to read).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.simulate.cluster import Simulation  # noqa: E402
from planner.simulate.scenario import Scenario, parse_scenario, read_scenario_file  # noqa: E402
from planner.simulate.scenarios import scenario_file  # noqa: E402


def _scenario(name: str, seconds: float, sample: float | None) -> Scenario:
    with scenario_file(name) as path:
        raw = dict(read_scenario_file(path))
        raw["duration_s"] = seconds
        raw["engine"] = (
            {"kv_cache_metrics": False}
            if sample is None
            else {"kv_cache_metrics": True, "kv_cache_metrics_sample": sample}
        )
        return parse_scenario(raw, where=str(path), base_dir=path.parent)


def _run(scenario: Scenario) -> tuple[float, dict[str, Any]]:
    cpu = time.process_time()
    result = Simulation(scenario).run().to_dict()
    cpu = time.process_time() - cpu
    for key in ("wall_s", "parameters"):
        result.pop(key, None)
    return cpu, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="saturated_16x_h100", help="a bundled scenario")
    ap.add_argument("--seconds", type=float, default=900.0, help="simulated seconds")
    ap.add_argument("--sample", type=float, nargs="+", default=[0.01, 1.0], help="rates")
    ap.add_argument("--rounds", type=int, default=3, help="alternations (best of)")
    args = ap.parse_args()
    variants: list[float | None] = [None, *args.sample]
    best: dict[str, float] = {}
    same = True
    reference: dict[str, Any] | None = None
    for _ in range(args.rounds):
        for sample in variants:
            cpu, result = _run(_scenario(args.scenario, args.seconds, sample))
            label = "off" if sample is None else f"on@{sample:g}"
            best[label] = min(cpu, best.get(label, float("inf")))
            if reference is None:
                reference = result
            same = same and json.dumps(result, sort_keys=True) == json.dumps(
                reference, sort_keys=True
            )
    off = best["off"]
    print(f"{args.scenario}, {args.seconds:g} simulated s, best of {args.rounds} (CPU s):")
    for label, cpu in best.items():
        print(f"  {label:<10} {cpu:8.2f} s   ×{cpu / off:.3f} of off")
    print(f"  summaries identical to the run without the metrics: {same}")


if __name__ == "__main__":
    main()
