"""The Fleet KV overview: is KV pressure costing this fleet, and where does prompt KV come from.

Every panel reads a recording rule's expression (dashboards.recording_rules) with Grafana's
``$__rate_interval`` and the model / instance / engine variables, so what the panel draws is
what the rule records and the alerts test.
"""

from __future__ import annotations

from dashboards.config import MixinConfig
from dashboards.grafana import Board, Chart, Row
from dashboards.recording_rules import Record, find
from dashboards.variables import VLLM_VARIABLES, query

__all__ = ["UID", "fleet_board"]

UID = "kvscope-fleet-kv"
_ENGINE = "{{instance}} engine {{engine}}"
_MODEL = "{{model_name}}"


def _fleet(metric: str, op: str, quantile: str = "") -> Record:
    return find(metric, op, "fleet", quantile)


def fleet_board(cfg: MixinConfig) -> Board:
    e, f = find, _fleet
    pressure = Row("KV pressure", (
        Chart("Preemptions per second", "Requests the scheduler preempted for KV blocks, per "
              "engine (rate of the preemption counter). Each one is re-prefilled later.",
              "reqps", (query(e("vllm_preemptions", "rate"), cfg, _ENGINE),)),
        Chart("Preemptions per finished request", "Preemptions ÷ finished requests per "
              "engine; the KvscopeVllmPreemptionStorm alert fires above "
              f"{cfg.preemptions_per_request:.0%} under traffic.", "percentunit",
              (query(e("vllm_preemptions_per_request", "ratio_rate"), cfg, _ENGINE),), min=0),
        Chart("KV-cache use", "GPU KV-cache use per model: mean and the fullest engine. "
              "80–90 % is normal for vLLM (it pre-allocates the pool); only use with waiting "
              "requests is pressure.", "percentunit",
              (query(f("vllm_kv_cache_usage_ratio", "avg"), cfg, f"{_MODEL} mean"),
               query(f("vllm_kv_cache_usage_ratio", "max"), cfg, f"{_MODEL} max")),
              min=0, max=1),
        Chart("Requests running and waiting", "Requests in the running batch and in the "
              "waiting queue, summed per model.", "short",
              (query(f("vllm_requests_running", "sum"), cfg, f"{_MODEL} running"),
               query(f("vllm_requests_waiting", "sum"), cfg, f"{_MODEL} waiting"))),
    ))  # fmt: skip
    reuse = Row("Prefix reuse (share of looked-up prompt tokens)", (
        Chart("Prompt KV by source", "One definition of a hit for every tier: the share of "
              "the prompt tokens looked up that a tier supplied, from token counters' rates. "
              "HBM = vLLM's prefix cache; connector = the KV connector (native CPU tier or "
              "LMCache), as vLLM counts it; LMCache = LMCache's own lookups.", "percentunit",
              (query(f("vllm_prefix_cache_hit", "ratio_rate"), cfg, f"{_MODEL} HBM"),
               query(f("vllm_external_prefix_cache_hit", "ratio_rate"), cfg,
                     f"{_MODEL} connector"),
               query(f("lmcache_hit_tokens", "ratio_rate"), cfg, f"{_MODEL} LMCache")),
              min=0, max=1),
        Chart("Re-prefilled tokens per second", "Prompt tokens computed again after a "
              "preemption. basis=exposed: vLLM 0.16–0.19's own counter; basis=estimate: "
              "preemptions/s × mean prompt length, a lower bound (generated tokens are "
              "recomputed too).", "short",
              (query(f("vllm_reprefill_tokens", "rate"), cfg, f"{_MODEL} ({{{{basis}}}})"),)),
    ))  # fmt: skip
    latency = Row("Latency", (
        Chart("Time to first token", "p50 and p99 per model from the TTFT histogram "
              "(sum by le of bucket rates).", "s",
              (query(f("vllm_time_to_first_token_seconds", "histogram_quantile_rate", "0.5"),
                     cfg, f"{_MODEL} p50"),
               query(f("vllm_time_to_first_token_seconds", "histogram_quantile_rate", "0.99"),
                     cfg, f"{_MODEL} p99")), width=8),
        Chart("End-to-end latency", "p50 and p99 per model.", "s",
              (query(f("vllm_e2e_request_latency_seconds", "histogram_quantile_rate", "0.5"),
                     cfg, f"{_MODEL} p50"),
               query(f("vllm_e2e_request_latency_seconds", "histogram_quantile_rate", "0.99"),
                     cfg, f"{_MODEL} p99")), width=8),
        Chart("Queue time p99", "Time requests spent waiting before running, p99 per model: "
              "the latency KV pressure adds.", "s",
              (query(f("vllm_request_queue_time_seconds", "histogram_quantile_rate", "0.99"),
                     cfg, f"{_MODEL} p99"),), width=8),
    ))  # fmt: skip
    throughput = Row("Throughput", (
        Chart("Prompt tokens per second", "Prompt tokens processed (computed + cached) per "
              "model.", "short", (query(f("vllm_prompt_tokens", "rate"), cfg, _MODEL),)),
        Chart("Generation tokens per second", "Tokens generated per model.", "short",
              (query(f("vllm_generation_tokens", "rate"), cfg, _MODEL),)),
    ))  # fmt: skip
    return Board(
        UID, "kvscope / Fleet KV overview",
        "KV-cache pressure, prefix reuse, latency and throughput of vLLM engines (every "
        "vLLM 0.11–0.33 metric spelling). Generated by `kvscope dashboards build`; do not "
        "edit.",
        (pressure, reuse, latency, throughput), VLLM_VARIABLES, tuple(cfg.dashboard_tags),
    )  # fmt: skip
