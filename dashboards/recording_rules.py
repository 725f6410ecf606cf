"""The recording rules: every rate and ratio the dashboards and alerts read, named once.

Names follow the mixin convention ``level:metric:operations`` (e.g.
``engine:vllm_kv_cache_usage_ratio:``). A :class:`Record` is an expression builder rendered
with the rules' scope in the rules file and with Grafana's ``$__rate_interval`` in a panel,
so a panel and its rule never disagree.

Naming: dashboards/DESIGN.md#recording_rules
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from core.errors import ConfigError
from core.kvscope_metrics import (
    COLLECTOR_SCRAPE_DURATION,
    COLLECTOR_SCRAPES,
    COLLECTOR_WINDOWS_WRITTEN,
)
from dashboards import promql as q
from dashboards.config import MixinConfig
from dashboards.promql import Scope

__all__ = ["COLLECTOR_FAILED", "RECORDS", "WINDOWS_WRITTEN", "Record", "find"]

Build = Callable[[Scope, tuple[str, ...]], str]


@dataclass(frozen=True, slots=True)
class Record:
    """One recording rule: ``level:metric:operation<window>`` = ``build(scope, fleet_labels)``.

    ``level`` "fleet" stands for the config's fleet labels (``model_name`` by default);
    ``windowed`` rules end in the rules' window; ``unit`` is Grafana's unit id for panels.
    """

    level: str
    metric: str
    operation: str
    build: Build
    unit: str
    help: str
    windowed: bool = True
    labels: Mapping[str, str] = field(default_factory=dict)

    def name(self, cfg: MixinConfig) -> str:
        level = "_".join(cfg.fleet_labels) if self.level == "fleet" else self.level
        op = self.operation + (cfg.rate_window if self.windowed else "")
        return f"{level}:{self.metric}:{op}"

    def expr(self, scope: Scope, cfg: MixinConfig) -> str:
        return self.build(scope, cfg.fleet_labels)

    def selector(self, cfg: MixinConfig, matchers: str = "") -> str:
        """The recorded series, e.g. for an alert: ``name{matchers, static labels}``."""
        inner = [f'{k}="{v}"' for k, v in self.labels.items()]
        inner += [matchers] if matchers else []
        return self.name(cfg) + ("{" + ",".join(inner) + "}" if inner else "")


_ENGINE_TARGET = ("job", "instance")  # an LMCache server / a kvscope target's own labels


def _sum_rate(signal: str, extra: str = "") -> Build:
    return lambda s, fl: q.sum_by(fl, q.rate(signal, s, extra))


def _ratio(num: str, den: str) -> Build:
    return lambda s, fl: q.divide(q.rate(num, s), q.rate(den, s))


def _fleet_ratio(num: str, den: str) -> Build:
    return lambda s, fl: q.divide(q.sum_by(fl, q.rate(num, s)), q.sum_by(fl, q.rate(den, s)))


def _finished(s: Scope) -> str:
    return f"sum without (finished_reason) ({q.rate('request_success_total', s)})"


def _reprefill(s: Scope) -> str:
    """Re-prefilled prompt tokens/s: vLLM 0.16–0.19's own counter where exposed, else
    preemptions/s × mean prompt length, a lower bound (a preempted request also recomputes
    the tokens it had generated), with ``basis`` saying which."""
    exposed = (
        f'label_replace({q.rate("prompt_tokens_recomputed_total", s)}, "basis", "exposed", "", "")'
    )
    estimate = (
        f"({q.rate('preemptions_total', s)}) * {q.histogram_mean('request_prompt_tokens', s, None)}"
    )
    estimate = f'label_replace({estimate}, "basis", "estimate", "", "")'
    return f"{exposed} or ({estimate} unless ignoring (basis) {exposed})"


def _lmcache_rate(signal: str) -> Build:
    return lambda s, fl: q.sum_by(_ENGINE_TARGET, q.rate(signal, s))


def _gauge(signal: str) -> Build:
    return lambda s, fl: q.gauge(signal, s)


def _fleet_gauge(signal: str, op: str) -> Build:
    return lambda s, fl: q.sum_by(fl, q.gauge(signal, s), op)


def _quantile(quant: float, signal: str, labels: tuple[str, ...] | None = None) -> Build:
    return lambda s, fl: q.quantile(quant, signal, s, labels if labels is not None else fl)


def _scrapes(s: Scope, outcome: str) -> str:
    sel = f"{COLLECTOR_SCRAPES}{{{outcome}{',' if s.kvscope and outcome else ''}{s.kvscope}}}"
    return f"sum without (outcome) (rate({sel}[{s.window}]))"


def _collector_failed(s: Scope, fl: tuple[str, ...]) -> str:
    """Failed ÷ all scrapes; 0 (not nothing) for a target that never failed, whose failed
    outcomes have no series yet (prometheus_client creates a label set at its first use)."""
    every, failed = _scrapes(s, ""), _scrapes(s, 'outcome!="up"')
    return q.divide(f"{failed} or 0 * {every}", every)


def _windows_written(s: Scope, fl: tuple[str, ...]) -> str:
    return f"rate({COLLECTOR_WINDOWS_WRITTEN}{{{s.kvscope}}}[{s.window}])"


def _collector_p99(s: Scope, fl: tuple[str, ...]) -> str:
    sel = f"{COLLECTOR_SCRAPE_DURATION}_bucket{{{s.kvscope}}}"
    return f"histogram_quantile(0.99, sum by (le, job, instance, target) (rate({sel}[{s.window}])))"


_P50, _P99 = {"quantile": "0.5"}, {"quantile": "0.99"}
# kvscope's own names come from core.kvscope_metrics (never spelled twice)
COLLECTOR_FAILED = str(COLLECTOR_SCRAPES).removesuffix("_total") + "_failed"
WINDOWS_WRITTEN = str(COLLECTOR_WINDOWS_WRITTEN).removesuffix("_total")

RECORDS: tuple[Record, ...] = (
    # ---- per engine (every target label kept) --------------------------------------------
    Record("engine", "vllm_preemptions", "rate", lambda s, fl: q.rate("preemptions_total", s),
       "reqps", "Requests preempted per second (each one re-prefills its prompt)."),
    Record("engine", "vllm_requests_finished", "rate", lambda s, fl: _finished(s), "reqps",
       "Requests finished per second, every finished_reason."),
    Record("engine", "vllm_preemptions_per_request", "ratio_rate",
       lambda s, fl: q.divide(q.rate("preemptions_total", s), _finished(s)), "percentunit",
       "Preemptions per finished request."),
    Record("engine", "vllm_prompt_tokens", "rate", lambda s, fl: q.rate("prompt_tokens_total", s),
       "short", "Prompt tokens processed per second (computed + cached)."),
    Record("engine", "vllm_generation_tokens", "rate",
       lambda s, fl: q.rate("generation_tokens_total", s), "short",
       "Generation tokens per second."),
    Record("engine", "vllm_prefix_cache_hit", "ratio_rate",
       _ratio("prefix_cache_hits_total", "prefix_cache_queries_total"), "percentunit",
       "Share of looked-up prompt tokens found in the HBM prefix cache."),
    Record("engine", "vllm_external_prefix_cache_hit", "ratio_rate",
       _ratio("external_prefix_cache_hits_total", "prefix_cache_queries_total"), "percentunit",
       "Share of looked-up prompt tokens the KV connector supplied (native CPU tier, LMCache)."),
    Record("engine", "vllm_reprefill_tokens", "rate", lambda s, fl: _reprefill(s), "short",
       "Prompt tokens re-prefilled per second after preemption (basis: exposed | estimate)."),
    Record("engine", "vllm_offload_bytes", "rate", lambda s, fl: q.rate("offload_bytes_total", s),
       "Bps", "Native offload bytes/s by direction (load = CPU→GPU, store = GPU→CPU)."),
    Record("engine", "vllm_offload_transfer_bandwidth", "ratio_rate",
       _ratio("offload_bytes_total", "offload_seconds_total"), "Bps",
       "Effective bytes/s of native offload transfers while they run, by direction."),
    Record("engine", "vllm_offload_allocation_failures", "rate",
       lambda s, fl: q.rate("offload_allocation_failures_total", s), "short",
       "Native offload stores that found no free CPU block, per second."),
    Record("engine", "vllm_kv_cache_usage_ratio", "", _gauge("kv_cache_usage_ratio"), "percentunit",
       "GPU KV-cache use, every spelling in one series.", windowed=False),
    Record("engine", "vllm_kv_cache_usage_ratio", "avg_over_time",
       lambda s, fl: q.over_time("avg", "kv_cache_usage_ratio", s), "percentunit",
       "GPU KV-cache use, mean over the window."),
    Record("engine", "vllm_requests_waiting", "", _gauge("requests_waiting"), "short",
       "Requests waiting.", windowed=False),
    Record("engine", "vllm_requests_waiting", "avg_over_time",
       lambda s, fl: q.over_time("avg", "requests_waiting", s), "short",
       "Requests waiting, mean over the window."),
    Record("engine", "vllm_requests_running", "", _gauge("requests_running"), "short",
       "Requests running.", windowed=False),
    Record("engine", "vllm_requests_waiting_by_reason", "",
       _gauge("requests_waiting_by_reason"), "short",
       "Requests waiting by reason (vLLM 0.20+): capacity = no room to schedule them; "
       "deferred = held by a transient constraint (LoRA slot, KV transfer, blocked status).",
       windowed=False),
    Record("engine", "vllm_requests_waiting_by_reason", "min_over_time",
       lambda s, fl: q.over_time("min", "requests_waiting_by_reason", s), "short",
       "Requests waiting by reason, the least over the window (above 0: never empty in it)."),
    Record("engine", "vllm_offload_cpu_usage_ratio", "", _gauge("offload_cpu_usage_ratio"),
       "percentunit", "CPU-tier space pinned by active offload transfers.", windowed=False),
    # ---- per fleet group (model_name by default) -----------------------------------------
    Record("fleet", "vllm_preemptions", "rate", _sum_rate("preemptions_total"), "reqps",
       "Requests preempted per second."),
    Record("fleet", "vllm_prompt_tokens", "rate", _sum_rate("prompt_tokens_total"), "short",
       "Prompt tokens per second."),
    Record("fleet", "vllm_generation_tokens", "rate", _sum_rate("generation_tokens_total"),
       "short", "Generation tokens per second."),
    Record("fleet", "vllm_prefix_cache_hit", "ratio_rate",
       _fleet_ratio("prefix_cache_hits_total", "prefix_cache_queries_total"), "percentunit",
       "Share of looked-up prompt tokens found in the HBM prefix cache."),
    Record("fleet", "vllm_external_prefix_cache_hit", "ratio_rate",
       _fleet_ratio("external_prefix_cache_hits_total", "prefix_cache_queries_total"),
       "percentunit", "Share of looked-up prompt tokens the KV connector supplied."),
    Record("fleet", "vllm_reprefill_tokens", "rate",
       lambda s, fl: q.sum_by((*fl, "basis"), _reprefill(s)), "short",
       "Prompt tokens re-prefilled per second (basis: exposed | estimate)."),
    Record("fleet", "vllm_kv_cache_usage_ratio", "avg", _fleet_gauge("kv_cache_usage_ratio", "avg"),
       "percentunit", "Mean GPU KV-cache use over the engines.", windowed=False),
    Record("fleet", "vllm_kv_cache_usage_ratio", "max", _fleet_gauge("kv_cache_usage_ratio", "max"),
       "percentunit", "Highest GPU KV-cache use of any engine.", windowed=False),
    Record("fleet", "vllm_requests_waiting", "sum", _fleet_gauge("requests_waiting", "sum"),
       "short", "Requests waiting, all engines.", windowed=False),
    Record("fleet", "vllm_requests_running", "sum", _fleet_gauge("requests_running", "sum"),
       "short", "Requests running, all engines.", windowed=False),
    Record("fleet", "vllm_time_to_first_token_seconds", "histogram_quantile_rate",
       _quantile(0.5, "ttft_seconds"), "s", "Median time to first token.", labels=_P50),
    Record("fleet", "vllm_time_to_first_token_seconds", "histogram_quantile_rate",
       _quantile(0.99, "ttft_seconds"), "s", "p99 time to first token.", labels=_P99),
    Record("fleet", "vllm_e2e_request_latency_seconds", "histogram_quantile_rate",
       _quantile(0.5, "e2e_latency_seconds"), "s", "Median end-to-end latency.", labels=_P50),
    Record("fleet", "vllm_e2e_request_latency_seconds", "histogram_quantile_rate",
       _quantile(0.99, "e2e_latency_seconds"), "s", "p99 end-to-end latency.", labels=_P99),
    Record("fleet", "vllm_request_queue_time_seconds", "histogram_quantile_rate",
       _quantile(0.99, "queue_time_seconds"), "s", "p99 time waiting in the queue.",
       labels=_P99),
    # ---- LMCache (fleet: the lookups carry model_name; instance: one LMCache server) -------
    Record("fleet", "lmcache_requested_tokens", "rate", _sum_rate("lmcache_requested_tokens_total"),
       "short", "Tokens looked up in LMCache per second."),
    Record("fleet", "lmcache_hit_tokens", "ratio_rate",
       _fleet_ratio("lmcache_hit_tokens_total", "lmcache_requested_tokens_total"),
       "percentunit", "Share of looked-up tokens LMCache had (L1 or L2)."),
    Record("fleet", "lmcache_hit_l1_tokens", "ratio_rate",
       _fleet_ratio("lmcache_hit_l1_tokens_total", "lmcache_requested_tokens_total"),
       "percentunit", "Share of looked-up tokens served from L1 (CPU DRAM)."),
    Record("fleet", "lmcache_hit_l2_tokens", "ratio_rate",
       _fleet_ratio("lmcache_hit_l2_tokens_total", "lmcache_requested_tokens_total"),
       "percentunit", "Share of looked-up tokens L2 added beyond L1."),
    Record("instance", "lmcache_l1_usage_ratio", "", _gauge("lmcache_l1_usage_ratio"),
       "percentunit", "L1 used / total.", windowed=False),
    Record("instance", "lmcache_l1_usage_bytes", "", _gauge("lmcache_l1_usage_bytes"), "bytes",
       "L1 bytes in use (legacy: local CPU cache).", windowed=False),
    Record("instance", "lmcache_l2_usage_bytes", "", _gauge("lmcache_l2_usage_bytes"), "bytes",
       "L2 bytes in use.", windowed=False),
    Record("instance", "lmcache_l1_write_chunks", "rate",
       _lmcache_rate("lmcache_l1_write_chunks_total"), "short", "Chunks written to L1 per second."),
    Record("instance", "lmcache_l1_read_chunks", "rate",
       _lmcache_rate("lmcache_l1_read_chunks_total"), "short", "Chunks read from L1 per second."),
    Record("instance", "lmcache_l1_evicted_chunks", "rate",
       _lmcache_rate("lmcache_l1_evicted_chunks_total"), "short",
       "Chunks (legacy: keys) evicted from L1 per second."),
    Record("instance", "lmcache_l2_store_chunks", "rate",
       _lmcache_rate("lmcache_l2_store_completed_chunks_total"), "short",
       "Chunks stored to L2 per second."),
    Record("instance", "lmcache_l2_load_chunks", "rate",
       _lmcache_rate("lmcache_l2_load_completed_chunks_total"), "short",
       "Chunks loaded from L2 per second."),
    Record("instance", "lmcache_stored_tokens", "rate",
       _lmcache_rate("lmcache_stored_tokens_total"), "short",
       "Tokens stored in LMCache per second (legacy)."),
    Record("instance", "lmcache_time_to_retrieve_seconds", "histogram_quantile_rate",
       _quantile(0.99, "lmcache_retrieve_seconds", _ENGINE_TARGET), "s",
       "p99 time to retrieve KV from LMCache (legacy).", labels=_P99),
    Record("instance", "lmcache_time_to_store_seconds", "histogram_quantile_rate",
       _quantile(0.99, "lmcache_store_seconds", _ENGINE_TARGET), "s",
       "p99 time to store KV to LMCache (legacy).", labels=_P99),
    Record("instance", "lmcache_l2_load_throughput_gbps", "mean_rate",
       lambda s, fl: q.histogram_mean("lmcache_l2_load_throughput_gbps", s, _ENGINE_TARGET),
       "short", "Mean L2→L1 load throughput per load task, GB/s (MP server)."),
    # ---- kvscope's collector ----------------------------------------------------------------
    Record("target", COLLECTOR_FAILED, "ratio_rate", _collector_failed,
       "percentunit", "Share of the collector's scrapes of a target that failed."),
    Record("instance", WINDOWS_WRITTEN, "rate", _windows_written, "short",
       "Windows the collector writes to the store per second."),
    Record("target", str(COLLECTOR_SCRAPE_DURATION), "histogram_quantile_rate",
       _collector_p99, "s", "p99 duration of the collector's scrapes of a target.",
       labels=_P99),
)  # fmt: skip


def find(metric: str, operation: str, level: str = "engine", quantile: str = "") -> Record:
    """The record of (level, metric, operation[, quantile]) — panels and alerts name them so."""
    for r in RECORDS:
        if (r.level, r.metric, r.operation) == (level, metric, operation) and (
            not quantile or r.labels.get("quantile") == quantile
        ):
            return r

    raise ConfigError(f"no recording rule {level}:{metric}:{operation} {quantile}".strip())
