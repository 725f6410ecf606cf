"""Scenario validation: every malformed input is a ConfigError naming the key."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from core.errors import ConfigError
from planner.simulate.scenario import load_scenario, parse_scenario, resolve_dotted, set_dotted
from planner.simulate.scenarios import bundled_names, scenario_file

BASE: dict[str, Any] = {
    "cluster": {"nodes": 1, "gpus_per_node": 2, "model": "llama-3.1-8b", "gpu": "h100-80gb"},
    "workload": {"kind": "synthetic", "prompt_tokens": 500, "output_tokens": 50, "qps": 2},
    "duration_s": 60,
    "seed": 3,
}


def _with(path: str, value: Any) -> dict[str, Any]:
    return set_dotted(BASE, path, value)


def _without(section: str, key: str) -> dict[str, Any]:
    raw = copy.deepcopy(BASE)
    del raw[section][key]
    return raw


BAD: list[tuple[Any, str]] = [
    (_with("cluster.gpus", 4), "cluster.gpus"),  # unknown key
    (_with("colour", "red"), "colour"),
    (_with("workload.prompt_tokenz", 5), "workload.prompt_tokenz"),
    (_with("cluster.tensor_parallel", 4), "cluster.tensor_parallel"),  # TP > GPUs per node
    (_with("cluster.tensor_parallel", 3), "cluster.tensor_parallel"),  # does not divide
    (_with("cluster.model", "no-such-model"), "cluster.model"),
    (_with("cluster.gpu", "tpu-v5"), "cluster.gpu"),
    (
        set_dotted(_with("cluster.model", "llama-3.1-70b"), "cluster.gpus_per_node", 1),
        "cluster.gpu_memory_utilization",
    ),  # 141 GB of weights on one 80 GB GPU
    (_with("cluster.gpu_memory_utilization", 1.5), "cluster.gpu_memory_utilization"),
    (_with("cluster.gpu_memory_utilization", 0), "cluster.gpu_memory_utilization"),
    (_with("cluster.offload", "ssd"), "cluster.offload"),
    (_with("cluster.router", "random"), "cluster.router"),
    (_with("cluster.resume_after_load", "front"), "cluster.resume_after_load"),
    (_with("cluster.lmcache_scope", "rack"), "cluster.lmcache_scope"),
    (_with("cluster.engines_offload", ["native"]), "cluster.engines_offload"),
    (_with("cluster.engines_offload", ["native", "disk"]), "cluster.engines_offload[1]"),
    (_with("cluster.max_num_seqs", 0), "cluster.max_num_seqs"),
    (_with("cluster.max_num_batched_tokens", 16), "cluster.max_num_batched_tokens"),
    (_with("cluster.max_model_len", 131073), "cluster.max_model_len"),  # > Llama-3.1 context
    (_with("cluster.max_model_len", 0), "cluster.max_model_len"),
    (_with("cluster.block_size", "16"), "cluster.block_size"),
    (_with("cluster.nodes", 1.5), "cluster.nodes"),
    (_with("cluster.mfu", True), "cluster.mfu"),
    (_with("cluster.lmcache", {"chunk_size": 0}), "cluster.lmcache.chunk_size"),
    (_with("cluster.lmcache", {"l2": {"latency_ms": 1}}), "cluster.lmcache.l2.bandwidth_gbps"),
    (_with("cluster.lmcache", {"l2": {"tier": "floppy"}}), "cluster.lmcache.l2.tier"),
    (_with("cluster.native", {"step_overhead": 2}), "cluster.native.step_overhead"),
    (set_dotted(_with("cluster.offload", "native"), "cluster.cpu_cache_gb", 0), "cpu_cache_gb"),
    (_with("duration_s", 0), "duration_s"),
    (_with("warmup_s", 100), "warmup_s"),
    (_with("seed", -1), "seed"),
    (_with("workload.kind", "chat"), "workload.kind"),
    (_with("workload.concurrency", 4), "workload.concurrency"),  # both qps and concurrency
    (_without("workload", "qps"), "workload.concurrency"),  # neither
    (_with("workload.qps", -1), "workload.qps"),
    (_with("workload.prompt_tokens", 0), "workload.prompt_tokens"),
    (_with("workload.prompt_tokens", {"dist": "zipf"}), "workload.prompt_tokens.dist"),
    (_with("workload.prompt_tokens", {"dist": "uniform", "min": 5}), "prompt_tokens.max"),
    (
        _with("workload.prompt_tokens", {"dist": "uniform", "min": 50, "max": 5}),
        "prompt_tokens.max",
    ),
    (_with("workload.prompt_tokens", {"dist": "normal", "mean": 100}), "prompt_tokens.std"),
    (_with("workload.arrival", "weekly"), "workload.arrival"),
    (_with("workload.diurnal_amplitude", 2), "workload.diurnal_amplitude"),
    (
        set_dotted(
            set_dotted(_with("workload.kind", "shared_prefix"), "workload.groups", 0),
            "workload.system_prompt_tokens",
            100,
        ),
        "workload.groups",
    ),
    (_with("workload.kind", "shared_prefix"), "workload.system_prompt_tokens"),
    (
        set_dotted(_with("workload.kind", "rag"), "workload.docs_per_request", 5000),
        "workload.docs_per_request",
    ),
    ({"cluster": [1, 2]}, "cluster"),
    ([1, 2, 3], "top level"),
]


@pytest.mark.parametrize(("raw", "key"), BAD, ids=[k for _, k in BAD])
def test_parse_scenario_bad_value_names_key(raw: Any, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_scenario(raw, where="s.yaml")
    assert key in str(err.value)
    assert str(err.value).startswith("s.yaml")


def test_parse_scenario_defaults_recorded_with_sources() -> None:
    sc = parse_scenario(BASE)
    params = {p.key: p for p in sc.params}
    assert params["cluster.nodes"].source == "scenario"
    assert params["cluster.max_num_seqs"].value == 1024  # vLLM's OpenAI server on an H100
    assert "vLLM" in params["cluster.max_num_seqs"].source
    assert "[source: vllm-engine-config]" in params["cluster.max_num_seqs"].source
    assert params["cluster.max_num_batched_tokens"].value == 8192
    assert params["cluster.block_size"].value == 16
    assert params["cluster.router"].value == "round_robin"
    assert params["cluster.resume_after_load"].value == "append"
    assert "vLLM" in params["cluster.resume_after_load"].source
    assert params["cluster.lmcache.chunk_size"].value == 256
    for p in sc.params:
        assert p.source, p.key
    assert sc.cluster.num_engines == 2
    assert sc.cluster.engines_offload == ("none", "none")


def test_parse_scenario_kv_capacity_follows_memory_utilization() -> None:
    low = parse_scenario(_with("cluster.gpu_memory_utilization", 0.5)).cluster.num_gpu_blocks
    high = parse_scenario(_with("cluster.gpu_memory_utilization", 0.9)).cluster.num_gpu_blocks
    assert 0 < low < high
    fixed = parse_scenario(_with("cluster.num_gpu_blocks", 1234)).cluster.num_gpu_blocks
    assert fixed == 1234


def test_parse_scenario_tp_divides_kv_bytes_per_gpu() -> None:
    tp1 = parse_scenario(_with("cluster.tensor_parallel", 1)).cluster
    tp2 = parse_scenario(_with("cluster.tensor_parallel", 2)).cluster
    assert tp1.kv_bytes_per_token_gpu == 131_072  # [source: hf-llama-3.1-8b-config]
    assert tp2.kv_bytes_per_token_gpu == 65_536
    assert tp2.kv_bytes_per_token_engine == 131_072
    assert tp2.num_engines == 1


def test_parse_scenario_engines_offload_overrides_per_engine() -> None:
    sc = parse_scenario(_with("cluster.engines_offload", ["native", "none"]))
    assert sc.cluster.engines_offload == ("native", "none")
    assert sc.cluster.cpu_cache_bytes > 0


def test_load_scenario_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_scenario(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster: [unclosed\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_scenario(bad)


def test_bundled_scenarios_all_parse() -> None:
    names = bundled_names()
    assert "demo" in names and "shared_prefix" in names
    for name in names:
        with scenario_file(name) as path:
            load_scenario(path)


def test_set_dotted_bare_key_goes_to_cluster_or_workload() -> None:
    assert resolve_dotted("gpu_memory_utilization") == "cluster.gpu_memory_utilization"
    assert resolve_dotted("qps") == "workload.qps"
    assert resolve_dotted("lmcache.chunk_size") == "cluster.lmcache.chunk_size"
    raw = set_dotted(BASE, "cluster.lmcache.l2.size_gb", 10)
    assert raw["cluster"]["lmcache"]["l2"]["size_gb"] == 10
    assert "lmcache" not in BASE["cluster"]  # the original is untouched


# vLLM's OpenAI server (EngineArgs._set_default_args, 0.10.1.1): >= 70 GiB and not an A100
# gets 1024 sequences and 8192 batched tokens, everything else 256 and 2048
BATCH_DEFAULTS = [
    ("h100-80gb", 1024, 8192),
    ("h200-141gb", 1024, 8192),
    ("a100-80gb", 256, 2048),  # 80 GiB, but vLLM excludes A100s by name
    ("l40s", 256, 2048),  # 48 GiB
]


@pytest.mark.parametrize(
    ("gpu", "seqs", "budget"), BATCH_DEFAULTS, ids=[g for g, *_ in BATCH_DEFAULTS]
)
def test_parse_scenario_batch_defaults_follow_vllm_for_the_gpu(
    gpu: str, seqs: int, budget: int
) -> None:
    sc = parse_scenario(_with("cluster.gpu", gpu))
    assert (sc.cluster.max_num_seqs, sc.cluster.max_num_batched_tokens) == (seqs, budget)
    # given flags win over the defaults, as on vLLM's command line
    given = set_dotted(_with("cluster.gpu", gpu), "cluster.max_num_seqs", 64)
    given = set_dotted(given, "cluster.max_num_batched_tokens", 4096)
    sc = parse_scenario(given)
    assert (sc.cluster.max_num_seqs, sc.cluster.max_num_batched_tokens) == (64, 4096)
    params = {p.key: p for p in sc.params}
    assert params["cluster.max_num_seqs"].source == "scenario"


def test_parse_scenario_small_gpu_default_budget_below_given_seqs_is_refused() -> None:
    # on an L40S the default budget is 2048: asking for more sequences than that is what
    # vLLM refuses (max_num_batched_tokens < max_num_seqs), named by the key
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        parse_scenario(set_dotted(_with("cluster.gpu", "l40s"), "cluster.max_num_seqs", 4096))
