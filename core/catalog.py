"""The metric catalogue: the ONLY module where a vendor metric name is spelled.

Every vLLM (0.11 → 0.33), LMCache (legacy ``lmcache:`` and MP ``lmcache_mp_``) and
production-stack router family kvscope reads maps onto one *canonical signal*; facts and
pitfalls in tests/fixtures/metrics/README.md. ``Spelling.family`` / ``SignalDef.exported``
is the name prometheus_client's constructor takes (counters WITHOUT ``_total``, histograms
without ``_bucket``/``_sum``/``_count``); ``export_sample_name()`` gives the written sample
name. Input also accepts the ``vllm:``→``vllm_`` / ``lmcache:``→``lmcache_`` rewrite
(prometheus-client ≥ 0.23 under OpenMetrics) and counters with or without ``_total``;
``_created`` samples are ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from core.errors import ConfigError

# Re-exported (PEP 484 `as` form): the simulator spells labels through the catalogue alone.
from core.records import Labels as Labels  # noqa: PLC0414

SignalKind = Literal["counter", "gauge", "histogram"]
Source = Literal["vllm", "lmcache", "router"]
Part = Literal["bucket", "count", "sum"]

# --- fact families (label sets are facts about an engine, the value is always 1) ---------
CACHE_CONFIG_INFO = (
    "vllm:cache_config_info"  # every CacheConfig field + engine (varies per release)
)
KV_OFFLOAD_CONFIG_INFO = (
    "vllm:kv_offload_config_info"  # vLLM 0.33+, offloading spec fields + engine
)
LMCACHE_TARGET_INFO = "target_info"  # OTel resource of `lmcache server` (service_instance_id, …)
# facts key in Snapshot.facts -> exported family
FACTS: Mapping[str, str] = {
    "cache_config": CACHE_CONFIG_INFO,
    "kv_offload_config": KV_OFFLOAD_CONFIG_INFO,
    "lmcache_target": LMCACHE_TARGET_INFO,
}

# NVIDIA dcgm-exporter's frame-buffer-used gauge: one series per GPU, labelled modelName,
# gpu, UUID, Hostname (and the consumer pod in Kubernetes mode); a default counter of
# dcgm-exporter's etc/default-counters.csv. kvscope reads only its labels (collector.dcgm).
DCGM_GPU_FAMILY = "DCGM_FI_DEV_FB_USED"

LMCACHE_SERVER_PREFIX = "lmcache_mp_"  # the LMCache MP server's families (own /metrics)

# Label that marks a production-stack router sample (the router re-uses the `vllm:` prefix,
# labels its gauges with the backend URL `server` and never carries `engine`).
ROUTER_LABEL = "server"
ENGINE_LABEL = "engine"

_V = ("engine", "model_name")  # every vLLM engine series
_LEG = ("model_name", "role", "served_model_name", "worker_id")  # LMCache legacy series


@dataclass(frozen=True, slots=True)
class Spelling:
    """One way a signal is exposed.

    ``rank`` 0 = current name; a higher rank is an older/deprecated duplicate that is used
    only for series the lower-rank spellings do not expose in the same exposition (so
    e.g. ``vllm:kv_offload_total_bytes{transfer_type}`` never double counts the flat names).
    ``const_labels`` are implied by the family (``direction="load"``); ``rename`` maps a
    source label to the canonical one and ``values`` rewrites the renamed label's values.
    """

    family: str
    labels: tuple[str, ...]
    rank: int = 0
    const_labels: Labels = ()
    rename: tuple[tuple[str, str], ...] = ()
    values: tuple[tuple[str, str], ...] = ()
    note: str = ""


@dataclass(frozen=True, slots=True)
class SignalDef:
    """A canonical signal and every spelling that feeds it.

    ``exported`` is the family of the first spelling (what vLLM 0.33.0 / LMCache 0.5.6
    expose today), ``aliases`` every other family name, ``labels`` the label names of the
    exported spelling plus canonical ones (``direction``), ``buckets`` the finite histogram
    upper bounds the current exporter uses (simulators render them). ``stored``: kvscope
    reads the signal's windows back from the store (the planner, the API), so the collector
    writes them by default (STORED_SIGNALS; ``kvscope collect --keep all`` writes every one).
    """

    name: str
    kind: SignalKind
    unit: str
    help: str
    source: Source
    spellings: tuple[Spelling, ...]
    buckets: tuple[float, ...] = ()
    keep_buckets: bool = False
    stored: bool = False
    exported: str = field(init=False)
    aliases: tuple[str, ...] = field(init=False)
    labels: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        if self.keep_buckets and self.kind != "histogram":
            raise ValueError(f"signal {self.name!r}: keep_buckets is for histograms only")
        first = self.spellings[0]
        names = tuple(dict.fromkeys(s.family for s in self.spellings))
        canon = {dict(first.rename).get(n, n) for n in first.labels}
        canon.update(k for k, _ in first.const_labels)
        object.__setattr__(self, "exported", first.family)
        object.__setattr__(self, "aliases", names[1:])
        object.__setattr__(self, "labels", tuple(sorted(canon)))


# --- bucket families (vLLM 0.33.0 vllm/v1/metrics/buckets.py; LMCache 0.5.6 observability) --
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
ITERATION_TOKENS_BUCKETS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0,
                            4096.0, 8192.0, 16384.0)  # fmt: skip
PREEMPTION_COUNT_BUCKETS = (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)
KV_RESIDENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
                        10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0)  # fmt: skip
OFFLOAD_SIZE_BUCKETS = (1e6, 5e6, 1e7, 2e7, 4e7, 6e7, 8e7, 1e8, 1.5e8, 2e8)
LMCACHE_MP_LOOKUP_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)  # fmt: skip  (prometheus_client defaults)
LMCACHE_SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                           1.0, 2.5, 5.0, 7.5, 10.0)  # fmt: skip
OTEL_DEFAULT_BUCKETS = (
    0.0,
    5.0,
    10.0,
    25.0,
    50.0,
    75.0,
    100.0,
    250.0,
    500.0,
    750.0,
    1000.0,
    2500.0,
    5000.0,
    7500.0,
    10000.0,
)  # fmt: skip  (OTel SDK defaults)
LMCACHE_L1_LIFECYCLE_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0,
                                1800.0, 3600.0, 7200.0, 14400.0)  # fmt: skip
ROUTER_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


def token_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 request-token buckets up to max_model_len (build_1_2_5_buckets).

    The fixtures were rendered with max_model_len 4096 -> 1, 2, 5, …, 2000.
    """
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_model_len:
                return tuple(out)
            out.append(float(value))
        exponent += 1


TOKEN_BUCKETS = token_buckets(4096)


def _sp(family: str, labels: tuple[str, ...] = _V, **kw: object) -> Spelling:
    return Spelling(family, labels, **kw)  # type: ignore[arg-type]


def _load(family: str) -> Spelling:
    return Spelling(family, _V, const_labels=(("direction", "load"),))


def _store(family: str) -> Spelling:
    return Spelling(family, _V, const_labels=(("direction", "store"),))


def _by_transfer_type(family: str) -> Spelling:
    # vLLM 0.16-era names, deprecated duplicates of the flat load/store names since 0.24.
    return Spelling(
        family,
        (*_V, "transfer_type"),
        rank=1,
        rename=(("transfer_type", "direction"),),
        values=(("CPU_to_GPU", "load"), ("GPU_to_CPU", "store")),
        note="deprecated; transfer_type CPU_to_GPU->load, GPU_to_CPU->store",
    )


def _s(
    name: str,
    kind: SignalKind,
    unit: str,
    help_: str,
    *spellings: Spelling,
    source: Source = "vllm",
    buckets: tuple[float, ...] = (),
    keep_buckets: bool = False,
    stored: bool = False,
) -> SignalDef:
    return SignalDef(name, kind, unit, help_, source, spellings, buckets, keep_buckets, stored)


_C: SignalKind = "counter"
_G: SignalKind = "gauge"
_H: SignalKind = "histogram"

# stored=True: a signal kvscope reads back from the store (the plan, the API's signals, the
# residency histograms); tests/collector/test_keep.py checks every reader's list against it.
_TABLE: tuple[SignalDef, ...] = (
    # ---- vLLM engine: scheduler / KV cache -------------------------------------------------
    _s("preemptions_total", _C, "preemptions", "Requests preempted by the engine (KV pressure).",
       _sp("vllm:num_preemptions"), stored=True),
    _s("kv_cache_usage_ratio", _G, "ratio", "GPU KV-cache usage, 0-1 fraction despite 'perc'.",
       _sp("vllm:kv_cache_usage_perc"), _sp("vllm:gpu_cache_usage_perc", rank=1), stored=True),
    _s("prefix_cache_queries_total", _C, "tokens", "Local prefix-cache queries (prompt tokens).",
       _sp("vllm:prefix_cache_queries"), _sp("vllm:gpu_prefix_cache_queries", rank=1), stored=True),
    _s("prefix_cache_hits_total", _C, "tokens", "Local prefix-cache hits (cached tokens).",
       _sp("vllm:prefix_cache_hits"), _sp("vllm:gpu_prefix_cache_hits", rank=1), stored=True),
    _s("external_prefix_cache_queries_total", _C, "tokens",
       "KV-connector (LMCache, offload, NIXL) queries: tokens not found locally (0.12+).",
       _sp("vllm:external_prefix_cache_queries"), stored=True),
    _s("external_prefix_cache_hits_total", _C, "tokens",
       "Tokens the KV connector supplies (0.12+).", _sp("vllm:external_prefix_cache_hits"),
       stored=True),
    _s("prompt_tokens_total", _C, "tokens", "Prompt tokens processed (computed + cached).",
       _sp("vllm:prompt_tokens"), stored=True),
    _s("generation_tokens_total", _C, "tokens", "Generation tokens produced.",
       _sp("vllm:generation_tokens"), stored=True),
    _s("prompt_tokens_cached_total", _C, "tokens", "Cached prompt tokens, local+external (0.16+).",
       _sp("vllm:prompt_tokens_cached")),
    _s("prompt_tokens_by_source_total", _C, "tokens",
       "Prompt tokens by source: local_compute|local_cache_hit|external_kv_transfer (0.16+).",
       _sp("vllm:prompt_tokens_by_source", (*_V, "source"))),
    _s("prompt_tokens_cached_by_source_total", _C, "tokens",
       "Prefix-cache hit tokens by tier: device|host|disk|p2p|external_unspecified (0.32+).",
       _sp("vllm:prompt_tokens_cached_by_source", (*_V, "source"))),
    _s("prompt_tokens_recomputed_total", _C, "tokens", "Prompt tokens recomputed (0.16-0.19).",
       _sp("vllm:prompt_tokens_recomputed"), stored=True),
    _s("request_success_total", _C, "requests", "Finished requests by finished_reason.",
       _sp("vllm:request_success", ("engine", "finished_reason", "model_name")), stored=True),
    _s("admission_rejections_total", _C, "requests",
       "Admissions rejected by a queue limit, by reason (0.32+).",
       _sp("vllm:admission_rejections", ("model_name", "reason"))),
    _s("requests_running", _G, "requests", "Requests in model execution batches.",
       _sp("vllm:num_requests_running"), stored=True),
    _s("requests_waiting", _G, "requests", "Requests waiting (capacity + deferred).",
       _sp("vllm:num_requests_waiting"), stored=True),
    _s("requests_waiting_by_reason", _G, "requests", "Waiting requests by reason (0.20+).",
       _sp("vllm:num_requests_waiting_by_reason", (*_V, "reason"))),
    # ---- vLLM engine: latency and size histograms ------------------------------------------
    _s("ttft_seconds", _H, "seconds", "Time to first token.",
       _sp("vllm:time_to_first_token_seconds"), buckets=TTFT_BUCKETS, stored=True),
    _s("inter_token_latency_seconds", _H, "seconds", "Inter-token latency.",
       _sp("vllm:inter_token_latency_seconds"),
       _sp("vllm:time_per_output_token_seconds", rank=1), buckets=ITL_BUCKETS),
    _s("request_tpot_seconds", _H, "seconds", "Per-request mean time per output token.",
       _sp("vllm:request_time_per_output_token_seconds"), buckets=ITL_BUCKETS),
    _s("e2e_latency_seconds", _H, "seconds", "End-to-end request latency.",
       _sp("vllm:e2e_request_latency_seconds"), buckets=REQUEST_LATENCY_BUCKETS, stored=True),
    _s("queue_time_seconds", _H, "seconds", "Time spent WAITING.",
       _sp("vllm:request_queue_time_seconds"), buckets=REQUEST_LATENCY_BUCKETS),
    _s("inference_time_seconds", _H, "seconds", "Time spent RUNNING.",
       _sp("vllm:request_inference_time_seconds"), buckets=REQUEST_LATENCY_BUCKETS),
    _s("prefill_time_seconds", _H, "seconds", "Time spent in PREFILL.",
       _sp("vllm:request_prefill_time_seconds"), buckets=REQUEST_LATENCY_BUCKETS),
    _s("decode_time_seconds", _H, "seconds", "Time spent in DECODE.",
       _sp("vllm:request_decode_time_seconds"), buckets=REQUEST_LATENCY_BUCKETS),
    _s("request_prompt_tokens", _H, "tokens", "Prompt length per request.",
       _sp("vllm:request_prompt_tokens"), buckets=TOKEN_BUCKETS, stored=True),
    _s("request_generation_tokens", _H, "tokens", "Generation length per request.",
       _sp("vllm:request_generation_tokens"), buckets=TOKEN_BUCKETS),
    _s("request_prefill_kv_computed_tokens", _H, "tokens",
       "New KV tokens computed in prefill, cached excluded (0.13+).",
       _sp("vllm:request_prefill_kv_computed_tokens"), buckets=TOKEN_BUCKETS),
    _s("request_num_preemptions", _H, "preemptions", "Preemptions per finished request (0.30+).",
       _sp("vllm:request_num_preemptions"), buckets=PREEMPTION_COUNT_BUCKETS),
    _s("iteration_tokens", _H, "tokens", "Tokens per engine step ('_total' is part of the name).",
       _sp("vllm:iteration_tokens_total"), buckets=ITERATION_TOKENS_BUCKETS),
    # the KV residency families keep their bucket counts per window (keep_buckets): the
    # planner's hit-ratio-vs-capacity curve reads the reuse-gap distribution, not quantiles
    _s("kv_block_lifetime_seconds", _H, "seconds", "KV block lifetime (--kv-cache-metrics).",
       _sp("vllm:kv_block_lifetime_seconds"), buckets=KV_RESIDENCY_BUCKETS, keep_buckets=True,
       stored=True),
    _s("kv_block_idle_before_evict_seconds", _H, "seconds", "KV block idle time before eviction.",
       _sp("vllm:kv_block_idle_before_evict_seconds"), buckets=KV_RESIDENCY_BUCKETS,
       keep_buckets=True, stored=True),
    _s("kv_block_reuse_gap_seconds", _H, "seconds", "Gap between accesses of a KV block.",
       _sp("vllm:kv_block_reuse_gap_seconds"), buckets=KV_RESIDENCY_BUCKETS, keep_buckets=True,
       stored=True),
    # ---- vLLM native KV offloading (OffloadingConnector, 0.16+/0.24+) -----------------------
    _s("offload_bytes_total", _C, "bytes", "Bytes moved by KV offload; direction load=CPU->GPU.",
       _load("vllm:kv_offload_load_bytes"), _store("vllm:kv_offload_store_bytes"),
       _by_transfer_type("vllm:kv_offload_total_bytes")),
    _s("offload_seconds_total", _C, "seconds", "Time spent in KV offload transfers.",
       _load("vllm:kv_offload_load_time"), _store("vllm:kv_offload_store_time"),
       _by_transfer_type("vllm:kv_offload_total_time")),
    _s("offload_transfer_size_bytes", _H, "bytes", "Size of each KV offload transfer.",
       _load("vllm:kv_offload_load_size"), _store("vllm:kv_offload_store_size"),
       _by_transfer_type("vllm:kv_offload_size"), buckets=OFFLOAD_SIZE_BUCKETS),
    _s("offload_cpu_usage_ratio", _G, "ratio", "CPU KV space pinned by active transfers (0-1).",
       _sp("vllm:kv_offload_cpu_cache_usage_perc"), stored=True),
    _s("offload_cpu_write_usage_ratio", _G, "ratio", "CPU KV space pinned by in-flight stores.",
       _sp("vllm:kv_offload_cpu_cache_write_usage_perc")),
    _s("offload_cpu_read_usage_ratio", _G, "ratio", "CPU KV space pinned by in-flight loads.",
       _sp("vllm:kv_offload_cpu_cache_read_usage_perc")),
    _s("offload_allocation_failures_total", _C, "failures", "Failed KV offload store allocations.",
       _sp("vllm:kv_offload_allocation_failure")),
    _s("offload_stores_skipped_total", _C, "stores", "KV offload stores skipped (0.24+, CPU spec).",
       _sp("vllm:kv_offload_stores_skipped")),
    _s("lmcache_mp_lookup_seconds", _H, "seconds", "LMCache MP lookup latency seen by vLLM.",
       _sp("vllm:lmcache_mp_lookup_duration_seconds"), buckets=LMCACHE_MP_LOOKUP_BUCKETS),
    # ---- LMCache (MP server `lmcache_mp_*` first, legacy in-process `lmcache:*`) ------------
    _s("lmcache_requested_tokens_total", _C, "tokens", "Tokens looked up / requested in LMCache.",
       _sp("lmcache_mp_lookup_requested_tokens", ("cache_salt", "model_name")),
       _sp("lmcache:num_requested_tokens", _LEG), source="lmcache", stored=True),
    _s("lmcache_hit_tokens_total", _C, "tokens", "Tokens found in LMCache (contiguous prefix).",
       _sp("lmcache_mp_lookup_hit_tokens", ("cache_salt", "model_name")),
       _sp("lmcache:num_hit_tokens", _LEG), source="lmcache", stored=True),
    _s("lmcache_hit_l1_tokens_total", _C, "tokens", "Hit tokens served from L1 (MP 0.5.5+).",
       _sp("lmcache_mp_lookup_hit_l1_tokens", ("cache_salt", "model_name")), source="lmcache"),
    _s("lmcache_hit_l2_tokens_total", _C, "tokens", "Hit tokens L2 added beyond L1 (MP 0.5.5+).",
       _sp("lmcache_mp_lookup_hit_l2_tokens", ("cache_salt", "model_name")), source="lmcache"),
    _s("lmcache_lookups_total", _C, "requests", "Completed LMCache lookups.",
       _sp("lmcache_mp_lookups_requests", ("cache_salt", "model_name")),
       _sp("lmcache:num_lookup_requests", _LEG), source="lmcache"),
    _s("lmcache_stored_tokens_total", _C, "tokens", "Tokens stored in LMCache (legacy).",
       _sp("lmcache:num_stored_tokens", _LEG), source="lmcache"),
    _s("lmcache_l1_usage_bytes", _G, "bytes", "L1 (CPU DRAM) bytes in use.",
       _sp("lmcache_mp_l1_memory_usage_bytes", ("backend", "l1_tag")),
       _sp("lmcache:local_cache_usage", _LEG), source="lmcache", stored=True),
    _s("lmcache_l1_usage_ratio", _G, "ratio", "L1 used/total (0-1).",
       _sp("lmcache_mp_l1_usage_ratio", ("backend", "l1_tag")), source="lmcache", stored=True),
    _s("lmcache_l1_read_chunks_total", _C, "chunks", "Chunks read from L1.",
       _sp("lmcache_mp_l1_read_chunks", ("l1_tag",)), source="lmcache"),
    _s("lmcache_l1_write_chunks_total", _C, "chunks", "Chunks written to L1.",
       _sp("lmcache_mp_l1_write_chunks", ("cache_salt", "l1_tag")), source="lmcache"),
    _s("lmcache_l1_evicted_chunks_total", _C, "chunks", "Chunks (legacy: keys) evicted from L1.",
       _sp("lmcache_mp_l1_evicted_chunks", ("l1_tag",)),
       _sp("lmcache:local_cpu_evict_keys_count", _LEG), source="lmcache", stored=True),
    _s("lmcache_l1_allocation_failures_total", _C, "chunks", "L1 allocation failures (OOM).",
       _sp("lmcache_mp_l1_allocation_failure_chunks", ("during", "model_name")), source="lmcache"),
    _s("lmcache_l1_chunk_reuse_gap_seconds", _H, "seconds", "Gap between touches of an L1 chunk.",
       _sp("lmcache_mp_l1_chunk_reuse_gap_seconds", ("l1_tag",)),
       source="lmcache", buckets=LMCACHE_L1_LIFECYCLE_BUCKETS, keep_buckets=True, stored=True),
    _s("lmcache_l2_store_completed_chunks_total", _C, "chunks", "Chunks stored to L2.",
       _sp("lmcache_mp_l2_store_completed_objects_chunks", ()), source="lmcache"),
    _s("lmcache_l2_load_completed_chunks_total", _C, "chunks", "Chunks loaded from L2.",
       _sp("lmcache_mp_l2_prefetch_load_completed_chunks", ()), source="lmcache"),
    _s("lmcache_l2_evicted_chunks_total", _C, "chunks", "Chunks evicted from L2.",
       _sp("lmcache_mp_l2_evicted_objects_chunks", ()), source="lmcache"),
    _s("lmcache_l2_usage_bytes", _G, "bytes", "L2 bytes in use (MP, name per OTel rules).",
       _sp("lmcache_mp_l2_usage_bytes", ("l2_name",)), source="lmcache"),
    _s("lmcache_l2_store_throughput_gbps", _H, "GB/s", "L1->L2 store throughput per task.",
       _sp("lmcache_mp_l2_store_throughput_GB_per_second", ("l2_name",)),
       source="lmcache", buckets=OTEL_DEFAULT_BUCKETS),
    _s("lmcache_l2_load_throughput_gbps", _H, "GB/s", "L2->L1 load throughput per task.",
       _sp("lmcache_mp_l2_load_throughput_GB_per_second", ("l2_name",)),
       source="lmcache", buckets=OTEL_DEFAULT_BUCKETS),
    _s("lmcache_retrieve_seconds", _H, "seconds", "Time to retrieve from LMCache (legacy).",
       _sp("lmcache:time_to_retrieve", _LEG), source="lmcache", buckets=LMCACHE_SECONDS_BUCKETS),
    _s("lmcache_store_seconds", _H, "seconds", "Time to store to LMCache (legacy).",
       _sp("lmcache:time_to_store", _LEG), source="lmcache", buckets=LMCACHE_SECONDS_BUCKETS),
    _s("lmcache_disk_usage_bytes", _G, "bytes", "Local storage (disk) tier bytes (legacy).",
       _sp("lmcache:local_storage_usage", _LEG), source="lmcache"),
    _s("lmcache_remote_usage_bytes", _G, "bytes", "Remote tier bytes (legacy).",
       _sp("lmcache:remote_cache_usage", _LEG), source="lmcache"),
    _s("lmcache_healthy", _G, "bool", "1 healthy, 0 unhealthy (legacy, internal API server only).",
       _sp("lmcache:lmcache_is_healthy", _LEG), source="lmcache", stored=True),
    # ---- production-stack router (re-uses `vllm:`; samples carry `server`, never `engine`) --
    _s("router_requests_running", _G, "requests", "Router-observed running requests per backend.",
       _sp("vllm:num_requests_running", ("server",)), source="router"),
    _s("router_requests_waiting", _G, "requests", "Router-observed waiting requests per backend.",
       _sp("vllm:num_requests_waiting", ("server",)), source="router"),
    _s("router_qps", _G, "requests/s", "Router QPS per backend.",
       _sp("vllm:current_qps", ("server",)), source="router"),
    _s("router_healthy_pods", _G, "pods", "Healthy backends (a gauge named '_total').",
       _sp("vllm:healthy_pods_total", ("server",)), source="router"),
    _s("router_incoming_requests_total", _C, "requests", "Valid requests entering the router.",
       _sp("vllm:num_incoming_requests", ("model",)), source="router"),
    _s("router_request_latency_seconds", _H, "seconds", "E2E latency observed at the router.",
       _sp("vllm:request_latency_seconds", ("model", "server", "status")),
       source="router", buckets=ROUTER_LATENCY_BUCKETS),
)  # fmt: skip

SIGNALS: Mapping[str, SignalDef] = {s.name: s for s in _TABLE}
# The histograms whose windows keep their bucket counts (SignalDef.keep_buckets).
BUCKET_SIGNALS: frozenset[str] = frozenset(s.name for s in _TABLE if s.keep_buckets)

# (ratio_signal, numerator_signal, denominator_signal); the rollup derives these per window.
DERIVED_RATIOS: tuple[tuple[str, str, str], ...] = (
    ("prefix_cache_hit_ratio", "prefix_cache_hits_total", "prefix_cache_queries_total"),
    (
        "external_prefix_cache_hit_ratio",
        "external_prefix_cache_hits_total",
        "external_prefix_cache_queries_total",
    ),
    ("lmcache_hit_ratio", "lmcache_hit_tokens_total", "lmcache_requested_tokens_total"),
)

# What the collector writes by default (kvscope collect --keep used): the stored signals and
# the derived ratios of two stored counters.
STORED_SIGNALS: frozenset[str] = frozenset(
    [s.name for s in _TABLE if s.stored]
    + [r for r, num, den in DERIVED_RATIOS if SIGNALS[num].stored and SIGNALS[den].stored]
)

# Router families that collide with OLD engine names but feed no signal: the router's
# `vllm:gpu_prefix_cache_{hits,queries}_total` are gauges that stay 0 with vLLM ≥ 0.12.
ROUTER_COLLIDING_GAUGES = (
    "vllm:gpu_prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_queries_total",
)


def _rewrite(name: str) -> str:
    """The OpenMetrics "underscores" escaping of prometheus-client ≥ 0.23 (`vllm:x`→`vllm_x`)."""
    return name.replace(":", "_")


def _with_rewrite(names: list[str]) -> tuple[str, ...]:
    out: dict[str, None] = {}
    for n in names:
        out[n] = None
        out[_rewrite(n)] = None
    return tuple(out)


def spelling_sample_name(kind: SignalKind, family: str, part: Part = "bucket") -> str:
    """The sample name an exporter writes for one spelling (histograms: the given part)."""
    if kind == "counter":
        return family + "_total"
    if kind == "histogram":
        return f"{family}_{part}"
    return family


def _get(signal: str) -> SignalDef:
    try:
        return SIGNALS[signal]
    except KeyError:
        raise ConfigError(f"unknown signal {signal!r} (see core.catalog.SIGNALS)") from None


def exposed_names(signal: str, part: Part = "bucket") -> tuple[str, ...]:
    """Every sample name Prometheus may store for ``signal``, current spelling first.

    Counters with ``_total``; histograms with ``_<part>`` (default ``_bucket``); each name
    in its colon and its underscore (OpenMetrics-escaped) spelling.
    """
    sig = _get(signal)
    return _with_rewrite([spelling_sample_name(sig.kind, s.family, part) for s in sig.spellings])


def _router_sample_names() -> frozenset[str]:
    names = list(ROUTER_COLLIDING_GAUGES)
    for sig in _TABLE:
        if sig.source == "router":
            all_parts: tuple[Part, ...] = ("bucket", "count", "sum")
            for s in sig.spellings:
                names.extend(spelling_sample_name(sig.kind, s.family, p) for p in all_parts)
    return frozenset(_with_rewrite(names))


_ROUTER_NAMES = _router_sample_names()


def router_matcher(signal: str) -> str:
    """The label matcher that keeps engine and router samples of a colliding name apart.

    ``server=""`` for engine signals whose names the production-stack router also exposes,
    ``server!=""`` for router signals whose names collide with engine ones, else "".
    """
    sig = _get(signal)
    if sig.source == "router":
        engine = {n for s in _TABLE if s.source != "router" for n in exposed_names(s.name)}
        return f'{ROUTER_LABEL}!=""' if engine & set(exposed_names(signal)) else ""
    parts: tuple[Part, ...] = ("bucket", "count", "sum") if sig.kind == "histogram" else ("bucket",)
    names = {n for p in parts for n in exposed_names(signal, p)}
    return f'{ROUTER_LABEL}=""' if names & _ROUTER_NAMES else ""


def fact_selector(key: str, matchers: str = "") -> str:
    """A selector of one fact family (a key of FACTS), both spellings: the engine's facts are
    its labels, the value is 1. Filter it by target labels only: ``cache_config_info``
    carries no ``model_name`` (filtering it so returns nothing, llm-d-autoscaling#1198)."""
    try:
        family = FACTS[key]
    except KeyError:
        raise ConfigError(f"unknown fact family {key!r} (one of {', '.join(FACTS)})") from None
    return _selector(_with_rewrite([family]), [_clean(matchers)])


def _clean(matchers: str) -> str:
    return matchers.strip().strip("{}").strip().strip(",")


def _selector(names: tuple[str, ...], extra: list[str]) -> str:
    inner = ",".join([f'__name__=~"{"|".join(names)}"', *[m for m in extra if m]])
    return "{" + inner + "}"


def promql_selector(signal: str, matchers: str = "", part: Part = "bucket") -> str:
    """One instant-vector selector matching every spelling of ``signal``.

    e.g. ``{__name__=~"vllm:kv_cache_usage_perc|vllm_kv_cache_usage_perc|…"}`` with
    ``matchers`` (``'model_name="m",job="vllm"'``) and the router matcher appended.
    Caveats: it does not add canonical labels (``direction``), and where an exporter shows a
    deprecated duplicate next to the current name (vLLM 0.11 hidden metrics, 0.24+
    ``kv_offload_total_*``) an aggregation over it double counts — use ``promql_expr``.
    """
    return _selector(exposed_names(signal, part), [router_matcher(signal), _clean(matchers)])


def promql_expr(
    signal: str,
    matchers: str = "",
    part: Part = "bucket",
    range_fn: str | None = None,
    window: str = "5m",
    *,
    spelling_matchers: Callable[[Spelling], str] | None = None,
) -> str:
    """A PromQL expression yielding ``signal`` in canonical labels without double counting.

    One term per spelling in rank order joined by ``or`` (which drops a deprecated series
    where the current name has the same label set); const and renamed labels applied with
    ``label_replace``. With ``range_fn`` each term is ``range_fn(selector[window])``, so e.g.
    ``sum by (le) (promql_expr("ttft_seconds", range_fn="rate"))`` works directly.
    ``spelling_matchers`` adds matchers per spelling (e.g. a job filter for the LMCache
    server's names only).
    """
    sig = _get(signal)
    terms = []
    for s in sig.spellings:
        own = _clean(spelling_matchers(s)) if spelling_matchers else ""
        extra = [router_matcher(signal), _clean(matchers), own]
        # the colon and the underscore spelling are separate selectors joined by ``or``: an
        # exporter that switches between them (a restart under another client version) has
        # both in one range window, and one ``{__name__=~"a|b"}`` would give two series with
        # one label set once ``rate()`` drops the name (an evaluation error)
        subterms = []
        for name in _with_rewrite([spelling_sample_name(sig.kind, s.family, part)]):
            sub = _selector((name,), extra)
            subterms.append(f"{range_fn}({sub}[{window}])" if range_fn else sub)
        term = " or ".join(subterms)
        for key, value in s.const_labels:
            term = f'label_replace({term}, "{key}", "{value}", "", "")'
        for src, dst in s.rename:
            term = f'label_replace({term}, "{dst}", "$1", "{src}", "(.*)")'
            for old, new in s.values:
                term = f'label_replace({term}, "{dst}", "{new}", "{src}", "{old}")'
            term = f'label_replace({term}, "{src}", "", "", "")'
        terms.append(term)
    return terms[0] if len(terms) == 1 else " or ".join(f"({t})" for t in terms)


def is_lmcache_server(spelling: Spelling) -> bool:
    """A spelling the LMCache MP server exposes on its own /metrics (``lmcache_mp_…``), not an
    in-process LMCache name served on the vLLM engine's /metrics (legacy ``lmcache:…``)."""
    return spelling.family.startswith(LMCACHE_SERVER_PREFIX)


def export_spelling(signal: str, labels: Mapping[str, str] | None = None) -> Spelling:
    """The current (rank 0) spelling an exporter must use for ``signal`` and these labels.

    For signals split by a constant label (``offload_bytes_total{direction}``) ``labels``
    picks the family; the exporter writes ``spelling.labels`` (const labels are implied).
    """
    sig = _get(signal)
    given = labels or {}
    for s in sig.spellings:
        if s.rank == 0 and all(given.get(k, v) == v for k, v in s.const_labels):
            return s
    return sig.spellings[0]


def export_sample_name(signal: str, labels: Mapping[str, str] | None = None) -> str:
    """The sample name a vLLM 0.33 / LMCache 0.5.6 exporter writes, e.g.
    ``vllm:num_preemptions_total``; for histograms the base name (add ``_bucket`` …)."""
    sig = _get(signal)
    family = export_spelling(signal, labels).family
    return family if sig.kind == "histogram" else spelling_sample_name(sig.kind, family)
