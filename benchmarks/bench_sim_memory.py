"""Benchmark: memory of the served, looping simulation over K and 4K simulated hours.

Run: .venv/bin/python benchmarks/bench_sim_memory.py [--hours K] [--scenario demo]
     [--no-tracemalloc] [--retaining]

Each run is a fresh process that builds the served cluster of the bundled scenario (`demo`
by default: 8 engines, LMCache and native offload, a diurnal shared-prefix load of 8-16
req/s) exactly as `kvscope simulate SCENARIO --serve … --loop` does (serve.LiveCluster,
loop=True) and advances it at maximum speed the way the server's tick does (15 simulated
seconds per slice, settle=True), snapshotting every engine and LMCache pool after each slice
(what a Prometheus scrape reads; it also empties the histogram buffers). The demo's period is
4 simulated hours, so 4K hours cross loop boundaries from K = 1 on.

Prints, for K and for 4K hours: peak RSS (ru_maxrss), RSS at the end, its growth over the
RSS after set-up, the tracemalloc peak, content-tree nodes held and prunings, loops, requests
finished, wall seconds; then the ratios 4K / K (target: about 1, memory bounded). The
baseline is measured in the same run: the K-hour figures. `--retaining` adds the same two
runs with per-request records kept (retain_requests=True: the completed list and an unpruned
content tree, what the served mode kept before), whose memory grows with the hours.
No asserts: these machines are noisy.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SCRAPE_S = 15.0  # simulated seconds per slice: Prometheus' usual scrape interval


def _rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def child(scenario_name: str, hours: float, *, trace: bool, retaining: bool) -> dict[str, Any]:
    """One run in this process: the figures as a dict (printed as one JSON line)."""
    import numpy  # noqa: PLC0415, F401 - measured: the first histogram flush imports it; count it in set-up

    from planner.simulate.cluster import Simulation  # noqa: PLC0415 - measured: the child imports the simulator in its set-up, before its first RSS reading
    from planner.simulate.metrics_server import LiveCluster  # noqa: PLC0415 - measured: the child imports the simulator in its set-up, before its first RSS reading
    from planner.simulate.scenario import load_scenario  # noqa: PLC0415 - measured: the child imports the simulator in its set-up, before its first RSS reading
    from planner.simulate.scenarios import scenario_file  # noqa: PLC0415 - measured: the child imports the simulator in its set-up, before its first RSS reading

    with scenario_file(scenario_name) as path:
        scenario = load_scenario(path)
    live = LiveCluster(scenario, 1.0, loop=True)
    if retaining:  # the served mode before: every request kept, the content tree unpruned
        live.sim = Simulation(scenario, loop=True, retain_requests=True)
    sim = live.sim
    sim.engine_snapshots()
    sim.lmcache_snapshots()
    rss0 = _rss_mb()
    if trace:
        tracemalloc.start(1)
    started = time.perf_counter()
    end = hours * 3600.0
    t = 0.0
    while t < end:
        t = min(end, t + SCRAPE_S)
        with live.lock:
            sim.advance_to(t, settle=True)
            sim.engine_snapshots()
            sim.lmcache_snapshots()
    wall = time.perf_counter() - started
    peak_traced = tracemalloc.get_traced_memory()[1] / 2**20 if trace else float("nan")
    if trace:
        tracemalloc.stop()
    finished = sum(s.finished["stop"] for s in sim.engine_snapshots())
    return {
        "hours": hours,
        "retaining": retaining,
        "rss_start_mb": round(rss0, 1),
        "rss_end_mb": round(_rss_mb(), 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
        "tracemalloc_peak_mb": round(peak_traced, 2),
        "tree_nodes": len(sim.tree),
        "prunes": sim.prunes,
        "loops": sim.loop_index + 1,  # begun
        "finished_requests": finished,
        "completed_kept": len(sim.completed),
        "wall_s": round(wall, 1),
    }


def _run(args: argparse.Namespace, hours: float, retaining: bool) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", str(hours), "--scenario", args.scenario]
    if args.no_tracemalloc:
        cmd.append("--no-tracemalloc")
    if retaining:
        cmd.append("--retaining")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _row(r: dict[str, Any]) -> str:
    growth = r["rss_end_mb"] - r["rss_start_mb"]
    return (
        f"{r['hours']:>6g} h  peak RSS {r['peak_rss_mb']:7.1f} MB  end {r['rss_end_mb']:7.1f} MB "
        f"(+{growth:6.1f} after set-up)  tracemalloc peak {r['tracemalloc_peak_mb']:7.2f} MB  "
        f"tree {r['tree_nodes']:>7,} nodes ({r['prunes']} prunes)  loop {r['loops']}  "
        f"{r['finished_requests']:>9,} requests  {r['wall_s']:.0f} s"
    )


def _ratios(small: dict[str, Any], big: dict[str, Any]) -> str:
    def ratio(key: str) -> float:
        return float(big[key]) / float(small[key]) if small[key] else float("nan")

    growth_s = small["rss_end_mb"] - small["rss_start_mb"]
    growth_b = big["rss_end_mb"] - big["rss_start_mb"]
    return (
        f"  ratio {big['hours']:g} h / {small['hours']:g} h: peak RSS {ratio('peak_rss_mb'):.2f}x, "
        f"tracemalloc peak {ratio('tracemalloc_peak_mb'):.2f}x, RSS growth "
        f"{growth_b / growth_s if growth_s > 0 else float('nan'):.2f}x "
        f"(requests {ratio('finished_requests'):.2f}x)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=1.0, help="K simulated hours (default 1)")
    ap.add_argument("--scenario", default="demo", help="bundled scenario (default demo)")
    ap.add_argument("--no-tracemalloc", action="store_true", help="RSS only (faster)")
    ap.add_argument(
        "--retaining",
        action="store_true",
        help="also the runs that keep per-request records (the old served mode)",
    )
    ap.add_argument("--child", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        out = child(args.scenario, args.child, trace=not args.no_tracemalloc,
                    retaining=args.retaining)  # fmt: skip
        print(json.dumps(out))
        return
    print(f"bench_sim_memory: {args.scenario}, served + looping, {SCRAPE_S:g} s slices, "
          f"max speed; K = {args.hours:g} h", flush=True)  # fmt: skip
    modes = [False, True] if args.retaining else [False]
    for retaining in modes:
        label = "retaining per-request records (before)" if retaining else "bounded (served mode)"
        print(label, flush=True)
        small = _run(args, args.hours, retaining)
        print(_row(small), flush=True)
        big = _run(args, 4 * args.hours, retaining)
        print(_row(big), flush=True)
        print(_ratios(small, big), flush=True)


if __name__ == "__main__":
    main()
