"""Pinned numbers: short runs of bundled scenarios give the figures the simulator gave before
looping and bounded-memory serving were added, both as a batch summary and as the live
counters a served (pruned, per-request-free) simulation exposes.

The values were computed by the implementation at commit 46d37dd (before the loop mode), with
the bundled scenarios shortened to DURATIONS: a batch ``Simulation(sc).run()``, and for the
served figures a ``Simulation(sc)`` advanced in 7.5 s slices with settle=True, every engine
snapshotted once at the end. A change here is a change of simulated behaviour.

Changed since: rag_bursty and shared_prefix (both LMCache) after an LMCache lookup became an
access (its chunks most recently used, as LMCache 0.3.x's pinned lookup makes them) and a
store began at LMCache's own hit instead of the GPU's (planner/simulate/lmcache.py): which
chunks L1 and L2 keep changed, so a few loads came from the other tier or missed (rag_bursty:
the same hits, a few timings; shared_prefix: external hit rate 0.126217 -> 0.125321).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from planner.simulate import cluster
from planner.simulate.cluster import Simulation
from planner.simulate.metrics_server import LiveCluster
from planner.simulate.scenario import Scenario, load_scenario
from planner.simulate.scenarios import scenario_file

DURATIONS = {"demo": 300.0, "multi_turn": 120.0, "rag_bursty": 120.0, "trace_replay": 600.0,
             "shared_prefix": 120.0}  # fmt: skip

BATCH: dict[str, dict[str, Any]] = {
    "demo": {"completed_requests": 2594, "preemptions": 0, "reprefill_tokens": 6489371,
             "avoided_reprefill_tokens": 4297792, "ttft_mean_s": 0.119599, "e2e_p90_s": 5.77869,
             "prefix_hit_rate": 0.34293, "external_hit_rate": 0.481378,
             "kv_usage_mean": 0.37092, "events": 13171},
    "multi_turn": {"completed_requests": 2793, "preemptions": 10, "reprefill_tokens": 23825,
                   "avoided_reprefill_tokens": 4021184, "ttft_mean_s": 0.32741,
                   "e2e_p90_s": 11.899758, "prefix_hit_rate": 0.545317,
                   "external_hit_rate": 0.346621, "kv_usage_mean": 0.434435, "events": 11841},
    "rag_bursty": {"completed_requests": 2285, "preemptions": 0, "reprefill_tokens": 221076,
                   "avoided_reprefill_tokens": 1683248, "ttft_mean_s": 0.142832,
                   "e2e_p90_s": 7.520152, "prefix_hit_rate": 0.244474,
                   "external_hit_rate": 0.13997, "kv_usage_mean": 0.239927, "events": 10634},
    "trace_replay": {"completed_requests": 400, "preemptions": 0, "reprefill_tokens": 10680,
                     "avoided_reprefill_tokens": 0, "ttft_mean_s": 0.092031,
                     "e2e_p90_s": 7.03714, "prefix_hit_rate": 0.243175,
                     "external_hit_rate": 0.0, "kv_usage_mean": 0.051995, "events": 1908},
    "shared_prefix": {"completed_requests": 116, "preemptions": 11, "reprefill_tokens": 2050332,
                      "avoided_reprefill_tokens": 633216, "ttft_mean_s": 7.801061,
                      "e2e_p90_s": 48.440688, "prefix_hit_rate": 0.10408,
                      "external_hit_rate": 0.125321, "kv_usage_mean": 0.856917, "events": 825},
}  # fmt: skip

# served: summed over engines (prompt, generation, GPU prefix hits, external hits,
# preemptions), then the TTFT histogram's count and sum
SERVED: dict[str, tuple[tuple[float, ...], int, float]] = {
    "multi_turn": ((11554945.0, 979308.0, 6326720.0, 4026352.0, 8.0), 2972, 929.788688),
    "rag_bursty": ((12015600.0, 696043.0, 2940000.0, 1683248.0, 0.0), 2356, 336.189399),
    "trace_replay": ((1259671.0, 148446.0, 306320.0, 0.0, 0.0), 400, 36.812523),
}
SERVED_COUNTERS = ("prompt_tokens_total", "generation_tokens_total", "prefix_cache_hits_total",
                   "external_prefix_cache_hits_total", "preemptions_total")  # fmt: skip


def _short(name: str) -> Scenario:
    with scenario_file(name) as path:
        return dataclasses.replace(load_scenario(path), duration_s=DURATIONS[name])


@pytest.mark.parametrize("name", sorted(BATCH))
def test_simulation_batch_summary_equals_pinned_figures(name: str) -> None:
    result = Simulation(_short(name)).run()
    assert {k: result[k] for k in BATCH[name]} == BATCH[name]


@pytest.mark.parametrize("name", sorted(SERVED))
def test_served_pruned_simulation_counters_equal_pinned_figures(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster, "PRUNE_MIN_NODES", 128)  # prune often: pruning changes nothing
    sc = _short(name)
    live = LiveCluster(sc, 1.0)
    t = 0.0
    while t < sc.duration_s:
        t += 7.5
        live.sim.advance_to(t, settle=True)
    assert live.sim.prunes >= 2 and live.sim.completed == []
    snaps = live.sim.engine_snapshots()
    counters = tuple(sum(s.counters[k] for s in snaps) for k in SERVED_COUNTERS)
    ttft = [s.histograms["ttft_seconds"] for s in snaps]
    want_counters, want_count, want_sum = SERVED[name]
    assert counters == want_counters
    assert sum(h.count for h in ttft) == want_count
    assert round(sum(h.sum for h in ttft), 6) == want_sum
