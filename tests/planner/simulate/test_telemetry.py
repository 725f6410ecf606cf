"""Telemetry: histogram arithmetic, catalogue bucket bounds, monotone counters over advances."""

from __future__ import annotations

import random
from typing import Any

import pytest

from core import catalog
from core.errors import ConfigError
from planner.simulate.cluster import Simulation
from planner.simulate.scenario import parse_scenario
from planner.simulate.telemetry import (
    ENGINE_HISTOGRAMS,
    TOKEN_HISTOGRAMS,
    Histogram,
    default_buckets,
)

RAW: dict[str, Any] = {
    "cluster": {"nodes": 1, "gpus_per_node": 2, "model": "llama-3.1-8b", "num_gpu_blocks": 900,
                "engines_offload": ["native", "lmcache"], "cpu_cache_gb": 5},
    "workload": {"kind": "shared_prefix", "groups": 10, "prompts_per_group": 30,
                 "system_prompt_tokens": 2000, "question_tokens": 300, "output_tokens": 400,
                 "qps": 3},
    "duration_s": 120,
    "seed": 1,
}  # fmt: skip


@pytest.mark.parametrize(
    ("first", "step", "k"),
    [(0.02, 0.0001, 500), (0.3, 0.0, 7), (5.0, -0.01, 40), (0.009, 0.5, 3), (100.0, 1.0, 2)],
)
def test_histogram_observe_linear_equals_single_observations(
    first: float, step: float, k: int
) -> None:
    bounds = catalog.SIGNALS["inter_token_latency_seconds"].buckets
    bulk, single = Histogram(bounds), Histogram(bounds)
    bulk.observe_linear(first, step, k, weight=3)
    for j in range(k):
        for _ in range(3):
            single.observe(first + step * j)
    assert bulk.cumulative() == single.cumulative()
    assert bulk.count == single.count == 3 * k
    assert bulk.total == pytest.approx(single.total)


def test_histogram_buffered_observations_bucket_like_prometheus() -> None:
    h = Histogram((1.0, 2.0, 5.0))
    rng = random.Random(4)
    values = [rng.choice([0.5, 1.0, 1.5, 2.0, 4.9, 5.0, 9.0]) for _ in range(1000)]
    for v in values:
        h.observe(v)
    expect = [sum(1 for v in values if v <= b) for b in (1.0, 2.0, 5.0)] + [len(values)]
    assert list(h.cumulative()) == expect  # `le` is inclusive
    assert h.total == pytest.approx(sum(values))


def test_default_buckets_come_from_the_catalog() -> None:
    buckets = default_buckets()
    for name in ENGINE_HISTOGRAMS:
        assert buckets[name] == tuple(catalog.SIGNALS[name].buckets)
        assert name in catalog.SIGNALS


def test_default_buckets_render_token_histograms_for_max_model_len() -> None:
    buckets = default_buckets(131072)
    for name in ENGINE_HISTOGRAMS:
        if name in TOKEN_HISTOGRAMS:
            assert buckets[name] == catalog.token_buckets(131072)
            assert buckets[name][-1] == 100_000.0  # vLLM build_1_2_5_buckets(131072)
        else:
            assert buckets[name] == tuple(catalog.SIGNALS[name].buckets)


def test_prompts_above_2000_tokens_land_in_finite_buckets_by_default() -> None:
    """The catalogue's 4096-rendered buckets end at 2000: every longer prompt used to fall
    into +Inf. The scenario's max_model_len (default: the model's context) sets them."""
    raw = {**RAW, "workload": {**RAW["workload"], "system_prompt_tokens": 6000}}
    raw["cluster"] = {**RAW["cluster"], "num_gpu_blocks": 3000}
    sim = Simulation(parse_scenario(raw))
    assert sim.scenario.cluster.max_model_len == 131072  # Llama-3.1 config.json
    sim.advance_to(60, settle=True)
    prompt = sim.engine_snapshots()[0].histograms["request_prompt_tokens"]
    assert prompt.bounds == catalog.token_buckets(131072)
    assert prompt.count > 0
    assert prompt.cumulative[-2] == prompt.count  # nothing in +Inf
    assert prompt.cumulative[prompt.bounds.index(5000.0)] == 0  # all are > 6000 tokens
    assert prompt.cumulative[prompt.bounds.index(10000.0)] == prompt.count


def test_requests_longer_than_max_model_len_are_refused_before_the_engines() -> None:
    raw = {**RAW, "cluster": {**RAW["cluster"], "max_model_len": 2600}}
    # question + system prompt 2300 tokens, outputs 0-600: the long ones exceed 2600
    raw["workload"] = {**RAW["workload"], "output_tokens": {"dist": "uniform", "min": 1,
                                                            "max": 600}}  # fmt: skip
    sim = Simulation(parse_scenario(raw))
    result = sim.run()
    summary = result.summary
    assert sim.too_long > 0
    assert summary["rejected_requests"] == sim.too_long + sum(e.rejected for e in sim.engines)
    assert all(c[3] + c[4] <= 2600 for c in sim.completed)
    snaps = sim.engine_snapshots()
    # the frontend refuses them: no engine counts them as finished (abort or otherwise)
    assert sum(s.finished["abort"] for s in snaps) == sum(e.rejected for e in sim.engines)
    prompt = snaps[0].histograms["request_prompt_tokens"]
    assert prompt.bounds == catalog.token_buckets(2600)
    assert prompt.bounds[-1] == 2000.0


def test_max_model_len_below_the_shortest_request_is_refused() -> None:
    raw = {**RAW, "cluster": {**RAW["cluster"], "max_model_len": 1000}}
    with pytest.raises(ConfigError, match=r"cluster\.max_model_len"):
        Simulation(parse_scenario(raw))


def test_telemetry_counters_never_decrease_across_advances() -> None:
    sim = Simulation(parse_scenario(RAW))
    previous: list[dict[str, float]] = [{} for _ in sim.engines]
    previous_pools: list[dict[str, float]] = [{} for _ in sim.pools]
    for step in range(1, 25):
        sim.advance_to(step * 5.0, settle=True)
        for i, snap in enumerate(sim.engine_snapshots()):
            assert snap.t == step * 5.0
            for key, value in snap.counters.items():
                assert value >= previous[i].get(key, 0.0), key
            previous[i] = dict(snap.counters)
            for name, h in snap.histograms.items():
                assert list(h.cumulative) == sorted(h.cumulative), name
                assert h.cumulative[-1] == h.count
            assert 0.0 <= snap.gauges["kv_cache_usage_ratio"] <= 1.0
            assert snap.gauges["requests_running"] >= 0
        for j, pool in enumerate(sim.lmcache_snapshots()):
            for key, value in pool.counters.items():
                assert value >= previous_pools[j].get(key, 0.0), key
            previous_pools[j] = dict(pool.counters)
            assert 0.0 <= pool.gauges["lmcache_l1_usage_ratio"] <= 1.0
    snaps = sim.engine_snapshots()
    assert snaps[0].offload == "native" and snaps[0].offload_bytes["store"] > 0
    assert snaps[1].counters["external_prefix_cache_hits_total"] > 0
    assert sum(s.finished["stop"] for s in snaps) == len(sim.completed)
    ttft = snaps[0].histograms["ttft_seconds"]
    assert ttft.bounds == tuple(catalog.SIGNALS["ttft_seconds"].buckets)
    assert ttft.count == sum(1 for c in sim.completed if c[5] == 0)


def test_injected_buckets_are_used() -> None:
    bounds = {name: (1.0, 10.0) for name in ENGINE_HISTOGRAMS}
    sim = Simulation(parse_scenario(RAW), buckets=bounds)
    sim.advance_to(30)
    snap = sim.engine_snapshots()[0]
    assert snap.histograms["e2e_latency_seconds"].bounds == (1.0, 10.0)
