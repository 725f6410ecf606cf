"""Benchmark: one simulated hour of a saturated 16-engine cluster, event-driven vs per-step.

Run: .venv/bin/python benchmarks/bench_sim.py [--hours H] [--baseline-s S] [--against REF]

Scenario: bundled planner/simulate/scenarios/saturated_16x_h100.yaml (4 nodes x 4 H100,
Llama-3.1-8B TP1, 2,048 closed-loop long-context clients keeping HBM saturated). Prints
  * the event-driven simulation of the whole hour: wall and CPU seconds, events, events/s,
    simulated seconds per wall second (target: the hour in <= 10 s wall on one core);
  * the baseline measured in the same run: the same engines stepped one decode step per
    event (max_jump=1, the naive per-step loop) over the first simulated minute(s), against
    the event-driven simulation of the same minute(s): the speed-up ratio, and the naive
    loop's projected time for the hour.
Both runs of the baseline window give identical results (checked).

`--router POLICY` runs those with another router than the scenario's round_robin (e.g.
`scorer`, which scores every engine per request); not with `--against`.

`--against REF` (a git commit of this repository, e.g. 9999810, the simulator before it was
optimised for issue 13) also runs the hour with that commit's planner/ (exported by
`git archive` into a temporary directory) and with this tree's, alternately `--rounds` times,
each in a fresh process, and prints CPU seconds and events per CPU-second of both, their
ratio (best of the rounds) and whether the two hours' results are identical (the whole
`kvscope simulate --json` summary but wall_s).

No asserts: machines are noisy, and the wall time of a shared machine can exceed its CPU time.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if "--child" in sys.argv:  # a timed hour with another tree's planner/ (see _child)
    sys.path.insert(0, sys.argv[sys.argv.index("--child") + 1])
sys.path.insert(0 if "--child" not in sys.argv else 1, str(ROOT))

from benchmarks.gitrev import revision_tree  # noqa: E402
from planner.simulate.cluster import Simulation  # noqa: E402
from planner.simulate.scenario import Scenario, load_scenario, parse_scenario  # noqa: E402
from planner.simulate.scenarios import scenario_file  # noqa: E402

SCENARIO = "saturated_16x_h100"  # bundled: planner/simulate/scenarios/


def _timed(scenario: Scenario, max_jump: int | None) -> tuple[Simulation, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    sim = Simulation(scenario, max_jump=max_jump)
    sim.advance_to(scenario.duration_s)
    return sim, time.perf_counter() - wall, time.process_time() - cpu


def _child(hours: float) -> None:
    """One timed hour (the planner/ first on sys.path), as one JSON line: CPU and wall
    seconds of advance_to, events, and a digest of the summary without wall_s."""
    with scenario_file(SCENARIO) as path:
        base = load_scenario(path)
    hour = dataclasses.replace(base, duration_s=3600.0 * hours)
    sim, wall, cpu = _timed(hour, max_jump=None)
    summary = sim.run().to_dict()  # already advanced: summarises
    summary.pop("wall_s")
    text = json.dumps(summary, sort_keys=True)
    print(
        json.dumps(
            {
                "cpu_s": cpu,
                "wall_s": wall,
                "events": sim.events,
                "planner": str(Path(sys.modules["planner"].__file__ or "").parent),
                "digest": hashlib.sha256(text.encode()).hexdigest(),
            }
        )
    )


def _run_child(tree: Path, hours: float) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(tree)]
    proc = subprocess.run(
        [*cmd, "--hours", str(hours)], capture_output=True, text=True, check=False, env=env
    )
    if proc.returncode != 0:
        raise SystemExit(f"bench_sim: the run with {tree} failed:\n{proc.stderr}")
    doc: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    if Path(doc["planner"]) != tree / "planner":
        raise SystemExit(f"bench_sim: the run meant for {tree} imported {doc['planner']}")
    return doc


def _against(ref: str, hours: float, rounds: int) -> dict[str, Any]:
    """The hour with `ref`'s planner/ and with this tree's, alternately, `rounds` times."""
    with revision_tree(ref, ("core", "planner", "collector"), who="bench_sim --against") as tmp:
        before, after = [], []
        for _ in range(rounds):
            before.append(_run_child(tmp, hours))
            after.append(_run_child(ROOT, hours))
    b = min(before, key=lambda d: float(d["cpu_s"]))
    a = min(after, key=lambda d: float(d["cpu_s"]))
    identical = len({d["digest"] for d in before + after}) == 1
    return {
        "against": ref,
        "rounds": rounds,
        "before_cpu_s": round(b["cpu_s"], 2),
        "after_cpu_s": round(a["cpu_s"], 2),
        "before_cpu_s_all": [round(d["cpu_s"], 2) for d in before],
        "after_cpu_s_all": [round(d["cpu_s"], 2) for d in after],
        "before_wall_s": round(b["wall_s"], 2),
        "after_wall_s": round(a["wall_s"], 2),
        "before_events_per_cpu_s": round(b["events"] / b["cpu_s"]),
        "after_events_per_cpu_s": round(a["events"] / a["cpu_s"]),
        "speedup_cpu": round(b["cpu_s"] / a["cpu_s"], 2),
        "results_identical": identical and b["events"] == a["events"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=1.0, help="simulated hours (default 1)")
    ap.add_argument(
        "--baseline-s",
        type=float,
        default=60.0,
        help="simulated seconds the naive per-step baseline covers",
    )
    ap.add_argument("--against", help="a git commit: also time the hour with its planner/")
    ap.add_argument("--rounds", type=int, default=2, help="with --against: alternations")
    ap.add_argument("--router", help="run with this router (e.g. scorer); not with --against")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # internal: _child's planner/ tree
    args = ap.parse_args()
    if args.child:
        _child(args.hours)
        return
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.router and args.against:
        ap.error("--router and --against: the baseline tree may not know the router")
    with scenario_file(SCENARIO) as path:
        base = load_scenario(path)
    if args.router:
        raw = {**base.raw, "cluster": {**base.raw["cluster"], "router": args.router}}
        base = parse_scenario(raw, where=f"{SCENARIO} with router {args.router}")
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
        "router": base.cluster.router,
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
    if args.against:
        cmp = _against(args.against, args.hours, args.rounds)
        out.update(cmp)
        print(
            f"against {cmp['against']} (best of {cmp['rounds']} alternated fresh processes): "
            f"{cmp['before_cpu_s']:.2f} s CPU ({cmp['before_events_per_cpu_s']:,} events/CPU-s)"
            f" -> {cmp['after_cpu_s']:.2f} s CPU ({cmp['after_events_per_cpu_s']:,} events/CPU-s)"
            f": x{cmp['speedup_cpu']}; identical results: {cmp['results_identical']}"
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
