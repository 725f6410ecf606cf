"""The parts fit: one run through every real component kvscope is deployed with.

``kvscope simulate demo --serve`` (8 engines: 4 without offload, 2 with vLLM's native CPU
offload, 2 on an LMCache server; load raised to a constant 16 req/s so the engines without
offload preempt constantly) → Debian's Prometheus 2.42 scraping every second with kvscope's
committed recording and alerting rules (alerts' ``for:`` shortened to 5 s, expressions
untouched) → Alertmanager 0.25 with deploy/alertmanager/alertmanager.yml (timings shortened)
→ deploy/alertmanager/webhook_logger.py on 127.0.0.1; and Prometheus → ``kvscope
collect --prometheus`` → PostgreSQL 15 → ``kvscope plan --save`` → ``kvscope serve``
(uvicorn) answering the saved plan and the engines' offload modes.

One cluster does both jobs: the storm is on the engines without offload while the native
and LMCache engines keep their modes, so the mixed deployment the plan must see and the
preemption storm the alert must report are the same traffic (one simulator, one Prometheus,
one collector: what fits in a 3-minute budget on 2 cores).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from core.errors import KvscopeError
from dashboards.alerts import ALERTS
from dashboards.generate import RULES_DIR
from store.store import Store
from tests import services
from tests.clirun import run_kvscope
from tests.e2e.stack import (
    KVSCOPE,
    ROOT,
    RULE_FILES,
    WEBHOOK_LOGGER,
    Proc,
    Stages,
    alertmanager_config,
    get_json,
    hostport,
    listening_url,
    notifications,
    prometheus_config,
    rule_exprs,
    shortened_rules,
    started,
    try_json,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.prometheus]

CLUSTER = "e2e"
STORM = "KvscopeVllmPreemptionStorm"
MODES = {"none", "native", "lmcache"}
SPEED = 20.0  # simulated seconds per wall second
# demo's engines and HBM (gpu_memory_utilization 0.3), at its diurnal peak rate all the time
SCENARIO = ("demo", "--set", "duration_s=86400", "--set", "workload.arrival=poisson",
            "--set", "workload.qps=16")  # fmt: skip
ALERT_FOR = "5s"
HISTORY_S = 40.0  # wall seconds of windows the plan gets
COLLECT = ("--interval", "1s", "--window", "5s", "--since", "5m", "--settle", "3s")


def _endpoints(ports: Path) -> dict[str, Any] | None:
    text = ports.read_text() if ports.exists() else ""
    return json.loads(text) if text.strip() else None


def _storm_instances(hook_out: Path) -> set[str]:
    """Instances of every firing storm alert the webhook received."""
    return {
        alert["labels"].get("instance", "")
        for doc in notifications(hook_out)
        if doc.get("status") == "firing"
        for alert in doc.get("alerts", [])
        if alert["labels"].get("alertname") == STORM and alert.get("status") == "firing"
    }


def _alert_state(prom: str, am: str, hook_out: Path) -> dict[str, Any]:
    """What each hop knows of the storm alert (for the failure message)."""
    rules = try_json(f"{prom}/api/v1/rules?type=alert")
    storm = [
        {"state": r.get("state"), "health": r.get("health"), "alerts": len(r.get("alerts", []))}
        for g in (rules or {}).get("data", {}).get("groups", [])
        for r in g["rules"]
        if r["name"] == STORM
    ]
    am_alerts = try_json(f"{am}/api/v2/alerts") or []
    return {
        "prometheus": storm,
        "alertmanager": sorted({a["labels"]["alertname"] for a in am_alerts}),
        "webhook_notifications": len(notifications(hook_out)),
    }


def _store_engines(db: str) -> dict[str, str]:
    try:
        with Store(db) as store:
            return {e.source: e.offload or "" for e in store.engines(CLUSTER)}
    except KvscopeError:  # the collector has not created the schema yet
        return {}


def _history_s(db: str) -> float:
    try:
        with Store(db) as store:
            stats = store.stats()
    except KvscopeError:
        return 0.0
    first, last = stats["windows_from"], stats["windows_until"]
    return 0.0 if first is None else float(last) - float(first)


def _run(stages: Stages, stage: str, *args: str) -> subprocess.CompletedProcess[str]:
    proc = run_kvscope(*args, timeout=120)
    assert proc.returncode == 0, f"stage '{stage}': kvscope {args[0]} failed:\n{proc.stderr}"
    stages.mark(stage)
    return proc


def _stopped(stages: Stages, proc: Proc) -> str:
    code = proc.stop()
    assert code == 0, f"{proc.name} exited {code} on SIGTERM\n{proc.tail()}"
    stages.mark(f"{proc.name} stopped")
    return proc.stdout.read_text()


def test_stack_simulated_cluster_reaches_alert_plan_and_api_with_engine_modes(
    tmp_path: Path,
) -> None:
    assert STORM in {a.name for a in ALERTS}
    stages = Stages()
    with ExitStack() as stack:
        db = stack.enter_context(services.postgres())
        stages.mark("postgres up")
        hook_out = tmp_path / "webhook.jsonl"
        logger = stack.enter_context(started("webhook_logger", [
            sys.executable, str(WEBHOOK_LOGGER), "--host", "127.0.0.1", "--port", "0",
            "--out", str(hook_out)], tmp_path))  # fmt: skip
        hook = stages.until("webhook logger listening", lambda: listening_url(logger),
                            timeout_s=15, procs=[logger], every_s=0.05)  # fmt: skip
        am = stack.enter_context(services.alertmanager(alertmanager_config(f"{hook}/alerts")))
        stages.mark("alertmanager up")

        ports = tmp_path / "ports.json"
        sim = stack.enter_context(started("simulate", [
            KVSCOPE, "simulate", *SCENARIO, "--serve", "127.0.0.1:0", "--speed", str(SPEED),
            "--ports-file", str(ports)], tmp_path))  # fmt: skip
        endpoints = stages.until("simulator serving", lambda: _endpoints(ports),
                                 timeout_s=30, procs=[sim])  # fmt: skip
        want = {hostport(e["url"]): e["offload"] for e in endpoints["engines"]}
        assert set(want.values()) == MODES, endpoints
        pools = [hostport(p["url"]) for p in endpoints["lmcache"]]

        rules, committed_for = shortened_rules(tmp_path, ALERT_FOR)
        assert rule_exprs(rules) == rule_exprs([ROOT / RULES_DIR / n for n in RULE_FILES])
        assert committed_for[STORM] != ALERT_FOR  # the copy, not the committed file, is short
        config = prometheus_config({"vllm": list(want), "lmcache": pools}, rules, hostport(am))
        prom = stack.enter_context(services.prometheus(config))
        stages.mark("prometheus up")

        collector = stack.enter_context(started("collect", [
            KVSCOPE, "collect", "--prometheus", prom, "--db", db, "--cluster", CLUSTER,
            *COLLECT], tmp_path))  # fmt: skip
        procs = [logger, sim, collector]

        # ---- alerting: the storm reaches the webhook through Alertmanager
        def storm_on_an_engine_without_offload() -> set[str] | None:
            fired = _storm_instances(hook_out)
            return fired if any(want.get(i) == "none" for i in fired) else None

        fired = stages.until(
            "storm alert on an engine without offload delivered to the webhook",
            storm_on_an_engine_without_offload, timeout_s=60, procs=procs,
            seen=lambda: _alert_state(prom, am, hook_out),
        )  # fmt: skip
        assert fired <= set(want), f"alerts name unknown instances: {fired - set(want)}"
        rule_health = get_json(f"{prom}/api/v1/rules")["data"]["groups"]
        broken = [r["name"] for g in rule_health for r in g["rules"] if r["health"] != "ok"]
        assert not broken, f"rules that do not evaluate: {broken}"

        # ---- collecting: every engine registered with the mode it runs, enough history
        stages.until(
            "engines registered with their modes", lambda: _store_engines(db) == want or None,
            timeout_s=60, procs=procs, seen=lambda: _store_engines(db),
        )  # fmt: skip
        stages.until(
            f"{HISTORY_S:g} s of windows stored", lambda: _history_s(db) >= HISTORY_S or None,
            timeout_s=90, procs=procs, seen=lambda: _history_s(db),
        )  # fmt: skip
        summary = json.loads(_stopped(stages, collector))
        assert summary["mode"] == "prometheus" and summary["cluster"] == CLUSTER, summary
        assert summary["windows_written"] > 0, summary
        _stopped(stages, sim)  # its CPU is the planner's now

        # ---- planning: decided from the engines' own modes, saved
        made = _run(stages, "plan saved", "plan", "--save", "--cluster", CLUSTER, "--db", db,
                    "--json", "--forecast-seconds", "3")  # fmt: skip
        plan = json.loads(made.stdout)
        ids = re.search(rf"saved 1 plan\(s\) of cluster {CLUSTER} \(id (\d+)\)", made.stderr)
        assert ids is not None, made.stderr
        assert plan["decision"]["mode"] in MODES, plan["decision"]
        exposed = f"offload modes: {len(want)} exposed of {len(want)} engine(s)"
        assert exposed in plan["basis"], plan["basis"]
        # the storm the alert reported is the HBM pressure the decision measured
        (r1,) = [r for r in plan["decision"]["reasons"] if r["rule"] == "R1_hbm_pressure"]
        assert r1["source"].startswith("measured"), r1
        assert r1["numbers"]["preemptions_per_1k"] >= r1["numbers"]["preemptions_per_1k_mark"]
        mode_basis = plan["happening"]["current_mode"]["basis"]
        assert "lmcache, native, none" in mode_basis, mode_basis  # the mixed deployment
        assert set(plan["happening"]["by_mode"]) >= MODES, plan["happening"]["by_mode"].keys()
        # every engine is registered; only the LMCache server may be named here (the planner
        # counts it among sources "without engine metadata")
        no_meta = [b for b in plan["basis"] if "without engine metadata" in b]
        assert not [e for e in want for b in no_meta if e in b], no_meta
        listed = json.loads(_run(stages, "plans listed", "plans", "list", "--db", db,
                                 "--cluster", CLUSTER, "--json").stdout)  # fmt: skip
        saved = listed["plans"][0]
        assert saved["id"] == int(ids.group(1)), listed

        # ---- serving: the API answers the saved plan and the engines as they run
        port = services.free_port()
        api = f"http://127.0.0.1:{port}"
        server = stack.enter_context(started("serve", [
            KVSCOPE, "serve", "--db", db, "--host", "127.0.0.1", "--port", str(port)],
            tmp_path))  # fmt: skip
        stages.until("api ready", lambda: try_json(f"{api}/healthz"), timeout_s=30,
                     procs=[server])  # fmt: skip
        served = get_json(f"{api}/v1/clusters/{CLUSTER}/plan")
        got = (served["id"], served["mode"], served["created_at"])
        assert got == (saved["id"], plan["decision"]["mode"], saved["created_at"]), served
        assert served["document"] == plan
        engines = get_json(f"{api}/v1/clusters/{CLUSTER}/engines")["engines"]
        assert {e["source"]: e["offload"] for e in engines} == want, engines
        for e in engines:
            assert e["facts"]["offload_basis"].startswith("exposed"), e
        clusters = get_json(f"{api}/v1/clusters")["clusters"]
        assert {"name": CLUSTER, "engines": len(want), "targets": len(want) + len(pools) + 1} in (
            clusters
        ), clusters
        stages.mark("api answered")
        _stopped(stages, server)
        logged = [json.loads(line) for line in _stopped(stages, logger).splitlines()]
    events = [e for e in logged if e["event"] == "notification" and STORM in e["alertnames"]]
    assert events and logged[-1]["event"] == "stopped", logged[-3:]
    print(f"\ne2e stages (s since start): {stages.done}")
