"""The dashboards' template variables and the PromQL scope they give the panels.

vLLM boards filter engine series by ``model_name``, ``instance`` and ``engine`` (each
chained on the previous, multi-select with All = ``.*``); LMCache panels by the LMCache
server's ``instance``; the Planner board by kvscope's ``cluster`` and ``group``. Variable
values come from ``label_values()`` of a cheap, exact-name selector (never
``{__name__=~"vllm:.*"}``, which makes Prometheus scan every series name).
"""

from __future__ import annotations

from core import catalog
from core.kvscope_metrics import PLAN_AGE
from dashboards.config import MixinConfig
from dashboards.grafana import Query, Variable
from dashboards.promql import Scope
from dashboards.recording_rules import Record

__all__ = [
    "PLAN_MATCHERS",
    "PLAN_VARIABLES",
    "VLLM_VARIABLES",
    "board_scope",
    "lmcache_variables",
    "query",
]

RATE_INTERVAL = "$__rate_interval"  # Grafana: max(4 × scrape interval, step + scrape)
_ENGINES = "requests_running"  # every vLLM release exposes it; the router's is told apart
_VLLM_MATCHERS = 'model_name=~"$model_name",instance=~"$instance",engine=~"$engine"'
_LMCACHE_MATCHERS = 'instance=~"$lmcache_instance"'
PLAN_MATCHERS = 'cluster=~"$cluster",group=~"$group"'


def _engine_selector(matchers: str = "") -> str:
    return catalog.promql_selector(_ENGINES, matchers)


VLLM_VARIABLES = (
    Variable("model_name", "Model", _engine_selector(), "model_name"),
    Variable("instance", "Instance", _engine_selector('model_name=~"$model_name"'), "instance"),
    Variable("engine", "Engine", _engine_selector(
        'model_name=~"$model_name",instance=~"$instance"'), "engine"),
)  # fmt: skip


def lmcache_variables(cfg: MixinConfig) -> tuple[Variable, ...]:
    return (Variable("lmcache_instance", "LMCache server", f"up{{{cfg.lmcache_selector}}}",
                     "instance"),)  # fmt: skip


PLAN_VARIABLES = (
    Variable("cluster", "Cluster", str(PLAN_AGE), "cluster"),
    Variable("group", "Group", f'{PLAN_AGE}{{cluster=~"$cluster"}}', "group"),
)


def board_scope(cfg: MixinConfig) -> Scope:
    """A dashboard panel's scope: Grafana's rate interval, the config's selectors narrowed
    by the template variables."""
    vllm = ",".join(m for m in (cfg.vllm_selector, _VLLM_MATCHERS) if m)
    lmcache = ",".join(m for m in (cfg.lmcache_selector, _LMCACHE_MATCHERS) if m)
    return Scope(RATE_INTERVAL, vllm, lmcache, cfg.collector_selector)


def query(record: Record, cfg: MixinConfig, legend: str) -> Query:
    """A panel query: ``record``'s expression in the dashboard's scope."""
    return Query(record.expr(board_scope(cfg), cfg), legend)
