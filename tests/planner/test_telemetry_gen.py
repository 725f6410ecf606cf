"""benchmarks.accuracy.telemetry_gen: simulator -> real exposition text -> collector.parse ->
rollup."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.accuracy.telemetry_gen import DEFAULT_EPOCH0, bucket_sums, generate, merge
from core.errors import ConfigError
from planner.frames.residency import combine, residency_histograms
from planner.simulate.cluster import Simulation
from planner.simulate.scenario import Scenario, parse_scenario
from store.store import Store

RAW: dict[str, Any] = {
    "name": "telemetry-gen",
    "cluster": {"nodes": 1, "gpus_per_node": 2, "model": "llama-3.1-8b",
                "gpu_memory_utilization": 0.5, "engines_offload": ["none", "native"],
                "cpu_cache_gb": 20},
    "workload": {"kind": "shared_prefix", "groups": 8, "prompts_per_group": 100, "repeat": True,
                 "system_prompt_tokens": 2000, "question_tokens": 200, "output_tokens": 100,
                 "qps": 4.0},
    "duration_s": 300,
    "seed": 7,
}  # fmt: skip


def _scenario(**top: Any) -> Scenario:
    return parse_scenario({**RAW, **top})


def test_generate_same_scenario_and_seed_gives_identical_windows() -> None:
    a = generate(_scenario())
    b = generate(_scenario())
    assert a.windows == b.windows
    assert len(a.windows) > 0
    assert generate(_scenario(seed=8)).windows != a.windows


def test_generate_counter_deltas_add_up_to_the_simulator_counters() -> None:
    tel = generate(_scenario())
    sim = Simulation(_scenario())
    # windows before 240 s hold every increase up to their last scrape, at 225 s (the step
    # from 225 s to 240 s belongs to the next window, as in PromQL increase())
    sim.advance_to(225.0, settle=True)
    for source, meta in tel.engines.items():
        for signal in ("prompt_tokens_total", "generation_tokens_total", "preemptions_total"):
            delta = sum(
                w.delta or 0.0
                for w in tel.windows
                if w.source == source and w.signal == signal and w.start < DEFAULT_EPOCH0 + 240
            )
            assert delta == sim.engines[meta.engine].tel.counters[signal], (source, signal)


def test_generate_frame_carries_each_engines_offload_mode_and_whole_windows() -> None:
    tel = generate(_scenario(warmup_s=60))
    frame = tel.frame()
    modes = dict(zip(frame["source"], frame["offload_mode"], strict=True))
    assert modes == {"engine-0": "none", "engine-1": "native"}
    # windows [60, 120) .. [240, 300): the warm-up and the partial last window are left out
    assert sorted(set(frame["start"] - DEFAULT_EPOCH0)) == [60.0, 120.0, 180.0, 240.0]
    assert frame["kv_util"].between(0.0, 1.0).all()
    assert (frame["tokens_per_s"] > 0).all()
    assert (frame["window_s"] == 60.0).all()
    assert tel.scrapes == 21 and tel.skipped == {}


def test_generate_pools_are_scraped_as_their_own_sources() -> None:
    raw = {**RAW, "cluster": {**RAW["cluster"], "engines_offload": ["lmcache", "lmcache"]}}
    tel = generate(parse_scenario(raw), pools=True)
    assert tel.pools == ("lmcache-0",)
    signals = {w.signal for w in tel.windows if w.source == "lmcache-0"}
    assert "lmcache_requested_tokens_total" in signals


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scrape_s": 0.0}, "scrape_s must be a positive"),
        ({"window_s": float("nan")}, "window_s must be a positive"),
        ({"scrape_s": 90.0}, "must be <= window_s"),
        ({"epoch0": 1_700_000_001.0}, "multiple of window_s"),
    ],
)
def test_generate_bad_arguments_are_config_errors(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        generate(_scenario(), **kwargs)  # type: ignore[arg-type]


def test_merge_keeps_every_source_and_refuses_duplicates() -> None:
    short = _scenario(duration_s=120)
    a, b = generate(short, prefix="a-"), generate(short, prefix="b-")
    both = merge([a, b], "ab")
    assert set(both.engines) == {"a-engine-0", "a-engine-1", "b-engine-0", "b-engine-1"}
    assert len(both.windows) == len(a.windows) + len(b.windows)
    with pytest.raises(ConfigError, match="appears twice"):
        merge([a, a])
    with pytest.raises(ConfigError, match="different window_s"):
        merge([a, generate(short, prefix="c-", window_s=30.0)])
    with pytest.raises(ConfigError, match="at least one"):
        merge([])


def test_bucket_sums_combine_to_what_the_store_sums(tmp_path: Any) -> None:
    """The residency histograms of generated windows, summed without a store, equal the ones
    the plan reads back from a store holding the same windows."""
    raw = {**RAW, "engine": {"kv_cache_metrics": True, "kv_cache_metrics_sample": 1.0},
           "cluster": {**RAW["cluster"], "gpu_memory_utilization": 0.3}}  # fmt: skip
    tel = generate(parse_scenario(raw))
    got = combine(bucket_sums(tel.windows))
    assert set(got) == {"engine-0/0", "engine-1/0"}
    assert got["engine-0/0"]["kv_block_lifetime_seconds"].total() > 0
    with Store(f"sqlite:///{tmp_path}/t.db") as store:
        store.migrate()
        store.write_windows(tel.windows)
        assert residency_histograms(store) == got
