"""The alerting rules: what pages an operator of a vLLM + LMCache cluster, and what does not.

Each :class:`Alert` carries its expression, ``for``, severity, ``summary`` and
``description``, a ``runbook_url`` into docs/runbooks.md and a ``probe`` (the compared
quantity without its threshold, which the live-Prometheus test requires to return data).
Counters only through the recording rules' ``rate()``, every ratio with a traffic floor,
``absent()`` guards, and KV-cache use alone never pages.

Design rules: dashboards/DESIGN.md#alerts
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from core.kvscope_metrics import (
    COLLECTOR_LAST_SUCCESSFUL_TICK,
    GAIN_MODES,
    PLAN_AGE,
    PLAN_CAPACITY_RATIO,
    PLAN_DEPLOYED_MODE,
    PLAN_FORECAST_HORIZON,
    PLAN_SATURATION_PROBABILITY,
    PLAN_TIME_TO_SATURATION,
)
from dashboards import promql as q
from dashboards.config import MixinConfig
from dashboards.recording_rules import COLLECTOR_FAILED, find

__all__ = ["ALERTS", "Alert"]

Severity = Literal["critical", "warning", "info"]
Text = Callable[[MixinConfig], str]


@dataclass(frozen=True, slots=True)
class Alert:
    """One alerting rule; ``expr`` and ``probe`` are functions of the config."""

    name: str
    severity: Severity
    for_: str
    expr: Text
    probe: Text
    summary: str
    description: str


def _up(selector: str) -> str:
    return f"up{{{selector}}}"


def _preemption_storm(c: MixinConfig) -> str:
    ratio = find("vllm_preemptions_per_request", "ratio_rate").selector(c)
    finished = find("vllm_requests_finished", "rate").selector(c)
    return (
        f"{ratio} > {c.preemptions_per_request}\n"
        f"and on (job, instance, engine) {finished} > {c.min_requests_per_s}"
    )


def _kv_saturated(c: MixinConfig) -> str:
    kv = find("vllm_kv_cache_usage_ratio", "avg_over_time").selector(c)
    waiting = find("vllm_requests_waiting", "avg_over_time").selector(c)
    return (
        f"{kv} > {c.kv_saturated_ratio}\n"
        f"and on (job, instance, engine) {waiting} >= {c.kv_saturated_waiting}"
    )


def _deferred(c: MixinConfig) -> str:
    """Deferred waiting requests, the least over the rules' window (vLLM 0.20+ only: an
    older engine has no such series, so the alert stays silent there, with no absent()
    guard, which would fire for every pre-0.20 engine forever)."""
    return find("vllm_requests_waiting_by_reason", "min_over_time").selector(c, 'reason="deferred"')


def _scheduler_stuck(c: MixinConfig) -> str:
    finished = find("vllm_requests_finished", "rate").selector(c)
    # `== 0` on the finished rate, not `unless … > 0`: it takes a counter that is there
    # and flat (vLLM creates every finished_reason series at start-up), so an engine whose
    # counter is not scraped never looks stuck. Running requests are not a condition:
    # vllm-project/vllm#53130's engine showed 3-4 running while nothing finished.
    return f"{_deferred(c)} > 0\nand on (job, instance, engine) {finished} == 0"


def _lmcache_down(c: MixinConfig) -> str:
    healthy = q.gauge("lmcache_healthy", q.rule_scope(c))
    return f"{_up(c.lmcache_selector)} == 0\nor ({healthy}) == 0"


def _lmcache_down_probe(c: MixinConfig) -> str:
    return _up(c.lmcache_selector)


def _lmcache_collapsed(c: MixinConfig) -> str:
    hit = find("lmcache_hit_tokens", "ratio_rate", "fleet").selector(c)
    traffic = find("lmcache_requested_tokens", "rate", "fleet").selector(c)
    # the 6-hour baseline is a high quantile, not the max: one good 5-minute spike does
    # not set it
    best = f"quantile_over_time(0.9, {hit}[6h])"
    on = f"on ({q.by(c.fleet_labels)})"
    return (
        f"{hit} < {c.lmcache_hit_collapse_factor} * {best}\n"
        f"and {on} {best} > {c.lmcache_hit_baseline_min}\n"
        f"and {on} {traffic} > {c.lmcache_min_tokens_per_s}"
    )


def _stores_without_loads(c: MixinConfig) -> str:
    rate = find("vllm_offload_bytes", "rate")
    stores, loads = rate.selector(c, 'direction="store"'), rate.selector(c, 'direction="load"')
    store, load = f"avg_over_time({stores}[1h])", f"max_over_time({loads}[1h])"
    # `unless … > 0`, not `and … == 0`: an engine whose load counter has no series yet
    # (nothing ever loaded) must fire too
    return f"{store} > {c.offload_min_store_bytes_per_s}\nunless ignoring (direction) {load} > 0"


def _stores_probe(c: MixinConfig) -> str:
    return find("vllm_offload_bytes", "rate").selector(c)


def _not_paying_off(c: MixinConfig) -> str:
    deployed = f"{PLAN_DEPLOYED_MODE}{{{{mode{{}},{c.planner_selector}}}}} == 1"
    single = deployed.format('!~"none|both"')
    both = deployed.format('="both"')
    # "both" runs native and LMCache: it is judged by each one's capacity ratio (rulestate.py)
    split = " or ".join(f'label_replace({both}, "mode", "{m}", "", "")' for m in GAIN_MODES)
    # the upper series exists only for a two-sided interval (a lower bound has none)
    ratio = f'{PLAN_CAPACITY_RATIO}{{bound="upper",{c.planner_selector}}}'
    return f"{ratio} < 1\nand on (cluster, group, mode) ({single} or {split})"


def _not_paying_probe(c: MixinConfig) -> str:
    return f'{PLAN_CAPACITY_RATIO}{{bound="upper",{c.planner_selector}}}'


def _capacity(c: MixinConfig) -> str:
    tts = f'{PLAN_TIME_TO_SATURATION}{{bound="estimate",{c.planner_selector}}}'
    horizon = f"{PLAN_FORECAST_HORIZON}{{{c.planner_selector}}}"
    p = f"{PLAN_SATURATION_PROBABILITY}{{{c.planner_selector}}}"
    # aggregated per (cluster, group): two API replicas (a rollout) serve the same plan twice
    return (
        f"min by (cluster, group) ({tts}) <= on (cluster, group) "
        f"max by (cluster, group) ({horizon})\n"
        f"and on (cluster, group) max by (cluster, group) ({p}) >= {c.saturation_probability}"
    )


def _capacity_probe(c: MixinConfig) -> str:
    return f"{PLAN_SATURATION_PROBABILITY}{{{c.planner_selector}}}"


def _scrapes_failing(c: MixinConfig) -> str:
    failed = find(COLLECTOR_FAILED, "ratio_rate", "target").selector(c)
    return f"{failed} > {c.collector_failed_scrape_ratio}"


def _collector_stalled(c: MixinConfig) -> str:
    tick = f"{COLLECTOR_LAST_SUCCESSFUL_TICK}{{{c.collector_selector}}}"
    # tick > 0: the gauge is 0 until the first clean tick (a long Prometheus back-fill is one
    # tick), which is not a stall
    return f"time() - {tick} > {c.collector_stall_s:g}\nand {tick} > 0"


def _collector_down(c: MixinConfig) -> str:
    return f"{_up(c.collector_selector)} == 0\nor absent({_up(c.collector_selector)})"


def _plan_stale(c: MixinConfig) -> str:
    age = f"{PLAN_AGE}{{{c.planner_selector}}}"
    return f"{age} > {c.plan_stale_s:g}"


def _plan_absent(c: MixinConfig) -> str:
    return f"absent({PLAN_AGE}{{{c.planner_selector}}})"


def _plan_absent_probe(c: MixinConfig) -> str:
    return f"{PLAN_AGE}{{{c.planner_selector}}}"


ALERTS: tuple[Alert, ...] = (
    Alert(
        "KvscopeVllmPreemptionStorm", "warning", "10m", _preemption_storm,
        lambda c: find("vllm_preemptions_per_request", "ratio_rate").selector(c),
        "vLLM engine {{ $labels.instance }} preempts {{ $value | humanize }} times per "
        "finished request.",
        "Engine {{ $labels.instance }} (model {{ $labels.model_name }}) made more than 0.1 "
        "preemptions per finished request over the last 5 minutes under traffic (a request "
        "can be preempted more than once). Each preemption "
        "frees the request's KV blocks and re-prefills its prompt later: GPU time spent twice "
        "and TTFT up. The KV pool is too small for the concurrency it is given.",
    ),
    Alert(
        "KvscopeVllmKvCacheSaturated", "warning", "15m", _kv_saturated,
        lambda c: find("vllm_kv_cache_usage_ratio", "avg_over_time").selector(c),
        "vLLM engine {{ $labels.instance }} has a full KV cache and requests waiting for it.",
        "Engine {{ $labels.instance }} averaged {{ $value | humanizePercentage }} KV-cache use "
        "over 5 minutes with requests waiting. High KV use alone is normal for vLLM; with a "
        "queue it means new requests wait for KV blocks (queue time, TTFT).",
    ),
    Alert(
        "KvscopeVllmSchedulerStuck", "critical", "10m", _scheduler_stuck, _deferred,
        "vLLM engine {{ $labels.instance }} engine {{ $labels.engine }} holds {{ $value | "
        "humanize }} deferred requests and has finished none for 15 minutes.",
        "Engine {{ $labels.instance }} engine {{ $labels.engine }} (model "
        "{{ $labels.model_name }}) has had requests in the deferred part of its waiting "
        "queue at every scrape, and finished no request, for at least 15 minutes. Its "
        "scheduler has stopped admitting work while /health still answers 200, so it keeps "
        "receiving requests it will never serve; vllm-project/vllm#53130 reports this state "
        "lasting until the engine was restarted. Drain the engine and restart it.",
    ),
    Alert(
        "KvscopeLmcacheDown", "critical", "2m", _lmcache_down, _lmcache_down_probe,
        "LMCache server {{ $labels.instance }} is down or unhealthy.",
        "Prometheus cannot scrape LMCache server {{ $labels.instance }} (up == 0), or it "
        "reports itself unhealthy. Engines that share it lose their CPU/L2 KV tier and "
        "recompute every prefix; with the MP connector, lookups may stall.",
    ),
    Alert(
        "KvscopeLmcacheTargetsMissing", "warning", "10m",
        lambda c: f"absent({_up(c.lmcache_selector)})", _lmcache_down_probe,
        "No LMCache server is being scraped.",
        "No target matches the LMCache selector, so KvscopeLmcacheDown cannot fire. Either "
        "the LMCache servers vanished from service discovery or the mixin's "
        "lmcache_selector does not match their job.",
    ),
    Alert(
        "KvscopeLmcacheHitRateCollapsed", "warning", "15m", _lmcache_collapsed,
        lambda c: find("lmcache_hit_tokens", "ratio_rate", "fleet").selector(c),
        "LMCache hit ratio of {{ $labels.model_name }} fell to {{ $value | "
        "humanizePercentage }}.",
        "The share of looked-up tokens LMCache supplies fell below half of its 90th "
        "percentile over the last 6 hours, under real traffic. Usual causes: an LMCache "
        "restart (cold L1), L1 too small for the working set (evictions), a changed prompt "
        "template or cache_salt, or a router change that scattered prefixes.",
    ),
    Alert(
        "KvscopeOffloadStoresWithoutLoads", "warning", "30m", _stores_without_loads,
        _stores_probe,
        "Engine {{ $labels.instance }} writes KV to the CPU tier and never reads it back.",
        "For an hour, native KV offload stored {{ $value | humanize1024 }}B/s to CPU memory "
        "and loaded nothing back. The stores cost PCIe bandwidth and CPU memory for no hit: "
        "the CPU tier is too small to keep prefixes until they recur, or prefixes do not "
        "recur on this engine (vllm-project/vllm#56871 reports the same symptom).",
    ),
    Alert(
        "KvscopeOffloadNotPayingOff", "warning", "30m", _not_paying_off, _not_paying_probe,
        "{{ $labels.mode }} offload costs capacity on {{ $labels.cluster }} "
        "{{ $labels.group }}.",
        "kvscope's latest plan measured the deployed {{ $labels.mode }} offload's capacity at "
        "the SLO against engines without offload, and even the upper end of its 90 % "
        "interval is below 1 ({{ $value | humanize }}): engines with it carry less load "
        "within the latency target. The offload tier is deployed where KV fits in HBM or "
        "prefixes do not recur; see the plan's decision and its offload section.",
    ),
    Alert(
        "KvscopeKvCapacityExhaustedWithinHorizon", "warning", "5m", _capacity, _capacity_probe,
        "KV demand of {{ $labels.cluster }} {{ $labels.group }} reaches HBM capacity in "
        "{{ $value | humanizeDuration }}.",
        "kvscope's forecast puts peak KV demand at or above the engines' HBM KV capacity "
        "within the plan's horizon, more likely than not. Expect preemptions and queueing "
        "from then on; the plan's sizing says how many engines or how much offload tier.",
    ),
    Alert(
        "KvscopeCollectorScrapesFailing", "warning", "15m", _scrapes_failing,
        lambda c: find(COLLECTOR_FAILED, "ratio_rate", "target").selector(c),
        "kvscope cannot scrape {{ $labels.target }}: {{ $value | humanizePercentage }} fail.",
        "More than a fifth of the collector's scrapes of {{ $labels.target }} failed over 5 "
        "minutes. The plan loses that engine's windows; the outcome label of the collector's "
        "scrapes counter says why (connect, timeout, http_status, parse, ...).",
    ),
    Alert(
        "KvscopeCollectorStalled", "warning", "5m", _collector_stalled,
        lambda c: f"{COLLECTOR_LAST_SUCCESSFUL_TICK}{{{c.collector_selector}}}",
        "kvscope's collector has not completed a clean tick for {{ $value | "
        "humanizeDuration }}.",
        "The collector process is up but its ticks fail (an internal or a store error) or "
        "stopped. No windows are written, so plans go stale.",
    ),
    Alert(
        "KvscopeCollectorDown", "warning", "10m", _collector_down,
        lambda c: _up(c.collector_selector),
        "kvscope's collector is down or not scraped.",
        "Prometheus cannot scrape the collector's --metrics-addr, or no such target exists "
        "(the absent() guard). Nothing is collected and every collector alert is blind.",
    ),
    Alert(
        "KvscopePlanStale", "warning", "10m", _plan_stale, _plan_absent_probe,
        "kvscope's plan for {{ $labels.cluster }} {{ $labels.group }} is "
        "{{ $value | humanizeDuration }} old.",
        "No new plan has been stored for 3 hours: `kvscope plan --every` stopped, or its "
        "plans fail (too little history, store unreachable). The planner alerts and the "
        "Planner dashboard show old advice.",
    ),
    Alert(
        "KvscopePlanAbsent", "info", "1h", _plan_absent, _plan_absent_probe,
        "No kvscope plan metrics are scraped.",
        "Prometheus holds no plan-age gauge: the API (`kvscope serve`) is not "
        "scraped, or no plan was ever stored. The planner alerts cannot fire.",
    ),
)  # fmt: skip
