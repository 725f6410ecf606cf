"""Offload and LMCache tiers: vLLM's native CPU offload and LMCache's L1/L2 in one view.

Hits use the Fleet board's one definition (share of looked-up prompt tokens a tier
supplied). CPU-tier capacity is not a vLLM metric (vllm PR #53902 is open), so it is read
from the engines' configuration facts (``cache_config_info`` / ``kv_offload_config_info``
labels) in a table.
"""

from __future__ import annotations

from core import catalog
from dashboards.config import MixinConfig
from dashboards.grafana import Board, Chart, Query, Row
from dashboards.recording_rules import find
from dashboards.variables import VLLM_VARIABLES, board_scope, lmcache_variables, query

__all__ = ["UID", "tiers_board"]

UID = "kvscope-offload-tiers"
_ENGINE_DIR = "{{instance}} {{direction}}"
_SERVER = "{{instance}}"
_MODEL = "{{model_name}}"


def _facts() -> Query:
    """The engines' configuration facts (value 1, facts in labels), one table row each;
    filtered by instance only (cache_config_info has no model_name label)."""
    by_instance = 'instance=~"$instance"'
    facts = " or ".join(catalog.fact_selector(k, by_instance)
                        for k in ("cache_config", "kv_offload_config"))  # fmt: skip
    return Query(facts, "", instant=True)


def tiers_board(cfg: MixinConfig) -> Board:
    s = board_scope(cfg)
    e = find
    hits = Row("One hit definition across tiers (share of looked-up prompt tokens)", (
        Chart("Prompt KV by tier", "Share of looked-up prompt tokens each tier supplied: "
              "HBM prefix cache, the KV connector (native CPU tier or LMCache, as vLLM counts "
              "it), and LMCache's L1 (CPU DRAM) and L2 as LMCache counts them.", "percentunit",
              (query(e("vllm_prefix_cache_hit", "ratio_rate", "fleet"), cfg, f"{_MODEL} HBM"),
               query(e("vllm_external_prefix_cache_hit", "ratio_rate", "fleet"), cfg,
                     f"{_MODEL} connector"),
               query(e("lmcache_hit_l1_tokens", "ratio_rate", "fleet"), cfg,
                     f"{_MODEL} LMCache L1"),
               query(e("lmcache_hit_l2_tokens", "ratio_rate", "fleet"), cfg,
                     f"{_MODEL} LMCache L2")), width=24, min=0, max=1),
    ))  # fmt: skip
    native = Row("vLLM native CPU offload", (
        Chart("Offload traffic", "Bytes/s moved by the OffloadingConnector per engine: "
              "store = GPU→CPU, load = CPU→GPU (every vLLM spelling, transfer_type mapped).",
              "Bps", (query(e("vllm_offload_bytes", "rate"), cfg, _ENGINE_DIR),)),
        Chart("Effective bandwidth per transfer", "Bytes ÷ seconds spent transferring: the "
              "PCIe rate a transfer achieves while it runs (a load pays off when it beats the "
              "prefill it replaces).", "Bps",
              (query(e("vllm_offload_transfer_bandwidth", "ratio_rate"), cfg, _ENGINE_DIR),)),
        Chart("CPU-tier space pinned by transfers", "vLLM's kv_offload CPU usage: the share "
              "of CPU KV space held by in-flight transfers (vLLM exports no occupancy of the "
              "whole tier).", "percentunit",
              (query(e("vllm_offload_cpu_usage_ratio", ""), cfg, "{{instance}}"),),
              min=0, max=1),
        Chart("Offload allocation failures", "Offload stores that found no free CPU block, "
              "per second: the CPU tier is full of blocks in flight.", "short",
              (query(e("vllm_offload_allocation_failures", "rate"), cfg, "{{instance}}"),)),
        Chart("Engine KV configuration", "HBM blocks, CPU blocks and offload size per engine "
              "from cache_config_info / kv_offload_config_info labels (the capacity facts "
              "kvscope plans with).", "none", (_facts(),), kind="table", width=24),
    ))  # fmt: skip
    lmcache = Row("LMCache", (
        Chart("LMCache servers up", "1 when Prometheus scraped the server, 0 when it failed "
              "(KvscopeLmcacheDown pages after 2 minutes).", "none",
              (Query(f"up{{{s.lmcache}}}", _SERVER),), kind="state-timeline",
              mappings=(("1", "up"), ("0", "down"))),
        Chart("L1 (CPU DRAM) use", "L1 used / total per server.", "percentunit",
              (query(e("lmcache_l1_usage_ratio", "", "instance"), cfg, _SERVER),), min=0, max=1),
        Chart("Tier bytes in use", "L1 and L2 bytes in use per server.", "bytes",
              (query(e("lmcache_l1_usage_bytes", "", "instance"), cfg, f"{_SERVER} L1"),
               query(e("lmcache_l2_usage_bytes", "", "instance"), cfg, f"{_SERVER} L2"))),
        Chart("Tokens looked up", "Tokens engines asked LMCache for, per model.", "short",
              (query(e("lmcache_requested_tokens", "rate", "fleet"), cfg, _MODEL),)),
        Chart("L1 chunk traffic", "Chunks written to, read from and evicted from L1 per "
              "second; writes without reads are the 'stores without loads' symptom.", "short",
              (query(e("lmcache_l1_write_chunks", "rate", "instance"), cfg, f"{_SERVER} write"),
               query(e("lmcache_l1_read_chunks", "rate", "instance"), cfg, f"{_SERVER} read"),
               query(e("lmcache_l1_evicted_chunks", "rate", "instance"), cfg,
                     f"{_SERVER} evict"))),
        Chart("L2 chunk traffic", "Chunks stored to and loaded from L2 per second.", "short",
              (query(e("lmcache_l2_store_chunks", "rate", "instance"), cfg, f"{_SERVER} store"),
               query(e("lmcache_l2_load_chunks", "rate", "instance"), cfg, f"{_SERVER} load"))),
        Chart("L2 load throughput", "Mean GB/s of each L2→L1 load task (LMCache MP server): "
              "the speed an L2 hit is read back at.", "short",
              (query(e("lmcache_l2_load_throughput_gbps", "mean_rate", "instance"), cfg,
                     f"{_SERVER} GB/s"),)),
        Chart("Retrieve and store time p99", "In-process (legacy) LMCache: p99 time to "
              "retrieve and to store KV.", "s",
              (query(e("lmcache_time_to_retrieve_seconds", "histogram_quantile_rate",
                       "instance"), cfg, f"{_SERVER} retrieve"),
               query(e("lmcache_time_to_store_seconds", "histogram_quantile_rate",
                       "instance"), cfg, f"{_SERVER} store"))),
    ))  # fmt: skip
    return Board(
        UID, "kvscope / Offload and LMCache tiers",
        "vLLM native CPU offload and LMCache L1/L2 in one view, with one definition of a hit. "
        "Generated by `kvscope dashboards build`; do not edit.",
        (hits, native, lmcache), (*VLLM_VARIABLES, *lmcache_variables(cfg)),
        tuple(cfg.dashboard_tags),
    )  # fmt: skip
