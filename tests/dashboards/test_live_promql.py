"""Every PromQL expression kvscope generates, executed against a real Prometheus 2.42.

The stack (tests/dashboards/live.py) is the simulated cluster (none, native and LMCache
engines), every vendor fixture, kvscope's collector and plan gauges, scraped every second
with the generated rule files loaded. Each panel query (Grafana macros and variables
substituted), each template variable, each recording rule and each alert's probe must return
data; every rule must evaluate without error. The same again with the colon trap: every
sample name stored as ``vllm_…`` instead of ``vllm:…``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from dashboards.alerts import ALERTS
from dashboards.config import DEFAULT
from dashboards.generate import DASHBOARD_DIR, artifacts
from dashboards.recording_rules import RECORDS
from tests.dashboards.live import LMCACHE_JOB, Stack, live_stack

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]  # ~40 s: CI runs it in test-slow

RATE_INTERVAL = "5s"  # Grafana's $__rate_interval at a 1 s scrape: max(4 × 1 s, step + 1 s)
VARIABLE = re.compile(r"\$(model_name|instance|engine|lmcache_instance|cluster|group)\b")


def grafana_expr(expr: str) -> str:
    """What Grafana sends for ``expr`` with every variable at All (``.*``)."""
    return VARIABLE.sub(".*", expr.replace("$__rate_interval", RATE_INTERVAL))


def _dashboards() -> dict[str, dict[str, Any]]:
    return {
        rel.stem: json.loads(text)
        for rel, text in artifacts().items()
        if rel.parent == DASHBOARD_DIR
    }


def panel_queries() -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title, expr) of every target of every panel."""
    out = []
    for uid, doc in _dashboards().items():
        for panel in doc["panels"]:
            for target in panel.get("targets", []):
                out.append((uid, f"{panel['title']} [{target['refId']}]", target["expr"]))
    return out


def test_panel_queries_cover_every_dashboard_and_panel() -> None:
    queries = panel_queries()
    boards = _dashboards()
    assert {uid for uid, _, _ in queries} == set(boards)
    charts = sum(1 for d in boards.values() for p in d["panels"] if p["type"] != "row")
    assert len({(u, t.rsplit(" [", 1)[0]) for u, t, _ in queries}) == charts


@pytest.fixture(scope="module", params=[False, True], ids=["colon", "colon-trap"])
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    with live_stack(trap=request.param) as s:
        yield s


def test_live_every_panel_query_returns_data(stack: Stack) -> None:
    empty = []
    for uid, title, expr in panel_queries():
        if not stack.query(grafana_expr(expr)):
            empty.append(f"{uid} / {title}: {grafana_expr(expr)[:300]}")
    assert not empty, f"{len(empty)} panel queries returned nothing:\n" + "\n".join(empty)


def test_live_every_template_variable_has_values(stack: Stack) -> None:
    empty = []
    for uid, doc in _dashboards().items():
        for var in doc["templating"]["list"]:
            if var["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.*), (\w+)\)", var["query"])
            assert m, var["query"]
            selector, label = grafana_expr(m.group(1)), m.group(2)
            values = stack.get(f"/api/v1/label/{label}/values", **{"match[]": selector})
            if not values:
                empty.append(f"{uid} ${var['name']}: {var['query']}")
    assert not empty, "variables without values:\n" + "\n".join(empty)


def _rules(stack: Stack) -> list[dict[str, Any]]:
    groups = stack.get("/api/v1/rules")["groups"]
    return [rule for g in groups for rule in g["rules"]]


def test_live_every_rule_is_loaded_and_evaluates_without_error(stack: Stack) -> None:
    rules = _rules(stack)
    assert len(rules) == len(RECORDS) + len(ALERTS)
    bad = [f"{r['name']}: {r.get('lastError')}" for r in rules if r["health"] != "ok"]
    assert not bad, "rules with evaluation errors:\n" + "\n".join(bad)


def test_live_every_recording_rule_records_data(stack: Stack) -> None:
    empty = [r.selector(DEFAULT) for r in RECORDS if not stack.query(r.selector(DEFAULT))]
    assert not empty, "recording rules with no series:\n" + "\n".join(empty)


def test_live_every_alert_probe_returns_data(stack: Stack) -> None:
    empty = [f"{a.name}: {a.probe(DEFAULT)}" for a in ALERTS if not stack.query(a.probe(DEFAULT))]
    assert not empty, "alerts watching series nobody exposes:\n" + "\n".join(empty)


def test_live_planner_alerts_pending_on_the_stored_plan_and_health_alerts_quiet(
    stack: Stack,
) -> None:
    """The stored plan has native offload deployed with a negative gain interval and
    saturation in 2.5 h of a 1-day horizon: those two alerts are pending (their ``for``
    has not passed); the collector, plans and LMCache targets are healthy, except the legacy
    LMCache fixture, which reports itself unhealthy."""
    alerts = stack.get("/api/v1/alerts")["alerts"]
    active = {a["labels"]["alertname"] for a in alerts}
    assert {"KvscopeOffloadNotPayingOff", "KvscopeKvCapacityExhaustedWithinHorizon"} <= active
    quiet = {"KvscopeCollectorDown", "KvscopeLmcacheTargetsMissing", "KvscopePlanAbsent",
             "KvscopePlanStale", "KvscopeCollectorStalled"}  # fmt: skip
    assert not (active & quiet), active & quiet
    # the legacy LMCache fixture reports itself unhealthy (is_healthy 0): that one target only
    down = {
        a["labels"].get("job") for a in alerts if a["labels"]["alertname"] == "KvscopeLmcacheDown"
    }
    assert down == {f"{LMCACHE_JOB}-lmcache-0.5.6-legacy-metrics"}, down
