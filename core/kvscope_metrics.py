"""kvscope's own metrics: the one module where every ``kvscope_`` metric name is spelled.

:class:`MetricDef` constants (import them; never spell a name elsewhere:
tests/core/test_kvscope_metrics.py greps the tree for strays) for the planner's gauges of
the latest stored plans (api.plan_metrics), the collector's health (collector.self_metrics) and
the API's requests and build (api/request_metrics.py). Names follow Prometheus practice; an
interval is one metric with ``bound="estimate|lower|upper"``. The README's "kvscope's own
metrics" table is :func:`markdown_table`'s output (``python -m core.kvscope_metrics``).

Naming conventions: docs/architecture.md, "Conventions"
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from core.errors import ConfigError

__all__ = [
    "ALL_METRICS",
    "API_METRICS",
    "API_REQUESTS",
    "API_REQUEST_DURATION",
    "BOUNDS",
    "BUILD_INFO",
    "COLLECTOR_ANOMALIES",
    "COLLECTOR_INFO",
    "COLLECTOR_LAST_SUCCESSFUL_TICK",
    "COLLECTOR_METRICS",
    "COLLECTOR_SCRAPES",
    "COLLECTOR_SCRAPE_DURATION",
    "COLLECTOR_SKIPPED_TICKS",
    "COLLECTOR_SPOOLED_WINDOWS",
    "COLLECTOR_SPOOL_DROPPED",
    "COLLECTOR_SPOOL_REPLAYED",
    "COLLECTOR_STORE_ERRORS",
    "COLLECTOR_TARGETS",
    "COLLECTOR_TARGET_UP",
    "COLLECTOR_TICKS",
    "COLLECTOR_TICK_LAG",
    "COLLECTOR_WINDOWS_WRITTEN",
    "GAIN_MODES",
    "NAMESPACE",
    "PLAN_AGE",
    "PLAN_BREAKEVEN_KV_USAGE",
    "PLAN_CAPACITY_RATIO",
    "PLAN_CPU_TIER_AVOIDED_PREFILL",
    "PLAN_CPU_TIER_CAPACITY_RATIO",
    "PLAN_CPU_TIER_EXTRAPOLATED",
    "PLAN_CPU_TIER_EXTRA_HIT_RATIO",
    "PLAN_CPU_TIER_RECOMMENDED",
    "PLAN_CREATED",
    "PLAN_DECISION_SCORE",
    "PLAN_DEPLOYED_MODE",
    "PLAN_ENGINES_NEEDED",
    "PLAN_FORECAST_COVERAGE",
    "PLAN_FORECAST_HORIZON",
    "PLAN_FORECAST_NOMINAL_COVERAGE",
    "PLAN_GPUS_SAVED",
    "PLAN_KV_CAPACITY",
    "PLAN_KV_DEMAND_PEAK",
    "PLAN_KV_DEMAND_PEAK_OF_CAPACITY",
    "PLAN_KV_USAGE",
    "PLAN_METRICS",
    "PLAN_MODES",
    "PLAN_RECOMMENDED_MODE",
    "PLAN_SATURATION_PROBABILITY",
    "PLAN_TIME_TO_SATURATION",
    "PLAN_TODAY_PREEMPTIONS",
    "PLAN_TODAY_TTFT_RATIO",
    "SCRAPE_DURATION_BUCKETS",
    "TABLE_BEGIN",
    "TABLE_END",
    "MetricDef",
    "markdown_table",
]

NAMESPACE = "kvscope"
MetricType = Literal["gauge", "counter", "histogram"]

# Every mode a plan can recommend (planner.decide.evidence.MODES; a test keeps them equal),
# the offload modes with a gain fit, and the names of an interval's three figures.
PLAN_MODES = ("none", "native", "lmcache", "both")
GAIN_MODES = ("native", "lmcache")
BOUNDS = ("estimate", "lower", "upper")
SCRAPE_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True, slots=True)
class MetricDef:
    """One of kvscope's metrics: its name, type, label names, unit and meaning.

    ``str(metric)`` is its name, so PromQL can be written ``f"rate({COLLECTOR_SCRAPES}[5m])"``.
    """

    name: str
    type: MetricType
    labels: tuple[str, ...]
    unit: str
    help: str

    def __str__(self) -> str:
        return self.name

    @property
    def series_names(self) -> tuple[str, ...]:
        """The sample names a scrape of this metric holds (a histogram's three; prometheus
        client's ``_created`` companions of counters and histograms are not counted)."""
        if self.type == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)

    def selector(self, **labels: str) -> str:
        """A PromQL instant selector: ``name{label="value",…}`` (labels checked)."""
        unknown = sorted(set(labels) - set(self.labels))
        if unknown:
            raise ConfigError(f"{self.name} has no label(s) {', '.join(unknown)}")
        inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
        return f"{self.name}{{{inner}}}" if inner else self.name


_PLAN = ("cluster", "group")
_TIER = (*_PLAN, "mode", "size")
_TIER_WHAT = (
    "per tier (mode native: vLLM's CPU offload, per engine; lmcache: an LMCache L1 pool per "
    "node) and size (0.5x–4x the HBM KV size, or recommended), modelled from vLLM's KV "
    "residency histograms (--kv-cache-metrics)"
)
_TIER_BAND = (
    "lower/upper: the model-based 90 % interval (bootstrap of the sampled counts, tail "
    "families, HBM reproduction error), not a confidence interval; no estimate series where "
    "the model cannot tell (its range only)"
)

# --------------------------------------------------------------------------- planner gauges

PLAN_RECOMMENDED_MODE = MetricDef(
    "kvscope_plan_recommended_mode", "gauge", (*_PLAN, "mode"), "1 or 0",
    "The offload mode the latest plan recommends: one series per mode (none, native, lmcache, "
    "both), 1 for the recommended one, 0 for the others.",
)  # fmt: skip
PLAN_DEPLOYED_MODE = MetricDef(
    "kvscope_plan_deployed_mode", "gauge", (*_PLAN, "mode"), "1 or 0",
    "The offload mode the latest plan found deployed (from the engines' metadata): one series "
    "per mode, 1 for the deployed one; absent when the plan could not tell (mixed or unknown).",
)  # fmt: skip
PLAN_DECISION_SCORE = MetricDef(
    "kvscope_plan_decision_score", "gauge", _PLAN, "score, 0.05–0.95",
    "Decision score of the latest plan: how far its evidence supports the decision (a score, "
    "not a probability; planner/decide/DECIDER.md).",
)  # fmt: skip
PLAN_BREAKEVEN_KV_USAGE = MetricDef(
    "kvscope_plan_breakeven_kv_cache_usage_ratio", "gauge", (*_PLAN, "mode", "bound"), "ratio 0–1",
    "Diagnostic: KV-cache use above which an offload mode's engines serve more tokens/s than "
    "engines without offload at the same KV use, with its interval (not a capacity gain: "
    "offload itself lowers KV use).",
)  # fmt: skip
PLAN_CAPACITY_RATIO = MetricDef(
    "kvscope_plan_capacity_ratio", "gauge", (*_PLAN, "mode", "bound"),
    "ratio (1.25 = +25 %)",
    "Capacity at the SLO of an offload mode over no offload: the load one engine sustains "
    "within the TTFT target with the mode, divided by the load without; 90 % interval over "
    "independent engines or pools (no upper series: only a lower bound is known).",
)  # fmt: skip
PLAN_TODAY_TTFT_RATIO = MetricDef(
    "kvscope_plan_today_ttft_ratio", "gauge", (*_PLAN, "mode", "ttft_quantile", "bound"),
    "ratio (0.8 = 20 % lower)",
    "Today's effect of an offload mode on the per-window TTFT quantile, at the load each "
    "engine carried, adjusted for traffic mix: mode over no offload, 90 % interval.",
)  # fmt: skip
PLAN_TODAY_PREEMPTIONS = MetricDef(
    "kvscope_plan_today_preemptions_per_1k_requests_difference", "gauge",
    (*_PLAN, "mode", "bound"), "preemptions per 1k requests",
    "Today's effect of an offload mode on preemptions per 1k requests: mode minus no "
    "offload, 90 % interval.",
)  # fmt: skip
PLAN_ENGINES_NEEDED = MetricDef(
    "kvscope_plan_engines_needed", "gauge", (*_PLAN, "mode", "bound"), "engines",
    "The bill: engines needed at the forecast peak with 20 % headroom, without offload "
    "(mode=\"none\") and with each mode at its capacity ratio (lower/upper: the ratio's "
    "upper/lower end).",
)  # fmt: skip
PLAN_GPUS_SAVED = MetricDef(
    "kvscope_plan_gpus_saved", "gauge", (*_PLAN, "mode", "bound"), "GPUs",
    "The bill: GPUs an offload mode saves at the forecast peak (engines without − with, × TP; "
    "× 24 = GPU-hours a day), with the range from its capacity ratio's interval.",
)  # fmt: skip
PLAN_KV_USAGE = MetricDef(
    "kvscope_plan_kv_cache_usage_ratio", "gauge", _PLAN, "ratio 0–1",
    "Current KV-cache use the latest plan saw: median over its history window.",
)  # fmt: skip
PLAN_KV_DEMAND_PEAK = MetricDef(
    "kvscope_plan_forecast_kv_demand_peak_tokens", "gauge", (*_PLAN, "bound"), "KV tokens",
    "Forecast peak KV demand over the plan's horizon, with its interval (only when the plan "
    "measured demand in KV tokens; see the _ratio form).",
)  # fmt: skip
PLAN_KV_DEMAND_PEAK_OF_CAPACITY = MetricDef(
    "kvscope_plan_forecast_kv_demand_peak_ratio", "gauge", (*_PLAN, "bound"),
    "ratio of HBM KV capacity",
    "Forecast peak KV demand over the horizon as a fraction of HBM KV-cache capacity (above 1: "
    "demand exceeds capacity), with its interval; given whatever unit the plan measured in.",
)  # fmt: skip
PLAN_KV_CAPACITY = MetricDef(
    "kvscope_plan_kv_cache_capacity_tokens", "gauge", _PLAN, "KV tokens",
    "HBM KV-cache capacity of the planned engines (num_gpu_blocks × block_size, or the cost "
    "model's prior), when the plan knew it in tokens.",
)  # fmt: skip
PLAN_TIME_TO_SATURATION = MetricDef(
    "kvscope_plan_time_to_saturation_seconds", "gauge", (*_PLAN, "bound"), "seconds",
    "Forecast time from the end of the plan's history until KV demand reaches HBM capacity, "
    "with its interval (absent: no saturation within the horizon, or unknown).",
)  # fmt: skip
PLAN_SATURATION_PROBABILITY = MetricDef(
    "kvscope_plan_saturation_probability_ratio", "gauge", _PLAN, "ratio 0–1",
    "Probability that KV demand reaches HBM capacity within the plan's horizon.",
)  # fmt: skip
PLAN_FORECAST_HORIZON = MetricDef(
    "kvscope_plan_forecast_horizon_seconds", "gauge", _PLAN, "seconds",
    "How far ahead the latest plan forecast (compare with time to saturation).",
)  # fmt: skip
PLAN_AGE = MetricDef(
    "kvscope_plan_age_seconds", "gauge", _PLAN, "seconds",
    "Age of the latest plan at scrape time (now − its creation).",
)  # fmt: skip
PLAN_CREATED = MetricDef(
    "kvscope_plan_created_timestamp_seconds", "gauge", _PLAN, "seconds since the epoch",
    "When the latest plan was made.",
)  # fmt: skip
PLAN_FORECAST_COVERAGE = MetricDef(
    "kvscope_plan_forecast_coverage_ratio", "gauge", _PLAN, "ratio 0–1",
    "Closed loop: share of the KV demand observed after past plans that fell inside their "
    "forecast intervals (realised coverage; compare with the nominal one).",
)  # fmt: skip
PLAN_FORECAST_NOMINAL_COVERAGE = MetricDef(
    "kvscope_plan_forecast_nominal_coverage_ratio", "gauge", _PLAN, "ratio 0–1",
    "Closed loop: the coverage the forecast intervals claimed (their nominal level, e.g. 0.9).",
)  # fmt: skip

PLAN_CPU_TIER_EXTRA_HIT_RATIO = MetricDef(
    "kvscope_plan_cpu_tier_extra_hit_ratio", "gauge", (*_TIER, "bound"),
    "ratio 0–1 (0.08 = +8 points)",
    f"What a CPU tier would buy: the prefix-cache hit ratio it adds to today's HBM-only one, "
    f"{_TIER_WHAT}; {_TIER_BAND}.",
)  # fmt: skip
PLAN_CPU_TIER_AVOIDED_PREFILL = MetricDef(
    "kvscope_plan_cpu_tier_avoided_prefill_tokens_per_second", "gauge", (*_TIER, "bound"),
    "prompt tokens/s",
    f"What a CPU tier would buy: prompt tokens per second the cluster's engines would no longer "
    f"re-prefill (cluster total), {_TIER_WHAT}; {_TIER_BAND}.",
)  # fmt: skip
PLAN_CPU_TIER_CAPACITY_RATIO = MetricDef(
    "kvscope_plan_cpu_tier_capacity_ratio", "gauge", (*_TIER, "bound"), "ratio (1.05 = +5 %)",
    f"What a CPU tier would buy: modelled capacity at the SLO with the tier over without (the "
    f"share of an engine's GPU time at its measured capacity the avoided prefill frees), "
    f"{_TIER_WHAT}; absent without a measured capacity; {_TIER_BAND}.",
)  # fmt: skip
PLAN_CPU_TIER_EXTRAPOLATED = MetricDef(
    "kvscope_plan_cpu_tier_extrapolated", "gauge", _TIER, "1 or 0",
    "What a CPU tier would buy: 1 when the size's figures rest on reuse past the HBM eviction "
    "time (extrapolated by the tail families), 0 when within what the histograms saw.",
)  # fmt: skip
PLAN_CPU_TIER_RECOMMENDED = MetricDef(
    "kvscope_plan_cpu_tier_recommended_bytes", "gauge", (*_PLAN, "mode"), "bytes",
    "What a CPU tier would buy: the recommended CPU tier size (the knee past which each GiB adds "
    "less than a tenth of the first GiB's hits), per engine (mode native) or per LMCache node "
    "pool (lmcache); absent when there is none.",
)  # fmt: skip

PLAN_METRICS: tuple[MetricDef, ...] = (
    PLAN_RECOMMENDED_MODE,
    PLAN_DEPLOYED_MODE,
    PLAN_DECISION_SCORE,
    PLAN_BREAKEVEN_KV_USAGE,
    PLAN_CAPACITY_RATIO,
    PLAN_TODAY_TTFT_RATIO,
    PLAN_TODAY_PREEMPTIONS,
    PLAN_ENGINES_NEEDED,
    PLAN_GPUS_SAVED,
    PLAN_CPU_TIER_EXTRA_HIT_RATIO,
    PLAN_CPU_TIER_AVOIDED_PREFILL,
    PLAN_CPU_TIER_CAPACITY_RATIO,
    PLAN_CPU_TIER_EXTRAPOLATED,
    PLAN_CPU_TIER_RECOMMENDED,
    PLAN_KV_USAGE,
    PLAN_KV_DEMAND_PEAK,
    PLAN_KV_DEMAND_PEAK_OF_CAPACITY,
    PLAN_KV_CAPACITY,
    PLAN_TIME_TO_SATURATION,
    PLAN_SATURATION_PROBABILITY,
    PLAN_FORECAST_HORIZON,
    PLAN_AGE,
    PLAN_CREATED,
    PLAN_FORECAST_COVERAGE,
    PLAN_FORECAST_NOMINAL_COVERAGE,
)

# --------------------------------------------------------------------------- collector health

COLLECTOR_SCRAPES = MetricDef(
    "kvscope_collector_scrapes_total", "counter", ("target", "outcome"), "scrapes",
    "Scrapes (Prometheus mode: range queries) by target and outcome: up, or the error kind "
    "(connect, timeout, http_status, truncated, too_large, parse, refused, redirect, partial).",
)  # fmt: skip
COLLECTOR_ANOMALIES = MetricDef(
    "kvscope_collector_sample_anomalies_total", "counter", ("target", "kind"), "samples",
    "Samples of an exposition's canonical series that were dropped or kept with a warning, by "
    "target and kind (nan, inf, negative_counter, duplicate_series, type_conflict, bad_bucket, "
    "histogram_no_inf_bucket, histogram_not_cumulative); the scrape itself stays up, as "
    "Prometheus keeps a scrape and counts its duplicate samples.",
)  # fmt: skip
COLLECTOR_SCRAPE_DURATION = MetricDef(
    "kvscope_collector_scrape_duration_seconds", "histogram", ("target",), "seconds",
    "Duration of each scrape, failed ones included, by target.",
)  # fmt: skip
COLLECTOR_TARGET_UP = MetricDef(
    "kvscope_collector_target_up", "gauge", ("target",), "1 or 0",
    "1 when the target's last scrape succeeded, 0 when it failed (absent before the first).",
)  # fmt: skip
COLLECTOR_TARGETS = MetricDef(
    "kvscope_collector_targets", "gauge", (), "targets",
    "Targets the collector is configured to scrape.",
)  # fmt: skip
COLLECTOR_WINDOWS_WRITTEN = MetricDef(
    "kvscope_collector_windows_written_total", "counter", (), "windows",
    "Rolled-up windows written to the store.",
)  # fmt: skip
COLLECTOR_STORE_ERRORS = MetricDef(
    "kvscope_collector_store_errors_total", "counter", (), "errors",
    "Store writes that failed (windows are kept and retried at the next tick).",
)  # fmt: skip
COLLECTOR_SPOOLED_WINDOWS = MetricDef(
    "kvscope_collector_spooled_windows", "gauge", (), "windows",
    "Windows the store refused, waiting in the spool (on local disk) to be written back.",
)  # fmt: skip
COLLECTOR_SPOOL_REPLAYED = MetricDef(
    "kvscope_collector_spool_replayed_windows_total", "counter", (), "windows",
    "Windows written back to the store from the spool (an earlier run's leftovers included).",
)  # fmt: skip
COLLECTOR_SPOOL_DROPPED = MetricDef(
    "kvscope_collector_spool_dropped_windows_total", "counter", (), "windows",
    "Windows the spool dropped, each logged at ERROR: past its disk bound (the oldest first), "
    "or in a damaged segment. Should stay 0.",
)  # fmt: skip
COLLECTOR_TICKS = MetricDef(
    "kvscope_collector_ticks_total", "counter", (), "ticks",
    "Collect ticks run (one scrape round of every target, or one Prometheus poll).",
)  # fmt: skip
COLLECTOR_SKIPPED_TICKS = MetricDef(
    "kvscope_collector_skipped_ticks_total", "counter", (), "ticks",
    "Ticks skipped because a scrape round overran the interval (rounds never overlap).",
)  # fmt: skip
COLLECTOR_TICK_LAG = MetricDef(
    "kvscope_collector_tick_lag_seconds", "gauge", (), "seconds",
    "How late the last tick started after its scheduled time.",
)  # fmt: skip
COLLECTOR_LAST_SUCCESSFUL_TICK = MetricDef(
    "kvscope_collector_last_successful_tick_timestamp_seconds", "gauge", (),
    "seconds since the epoch",
    "End of the last tick that ran without an internal or a store error (targets may have "
    "been down: see the scrapes counter).",
)  # fmt: skip
COLLECTOR_INFO = MetricDef(
    "kvscope_collector_info", "gauge", ("cluster", "mode", "shard"), "1",
    "The collector's cluster, mode (direct or prometheus) and shard (I/N, 0/1 unsharded); "
    "value 1.",
)  # fmt: skip
BUILD_INFO = MetricDef(
    "kvscope_build_info", "gauge", ("version",), "1",
    "The running kvscope's version; value 1.",
)  # fmt: skip


API_REQUESTS = MetricDef(
    "kvscope_api_requests_total", "counter", ("route", "method", "code"), "requests",
    "Requests the API answered, by route template (\"unmatched\": no route; \"refused\": "
    "turned away before routing, e.g. an oversized body), method and status code.",
)  # fmt: skip
API_REQUEST_DURATION = MetricDef(
    "kvscope_api_request_duration_seconds", "histogram", ("route", "method"), "seconds",
    "Time from a request's arrival to the end of its response, by route template and method.",
)  # fmt: skip


def kvscope_version() -> str:
    """The installed kvscope's version: BUILD_INFO's label, what `kvscope version` prints and
    what stored plans and the API's OpenAPI document carry ("unknown" in a checkout that was
    never installed)."""
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415 - start-up: importlib.metadata (~0.02 s) off `kvscope --help`, whose commands import this module

    try:
        return version("kvscope")
    except PackageNotFoundError:
        return "unknown"


COLLECTOR_METRICS: tuple[MetricDef, ...] = (
    COLLECTOR_SCRAPES,
    COLLECTOR_ANOMALIES,
    COLLECTOR_SCRAPE_DURATION,
    COLLECTOR_TARGET_UP,
    COLLECTOR_TARGETS,
    COLLECTOR_WINDOWS_WRITTEN,
    COLLECTOR_STORE_ERRORS,
    COLLECTOR_SPOOLED_WINDOWS,
    COLLECTOR_SPOOL_REPLAYED,
    COLLECTOR_SPOOL_DROPPED,
    COLLECTOR_TICKS,
    COLLECTOR_SKIPPED_TICKS,
    COLLECTOR_TICK_LAG,
    COLLECTOR_LAST_SUCCESSFUL_TICK,
    COLLECTOR_INFO,
    BUILD_INFO,
)
# the API's own (kvscope serve's /metrics, beside the planner gauges): api/request_metrics.py
API_METRICS: tuple[MetricDef, ...] = (API_REQUESTS, API_REQUEST_DURATION, BUILD_INFO)
ALL_METRICS: tuple[MetricDef, ...] = (
    PLAN_METRICS + COLLECTOR_METRICS + (API_REQUESTS, API_REQUEST_DURATION)
)


# --------------------------------------------------------------------------- documentation


# The README's table sits between these two lines (a test keeps it equal to markdown_table()).
TABLE_BEGIN = "<!-- metrics table: generated by `python -m core.kvscope_metrics`; do not edit -->"
TABLE_END = "<!-- end of the generated metrics table -->"


def markdown_table() -> str:
    """The README table of every metric: name, type, labels, meaning, unit."""
    lines = ["| name | type | labels | meaning | unit |", "|---|---|---|---|---|"]
    for m in ALL_METRICS:
        labels = ", ".join(f"`{label}`" for label in m.labels) or "—"
        meaning = m.help.replace("|", "\\|")
        lines.append(f"| `{m.name}` | {m.type} | {labels} | {meaning} | {m.unit} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
