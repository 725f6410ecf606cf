"""Benchmark: one simulated hour of a saturated 16-engine cluster, event-driven vs per-step.

Run: .venv/bin/python benchmarks/bench_sim.py [--hours H] [--baseline-s S]

Scenario: bundled planner/simulate/scenarios/saturated_16x_h100.yaml (4 nodes x 4 H100,
Llama-3.1-8B TP1, 2,048 closed-loop long-context clients keeping HBM saturated). Prints
  * the event-driven simulation of the whole hour: wall and CPU seconds, events, events/s,
    simulated seconds per wall second (target: the hour in <= 10 s wall on one core);
  * the baseline measured in the same run: the same engines stepped one decode step per
    event (max_jump=1, the naive per-step loop) over the first simulated minute(s), against
    the event-driven simulation of the same minute(s): the speed-up ratio, and the naive
    loop's projected time for the hour.
Both runs of the baseline window give identical results (checked). No asserts: machines are
noisy, and the wall time of a shared machine can exceed its CPU time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.simulate.cluster import Simulation  # noqa: E402
from planner.simulate.scenario import Scenario, load_scenario  # noqa: E402
from planner.simulate.scenarios import scenario_file  # noqa: E402

SCENARIO = "saturated_16x_h100"  # bundled: planner/simulate/scenarios/


def _timed(scenario: Scenario, max_jump: int | None) -> tuple[Simulation, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    sim = Simulation(scenario, max_jump=max_jump)
    sim.advance_to(scenario.duration_s)
    return sim, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=1.0, help="simulated hours (default 1)")
    ap.add_argument(
        "--baseline-s",
        type=float,
        default=60.0,
        help="simulated seconds the naive per-step baseline covers",
    )
    args = ap.parse_args()
    with scenario_file(SCENARIO) as path:
        base = load_scenario(path)
    window = dataclasses.replace(base, duration_s=args.baseline_s)
    naive, _, naive_cpu = _timed(window, max_jump=1)
    fast, _, fast_cpu = _timed(window, max_jump=None)
    # same requests, same engines, same times up to float rounding (a jump sums its steps in
    # closed form, the naive loop one by one)
    a = sorted(naive.completed, key=lambda c: c[6])
    b = sorted(fast.completed, key=lambda c: c[6])
    same = len(a) == len(b) and all(
        x[6] == y[6] and x[5] == y[5] and abs(x[2] - y[2]) < 1e-6 for x, y in zip(a, b, strict=True)
    )
    hour = dataclasses.replace(base, duration_s=3600.0 * args.hours)
    sim, wall, cpu = _timed(hour, max_jump=None)
    steps = sum(e.steps for e in sim.engines)
    out = {
        "scenario": base.name,
        "simulated_s": hour.duration_s,
        "engines": len(sim.engines),
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "events": sim.events,
        "events_per_cpu_s": round(sim.events / cpu),
        "engine_steps": steps,
        "engine_steps_per_event": round(steps / sim.events, 2),
        "simulated_s_per_wall_s": round(hour.duration_s / wall, 1),
        "completed_requests": len(sim.completed),
        "kv_usage_mean": round(
            sum(e.kv_integral for e in sim.engines) / len(sim.engines) / hour.duration_s, 3
        ),
        "preemptions": sum(e.preemptions for e in sim.engines),
        "baseline_window_s": args.baseline_s,
        "baseline_naive_cpu_s": round(naive_cpu, 3),
        "baseline_naive_events": naive.events,
        "baseline_event_driven_cpu_s": round(fast_cpu, 3),
        "baseline_results_identical": same,
        "speedup_vs_naive_same_window": round(naive_cpu / fast_cpu, 2),
        "naive_projected_cpu_s_for_run": round(naive_cpu / args.baseline_s * hour.duration_s, 1),
        "speedup_vs_naive_projected": round(naive_cpu / args.baseline_s * hour.duration_s / cpu, 2),
    }
    print(
        f"simulated {hour.duration_s:.0f} s of {out['engines']} engines in {wall:.2f} s wall "
        f"({cpu:.2f} s CPU): {sim.events:,} events, {out['events_per_cpu_s']:,} events/CPU-s, "
        f"{steps:,} engine steps ({out['engine_steps_per_event']} per event)"
    )
    print(
        f"baseline: naive per-step loop over the first {args.baseline_s:.0f} s took "
        f"{naive_cpu:.2f} s CPU vs {fast_cpu:.2f} s event-driven -> "
        f"x{out['speedup_vs_naive_same_window']} (identical results: {same}); projected "
        f"naive run {out['naive_projected_cpu_s_for_run']:.0f} s CPU -> "
        f"x{out['speedup_vs_naive_projected']}"
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
