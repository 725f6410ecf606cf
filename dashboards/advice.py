"""The Planner board: kvscope's verdict, its evidence, what a CPU tier would buy, the
capacity forecast and whether the advice can be trusted (closed-loop coverage, collector
health).

Reads the ``kvscope_plan_*`` gauges the API serves on ``/metrics`` (the latest stored plan of
every cluster and group) and the collector's ``--metrics-addr`` gauges, against the live
fleet's KV use. Intervals are one metric with ``bound="estimate|lower|upper"``.
"""

from __future__ import annotations

from core.kvscope_metrics import (
    COLLECTOR_TARGET_UP,
    COLLECTOR_TARGETS,
    COLLECTOR_TICK_LAG,
    PLAN_AGE,
    PLAN_BREAKEVEN_KV_USAGE,
    PLAN_CAPACITY_RATIO,
    PLAN_CPU_TIER_AVOIDED_PREFILL,
    PLAN_CPU_TIER_CAPACITY_RATIO,
    PLAN_CPU_TIER_EXTRA_HIT_RATIO,
    PLAN_CPU_TIER_EXTRAPOLATED,
    PLAN_CPU_TIER_RECOMMENDED,
    PLAN_DECISION_SCORE,
    PLAN_DEPLOYED_MODE,
    PLAN_ENGINES_NEEDED,
    PLAN_FORECAST_COVERAGE,
    PLAN_FORECAST_NOMINAL_COVERAGE,
    PLAN_GPUS_SAVED,
    PLAN_KV_CAPACITY,
    PLAN_KV_DEMAND_PEAK_OF_CAPACITY,
    PLAN_KV_USAGE,
    PLAN_RECOMMENDED_MODE,
    PLAN_SATURATION_PROBABILITY,
    PLAN_TIME_TO_SATURATION,
    PLAN_TODAY_PREEMPTIONS,
    PLAN_TODAY_TTFT_RATIO,
    MetricDef,
)
from dashboards.config import MixinConfig
from dashboards.grafana import Board, Chart, Column, Query, Row
from dashboards.recording_rules import COLLECTOR_FAILED, WINDOWS_WRITTEN, find
from dashboards.variables import PLAN_MATCHERS, PLAN_VARIABLES, query

__all__ = ["UID", "planner_board"]

UID = "kvscope-planner"
_GROUP = "{{cluster}} {{group}}"
_MODES = (("1", "yes"), ("0", "no"))
_TIER_KEYS = ("cluster", "group", "mode", "size")  # a table row: a tier of one size
_TIER_ABOUT = (
    "Modelled by `kvscope plan` from vLLM's KV residency histograms (start engines with "
    "--kv-cache-metrics) before any tier is deployed; mode native = vLLM's CPU offload, its "
    "size per engine; lmcache = an LMCache L1 pool, its size per node pool (a lower bound: "
    "reuse across engines is not seen). Ranges are model-based 90 % intervals (a bootstrap of "
    "the sampled histogram counts, the tail families past the HBM eviction time and the HBM "
    "reproduction error), not confidence intervals."
)


def _m(metric: MetricDef, cfg: MixinConfig, extra: str = "") -> str:
    inner = ",".join(x for x in (cfg.planner_selector, PLAN_MATCHERS, extra) if x)
    return f"{metric}{{{inner}}}"


def _c(metric: MetricDef, cfg: MixinConfig, extra: str = "") -> str:
    inner = ",".join(x for x in (cfg.collector_selector, extra) if x)
    return f"{metric}{{{inner}}}"


def _tier_column(metric: MetricDef, cfg: MixinConfig, bound: str) -> Query:
    """One value per tier and size: the other labels (bound, the scrape's) dropped."""
    keys = ", ".join(_TIER_KEYS)
    extra = f'bound="{bound}"' if "bound" in metric.labels else ""
    return Query(f"max by ({keys}) ({_m(metric, cfg, extra)})", instant=True)


def _cpu_tier(cfg: MixinConfig) -> Row:
    extra, tokens, capacity = (PLAN_CPU_TIER_EXTRA_HIT_RATIO, PLAN_CPU_TIER_AVOIDED_PREFILL,
                               PLAN_CPU_TIER_CAPACITY_RATIO)  # fmt: skip
    columns = (
        (Column("extra hit ratio", "percentunit"), _tier_column(extra, cfg, "estimate")),
        (Column("extra hit ratio, lower", "percentunit"), _tier_column(extra, cfg, "lower")),
        (Column("extra hit ratio, upper", "percentunit"), _tier_column(extra, cfg, "upper")),
        (Column("avoided re-prefill tokens/s", "short"), _tier_column(tokens, cfg, "estimate")),
        (Column("capacity ratio", "none"), _tier_column(capacity, cfg, "estimate")),
        (Column("extrapolated", "none", (("1", "yes"), ("0", "no"))),
         _tier_column(PLAN_CPU_TIER_EXTRAPOLATED, cfg, "")),
    )  # fmt: skip
    return Row("CPU tier, before deploying one (modelled)", (
        Chart("What a CPU tier would buy", "Per tier (mode) and size (0.5x–4x the HBM KV size, "
              "and the recommended size): the prefix-cache hit ratio the tier adds to today's "
              "HBM-only one (0.08 = +8 points) with its lower and upper ends, the prompt tokens/s "
              "the cluster would no longer re-prefill, and the modelled capacity at the SLO with "
              "the tier over without (blank without a measured capacity). No estimate, only the "
              "range: the model cannot tell. extrapolated = yes: the figures rest on reuse past "
              f"the HBM eviction time, which the histograms do not see. {_TIER_ABOUT}", "none",
              tuple(q for _, q in columns), kind="table", width=18, height=10,
              keys=_TIER_KEYS, columns=tuple(c for c, _ in columns)),
        Chart("Recommended CPU tier size", "The knee of the modelled hit-ratio curve: past it "
              "each GiB adds less than a tenth of the hits the first GiB past HBM adds; per "
              "engine (native) or per node pool (lmcache); absent when there is none. "
              + _TIER_ABOUT,
              "bytes", (Query(_m(PLAN_CPU_TIER_RECOMMENDED, cfg), f"{_GROUP} {{{{mode}}}}"),),
              kind="stat", width=6, height=10),
    ))  # fmt: skip


def planner_board(cfg: MixinConfig) -> Board:
    band = f"{_GROUP} {{{{mode}}}} {{{{bound}}}}"
    verdict = Row("Verdict", (
        Chart("Recommended offload mode", "The mode the latest plan recommends, per cluster "
              "and group (none, native, lmcache, both); planner/decide/DECIDER.md says how.",
              "none", (Query(_m(PLAN_RECOMMENDED_MODE, cfg), f"{_GROUP} {{{{mode}}}}"),),
              kind="state-timeline", mappings=_MODES),
        Chart("Deployed offload mode", "The mode the plan found deployed, from the engines' "
              "metadata; a deployed mode that differs from the recommended one is the advice.",
              "none", (Query(_m(PLAN_DEPLOYED_MODE, cfg), f"{_GROUP} {{{{mode}}}}"),),
              kind="state-timeline", mappings=_MODES),
        Chart("Decision score", "How far the evidence supports the decision, 0.05–0.95 (a "
              "score, not a probability).", "percentunit",
              (Query(_m(PLAN_DECISION_SCORE, cfg), _GROUP),), min=0, max=1, width=8),
        Chart("Plan age", "Time since the latest plan; KvscopePlanStale fires after "
              f"{cfg.plan_stale_s / 3600:g} h.", "s",
              (Query(_m(PLAN_AGE, cfg), _GROUP),), kind="stat", width=8),
        Chart("Plan KV capacity", "HBM KV-cache capacity of the planned engines (blocks × "
              "block size, or the cost model's prior).", "short",
              (Query(_m(PLAN_KV_CAPACITY, cfg), _GROUP),), kind="stat", width=8),
    ))  # fmt: skip
    evidence = Row("Does offloading pay off here", (
        Chart("Capacity at the SLO, mode over no offload", "Load one engine sustains within "
              "the TTFT target with each mode, divided by the load without (1.25 = +25 %), "
              "with its 90 % interval over independent engines or LMCache pools; no upper "
              "series: only a lower bound is known. KvscopeOffloadNotPayingOff fires when a "
              "deployed mode's upper end is < 1.", "none",
              (Query(_m(PLAN_CAPACITY_RATIO, cfg), band),
               Query("vector(1)", "no offload (1.0)")), width=8),
        Chart("Today: TTFT, mode over no offload", "Effect of each mode on the per-window "
              "TTFT quantile at the load each engine carried, adjusted for traffic mix "
              "(0.8 = 20 % lower), 90 % interval.", "none",
              (Query(_m(PLAN_TODAY_TTFT_RATIO, cfg), f"{band} {{{{ttft_quantile}}}}"),
               Query("vector(1)", "no offload (1.0)")), width=8),
        Chart("Today: preemptions per 1k requests, mode minus no offload", "Effect of each "
              "mode on preemptions per 1k requests at today's load, 90 % interval.", "short",
              (Query(_m(PLAN_TODAY_PREEMPTIONS, cfg), band),), width=8),
        Chart("The bill: engines at the forecast peak", "Engines needed at the forecast peak "
              "with 20 % headroom, without offload (mode none) and with each mode at its "
              "capacity ratio (lower/upper: the ratio's upper/lower end).", "short",
              (Query(_m(PLAN_ENGINES_NEEDED, cfg), band),), width=12),
        Chart("The bill: GPUs saved at the forecast peak", "GPUs each mode saves at the "
              "forecast peak ((engines without − with) × TP; × 24 = GPU-hours a day), with the "
              "range from its capacity ratio.", "short",
              (Query(_m(PLAN_GPUS_SAVED, cfg), band),), width=12),
        Chart("Diagnostic: KV use against the equal-KV break-even", "The plan's KV use (median "
              "over its window) and the live fleet's mean, against the KV use above which a "
              "mode's engines serve more tokens/s than engines without at the same KV use. A "
              "diagnostic, not a capacity gain: offload itself lowers KV use.", "percentunit",
              (Query(_m(PLAN_KV_USAGE, cfg), f"{_GROUP} KV use (plan)"),
               query(find("vllm_kv_cache_usage_ratio", "avg", "fleet"), cfg,
                     "{{model_name}} KV use (live)"),
               Query(_m(PLAN_BREAKEVEN_KV_USAGE, cfg), f"{band} break-even")), min=0, max=1),
    ))  # fmt: skip
    capacity = Row("Capacity", (
        Chart("Forecast peak KV demand vs HBM capacity", "The plan's forecast peak KV demand "
              "over its horizon as a share of HBM KV capacity (estimate and interval), the "
              "fleet's fullest engine now, and capacity (1.0).", "percentunit",
              (Query(_m(PLAN_KV_DEMAND_PEAK_OF_CAPACITY, cfg), f"{_GROUP} forecast {{{{bound}}}}"),
               query(find("vllm_kv_cache_usage_ratio", "max", "fleet"), cfg,
                     "{{model_name}} KV use now (max)"),
               Query("vector(1)", "HBM capacity")), min=0),
        Chart("Time to saturation", "Forecast time until KV demand reaches HBM capacity "
              "(absent: not within the horizon).", "s",
              (Query(_m(PLAN_TIME_TO_SATURATION, cfg, 'bound="estimate"'), _GROUP),),
              kind="stat", width=6),
        Chart("Saturation probability", "Probability that demand reaches capacity within the "
              "horizon.", "percentunit",
              (Query(_m(PLAN_SATURATION_PROBABILITY, cfg), _GROUP),), kind="stat", width=6),
    ))  # fmt: skip
    trust = Row("Can the advice be trusted", (
        Chart("Forecast coverage (closed loop)", "Share of the KV demand observed after past "
              "plans that fell inside their forecast intervals, against the coverage the "
              "intervals claimed. Realised far below nominal: the intervals are too narrow.",
              "percentunit",
              (Query(_m(PLAN_FORECAST_COVERAGE, cfg), f"{_GROUP} realised"),
               Query(_m(PLAN_FORECAST_NOMINAL_COVERAGE, cfg), f"{_GROUP} nominal")),
              min=0, max=1),
        Chart("Collector targets up", "Targets whose last scrape succeeded, of those "
              "configured.", "short",
              (Query(f"sum({_c(COLLECTOR_TARGET_UP, cfg)})", "up"),
               Query(f"sum({_c(COLLECTOR_TARGETS, cfg)})", "configured"))),
        Chart("Collector failed scrapes", "Share of each target's scrapes that failed.",
              "percentunit",
              (query(find(COLLECTOR_FAILED, "ratio_rate", "target"), cfg, "{{target}}"),),
              min=0, max=1),
        Chart("Collector tick lag and windows written", "How late ticks start, and windows "
              "written to the store per second.", "short",
              (Query(_c(COLLECTOR_TICK_LAG, cfg), "tick lag (s)"),
               query(find(WINDOWS_WRITTEN, "rate", "instance"), cfg, "windows/s"))),
    ))  # fmt: skip
    return Board(
        UID, "kvscope / Planner",
        "kvscope's advice: recommended offload mode and its evidence, what a CPU tier would "
        "buy, the KV capacity forecast, and how far to trust them. Generated by `kvscope "
        "dashboards build`; do not edit.",
        (verdict, evidence, _cpu_tier(cfg), capacity, trust), PLAN_VARIABLES,
        tuple(cfg.dashboard_tags),
    )  # fmt: skip
