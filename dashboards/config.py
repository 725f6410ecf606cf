"""The mixin's configuration: which series are whose, the thresholds, the runbook links.

Like a monitoring mixin's ``_config``: every selector and threshold an operator may change is
one field, and the generated dashboards and rules are a pure function of it (:data:`DEFAULT`
made the committed files). KV-cache use alone is no alarm (vLLM runs it near full by
design); every ratio has a traffic floor. docs/runbooks.md gives each alert's reasoning.

Thresholds: dashboards/DESIGN.md#config
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["DEFAULT", "MixinConfig"]


@dataclass(frozen=True, slots=True)
class MixinConfig:
    """Selectors, windows, thresholds and links of the generated dashboards and rules."""

    # Label matchers (PromQL, without braces) that pick each kind of target's series.
    # "" matches every target: vLLM engines are told apart from the production-stack router
    # by the catalogue's `server` matcher, not by job names operators choose.
    vllm_selector: str = ""
    # False for a cluster without LMCache: the Kvscope*Lmcache* alerts are not generated (else
    # KvscopeLmcacheTargetsMissing would warn forever).
    lmcache_deployed: bool = True
    lmcache_selector: str = 'job=~"lmcache.*"'
    collector_selector: str = 'job="kvscope-collector"'
    planner_selector: str = 'job="kvscope-api"'
    # The labels the fleet-level recording rules keep (the rule names' level part).
    fleet_labels: tuple[str, ...] = ("model_name",)
    # The rate window of every recording rule (dashboards use Grafana's $__rate_interval).
    rate_window: str = "5m"
    # --- alert thresholds ------------------------------------------------------------
    preemptions_per_request: float = 0.1  # 1 request in 10 preempted (and re-prefilled)
    min_requests_per_s: float = 0.05  # traffic floor of per-request ratios (3 a minute)
    kv_saturated_ratio: float = 0.95  # KV use (5-min mean) counted as full ...
    kv_saturated_waiting: float = 1.0  # ... while at least this many requests wait (mean)
    lmcache_hit_collapse_factor: float = 0.5  # hit ratio below half its 6-hour p90 ...
    lmcache_hit_baseline_min: float = 0.2  # ... when that baseline was a real one
    lmcache_min_tokens_per_s: float = 100.0  # traffic floor of the LMCache hit ratio
    offload_min_store_bytes_per_s: float = 1e6  # "storing": > 1 MB/s to the CPU tier, 1 h mean
    collector_failed_scrape_ratio: float = 0.2  # a fifth of a target's scrapes failing
    collector_stall_s: float = 300.0  # no clean collect tick for 5 minutes
    plan_stale_s: float = 3 * 3600.0  # no new plan for 3 hours (`plan --every 1h` misses 3)
    saturation_probability: float = 0.5  # plan: capacity more likely than not exhausted
    # --- links -----------------------------------------------------------------------
    # runbook_url = f"{runbook_base}#{alert name, lower case}" (node-mixin's pattern); the
    # default is the repository path of docs/runbooks.md, point it at your wiki or Git host.
    runbook_base: str = "docs/runbooks.md"
    dashboard_tags: tuple[str, ...] = field(default=("kvscope",))

    def runbook_url(self, alert: str) -> str:
        return f"{self.runbook_base}#{alert.lower()}"


DEFAULT = MixinConfig()
