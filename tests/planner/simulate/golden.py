"""Golden runs of the simulator: short runs of bundled scenarios recorded in full, so a change
made for speed can be checked to change no result (tests/planner/simulate/test_golden.py).

Each run gives the summary `kvscope simulate --json` prints (SimResult.to_dict() without
wall_s and the parameters' sources; its totals in full, its engine, pool and parameter rows
digested) plus the exact
state behind it as SHA-256 digests of its canonical JSON, so the fixture stays small: per
engine every run statistic, counter, histogram (bucket counts, sum, count), block-pool total
and queue length; the completed-request records; the LMCache pools. JSON writes a float as
its repr, so equal digests and equal summaries after a round trip mean bit-for-bit equal
results. `golden(digests=False)` gives the records in full, to find what differs.

tests/planner/simulate/fixtures/golden_sim.json holds what the implementation at commit
9999810 (before the simulator was optimised for issue 13) gave: this file run with `--write`
from a `git archive 9999810` tree, so its planner/ was the one imported. Rewriting it
(`python tests/planner/simulate/golden.py --write`) is a change of simulated behaviour,
never a way to make the test pass.

Rewritten since (from the tree of the change, `--write`), with the reason:
- issue 14, LMCache as 0.3.x keeps its pool (planner/simulate/lmcache.py): a lookup makes the
  chunks it finds most recently used, and a store starts at LMCache's own hit. Runs with
  LMCache changed: mixed_async_in_place, rag_bursty and shared_prefix (which chunks L1/L2
  keep, hence hits, loads and timings); every run's `parameters` digest changed (four new
  `cluster.lmcache` keys, all off by default: save_decode_cache, save_unfull_chunk,
  sync_store, and l2_promote on). The other runs' results are unchanged.
- issue 14, vLLM's batch defaults by GPU (planner/simulate/scenario.py `vllm_batch_defaults`:
  max_num_seqs 1024 on H100 and H200, was 256 for every GPU; 2048 batched tokens below
  70 GiB and on A100s): only the `parameters` digests changed; every run is on H100s with
  fewer than 256 requests running, so every result is unchanged.
- KV residency metrics (planner/simulate/residency.py): every run's `parameters` digest
  changed (two new `engine` keys, kv_cache_metrics off by default); the runs with LMCache
  (demo, demo_served, mixed_async_in_place, rag_bursty, shared_prefix) have a new pool
  histogram, lmcache_l1_chunk_reuse_gap_seconds, so their `lmcache_pools` digests changed;
  new run cpu_tier (the new bundled scenario, with --kv-cache-metrics on). Checked before
  rewriting: `golden(digests=False)` of the tree before and after differs in nothing else.
  Rewritten again for cpu_tier alone when the tracker began observing an eviction's sampled
  blocks tail first (as vLLM evicts them; it went by insertion order): one histogram sum of
  engine 1 moved in its last bit (9886.141791556945 -> ...947), nothing else.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
if __name__ == "__main__":  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from planner.simulate import cluster  # noqa: E402
from planner.simulate.cluster import Simulation  # noqa: E402
from planner.simulate.engine import Engine  # noqa: E402
from planner.simulate.scenario import Scenario, load_scenario, parse_scenario  # noqa: E402
from planner.simulate.scenarios import scenario_file  # noqa: E402
from planner.simulate.telemetry import EngineSnapshot  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "golden_sim.json"

# a mixed cluster (LMCache per engine, native offload, none) under bursty Zipf traffic, with
# LMCache loading asynchronously and a resumed request keeping its place: the paths the
# bundled scenarios do not take
MIXED: dict[str, Any] = {
    "cluster": {"nodes": 2, "gpus_per_node": 2, "model": "llama-3.1-8b", "num_gpu_blocks": 1000,
                "engines_offload": ["lmcache", "native", "none", "lmcache"],
                "router": "least_loaded", "cpu_cache_gb": 2, "resume_after_load": "in_place",
                "lmcache": {"async_load": True}},
    "workload": {"kind": "shared_prefix", "groups": 20, "prompts_per_group": 8,
                 "system_prompt_tokens": 3000, "question_tokens": {"dist": "uniform", "min": 50,
                 "max": 500}, "output_tokens": {"dist": "lognormal", "mean": 200, "sigma": 0.8},
                 "qps": 12, "arrival": "bursty", "popularity": "zipf"},
    "duration_s": 300,
    "seed": 11,
}  # fmt: skip

# bundled scenario -> simulated seconds of its batch run
BATCH: dict[str, float] = {
    "saturated_16x_h100": 240.0,  # benchmarks/bench_sim.py's scenario
    "demo": 240.0,  # mixed none / native / LMCache per node, diurnal
    "rag_bursty": 90.0,  # LMCache for the cluster with an L2 tier
    "multi_turn": 150.0,  # native offload, prefix affinity, sessions
    "shared_prefix": 120.0,  # LMCache per node, TP2, preemption under pressure
    "trace_replay": 300.0,
    "cpu_tier": 300.0,  # no offload, vLLM --kv-cache-metrics on (residency histograms)
}
NAIVE_S = 20.0  # saturated_16x_h100 stepped one decode step per event (the bench's baseline)
SERVED_S, SERVED_SLICE = 150.0, 7.5  # demo looping and pruned, advanced in slices, settled
PRUNE_NODES = 256


STATS = ("steps", "kv_integral", "busy_time", "preemptions", "reprefill_tokens", "avoided_tokens",
         "computed_tokens", "rejected", "stall_s", "loads", "load_wait_s",
         "preempted_after_load", "max_req_preemptions")  # fmt: skip


def _bundled(name: str, duration: float) -> Scenario:
    with scenario_file(name) as path:
        sc = load_scenario(path)
    return dataclasses.replace(sc, duration_s=duration)


def _hist(h: Any) -> dict[str, Any]:
    return {"cumulative": list(h.cumulative), "sum": h.sum, "count": h.count}


def _engine_state(e: Engine) -> dict[str, Any]:
    tel, pool, dec = e.tel, e.pool, e.dec
    for h in tel.hist.values():
        h.flush()
    tel.flush()
    return {
        "stats": {k: getattr(e, k) for k in STATS},
        "counters": dict(tel.counters),
        "finished": dict(tel.finished),
        "offload_bytes": dict(tel.offload_bytes),
        "offload_seconds": dict(tel.offload_seconds),
        "histograms": {
            k: {"counts": list(h.counts), "sum": h.total, "count": h.count}
            for k, h in tel.hist.items()
        },
        "pool": [pool.cached_total, pool.pinned_total, pool.private_total, pool.evicted_total],
        "decode": [dec.r, dec.s, dec.d],
        "queues": [len(e.waiting), len(e.loading), len(e.running), len(e.prefilling)],
        "offload_usage": e.conn.usage_ratio(),
    }


def _pools(sim: Simulation) -> list[dict[str, Any]]:
    return [
        {
            "counters": dict(s.counters),
            "gauges": dict(s.gauges),
            "histograms": {k: _hist(h) for k, h in s.histograms.items()},
        }
        for s in sim.lmcache_snapshots()
    ]


def digest(value: object) -> str:
    """SHA-256 of value's canonical JSON (floats by repr)."""
    text = json.dumps(value, sort_keys=True, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def batch_record(sim: Simulation, *, digests: bool = True) -> dict[str, Any]:
    """Everything a finished batch run gives, exactly."""
    summary = sim.run().to_dict()
    summary.pop("wall_s")
    # the parameters used, without their sources (documentation, not results)
    summary["parameters"] = [[p["key"], p["value"]] for p in summary["parameters"]]
    if digests:  # the run's totals stay readable, its per-engine and per-pool rows digested
        for key in ("engines", "lmcache_pools", "parameters"):
            summary[key] = digest(summary[key])
    state: dict[str, Any] = {
        "completed": sim.completed,
        "engines": [_engine_state(e) for e in sim.engines],
        "lmcache_pools": _pools(sim),
    }
    return {
        "summary": summary,
        "events": sim.events,
        "last_event": sim.last_event,
        "nodes_created": sim.tree.created,
        "completed_records": len(sim.completed),
        "completed": digest(state["completed"]) if digests else state["completed"],
        "engines": [digest(e) for e in state["engines"]] if digests else state["engines"],
        "lmcache_pools": digest(state["lmcache_pools"]) if digests else state["lmcache_pools"],
    }


def _snapshot(s: EngineSnapshot) -> dict[str, Any]:
    return {
        "t": s.t,
        "counters": dict(s.counters),
        "finished": dict(s.finished),
        "offload_bytes": dict(s.offload_bytes),
        "offload_seconds": dict(s.offload_seconds),
        "gauges": dict(s.gauges),
        "histograms": {k: _hist(h) for k, h in s.histograms.items()},
    }


def served_record(*, digests: bool = True) -> dict[str, Any]:
    """demo as a server runs it (looping, no per-request records, pruned content tree),
    advanced in slices with settle=True, every engine snapshotted at every fifth slice; the
    tree is pruned every PRUNE_NODES nodes instead of every 16 k, so a short run prunes."""
    saved = cluster.PRUNE_MIN_NODES
    cluster.PRUNE_MIN_NODES = PRUNE_NODES
    try:
        return _served(digests)
    finally:
        cluster.PRUNE_MIN_NODES = saved


def _served(digests: bool) -> dict[str, Any]:
    sim = Simulation(_bundled("demo", 60.0), loop=True, retain_requests=False)
    snaps: list[list[dict[str, Any]]] = []
    t, i = 0.0, 0
    while t < SERVED_S:
        t += SERVED_SLICE
        i += 1
        sim.advance_to(t, settle=True)
        if i % 5 == 0:
            snaps.append([_snapshot(s) for s in sim.engine_snapshots()])
    return {
        "events": sim.events,
        "loops": sim.loop_index,
        "prunes": sim.prunes,
        "nodes_held": len(sim.tree),
        "snapshots": [[digest(e) for e in snap] for snap in snaps] if digests else snaps,
        "lmcache_pools": digest(_pools(sim)) if digests else _pools(sim),
    }


def golden(*, digests: bool = True) -> dict[str, Any]:
    """Every golden run, by name (digests=False: the exact state in full)."""
    out: dict[str, Any] = {}
    for name, duration in BATCH.items():
        out[name] = batch_record(Simulation(_bundled(name, duration)), digests=digests)
    out["mixed_async_in_place"] = batch_record(Simulation(parse_scenario(MIXED)), digests=digests)
    out["saturated_naive"] = batch_record(
        Simulation(_bundled("saturated_16x_h100", NAIVE_S), max_jump=1), digests=digests
    )
    out["demo_served"] = served_record(digests=digests)
    return out


def main() -> None:
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: golden.py --write  (rewrites the fixture: see the docstring)")
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps(golden(), sort_keys=True, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
