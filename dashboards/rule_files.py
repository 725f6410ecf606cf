"""Prometheus rule files: the recording rules of dashboards.recording_rules and the alerts of
dashboards.alerts, as ``rule_files`` YAML (deploy/prometheus/rules/*.yml).

Recording rules are grouped by what they read (vLLM engines, fleet aggregates, LMCache,
kvscope's collector) so a failing expression names its area in Prometheus' rule page.
Every alert carries ``severity`` (critical | warning | info), ``summary``, ``description``
and ``runbook_url`` (``MixinConfig.runbook_url``: node-mixin's pattern).
"""

from __future__ import annotations

from typing import Any

import yaml

from dashboards.alerts import ALERTS, Alert
from dashboards.config import MixinConfig
from dashboards.promql import rule_scope
from dashboards.recording_rules import RECORDS, Record

__all__ = ["RECORD_GROUPS", "alert_rules", "dump_rules", "recording_rules"]

LMCACHE_ALERTS = "KvscopeLmcache"  # the alerts config.lmcache_deployed=False leaves out
RECORD_GROUPS = (
    "kvscope-vllm-engine.rules",
    "kvscope-vllm-fleet.rules",
    "kvscope-lmcache.rules",
    "kvscope-collector.rules",
)


def _group_of(r: Record) -> str:
    if r.level == "target":
        return "kvscope-collector.rules"
    if r.metric.startswith("lmcache"):
        return "kvscope-lmcache.rules"
    return "kvscope-vllm-engine.rules" if r.level == "engine" else "kvscope-vllm-fleet.rules"


def _record(r: Record, cfg: MixinConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"record": r.name(cfg), "expr": r.expr(rule_scope(cfg), cfg)}
    if r.labels:
        out["labels"] = dict(r.labels)
    return out


def recording_rules(cfg: MixinConfig) -> dict[str, Any]:
    """The recording rules document: one group per area, rules in RECORDS order."""
    groups: dict[str, list[dict[str, Any]]] = {name: [] for name in RECORD_GROUPS}
    for r in RECORDS:
        groups[_group_of(r)].append(_record(r, cfg))
    return {"groups": [{"name": n, "rules": rules} for n, rules in groups.items() if rules]}


def _alert(a: Alert, cfg: MixinConfig) -> dict[str, Any]:
    return {
        "alert": a.name,
        "expr": a.expr(cfg),
        "for": a.for_,
        "labels": {"severity": a.severity},
        "annotations": {
            "summary": a.summary,
            "description": a.description,
            "runbook_url": cfg.runbook_url(a.name),
        },
    }


def alert_rules(cfg: MixinConfig) -> dict[str, Any]:
    """The alerting rules document (one group; rules in ALERTS order)."""
    alerts = [a for a in ALERTS if cfg.lmcache_deployed or not a.name.startswith(LMCACHE_ALERTS)]
    return {"groups": [{"name": "kvscope.alerts", "rules": [_alert(a, cfg) for a in alerts]}]}


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_rules(doc: dict[str, Any], header: str) -> str:
    """YAML text of a rules document: one expression per line (never folded), multi-line
    ones as literal blocks."""
    body = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=1 << 16, allow_unicode=True)
    return header + body
