"""collector.selfmetrics: kvscope's own metrics and their names; collector.plan_metrics: the
plan gauges read from a real store (SQLite, and PostgreSQL for the latest-plan query);
collector.health: the collector's health registry served over real HTTP on 127.0.0.1; and
promtool's lint of both expositions."""

from __future__ import annotations

import asyncio
import math
import os
import re
import socket
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from collector import selfmetrics as sm
from collector.health import CollectorHealth, parse_listen_addr, serve_metrics
from collector.plan_metrics import PlanCollector, render_plan_metrics
from collector.promsource import PrometheusSource
from collector.run import collect_direct
from collector.run_prometheus import collect_prometheus
from collector.sources import Target, TargetSet
from core.errors import ConfigError
from dashboards.build import DASHBOARD_DIR, K8S_DIR, RULES_DIR
from store.store import Store
from store.tables import PLAN_HEADLINE, PlanRecord
from tests.collector.conftest import LiveProm
from tests.collector.exposerver import expo_server
from tests.services import free_port
from tests.tierdoc import CANNOT, SECTION, section

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "metrics" / "vllm-0.33.0-metrics-default.txt"
PROMTOOL = Path("/usr/bin/promtool")
NOW = 1_764_000_000.0
# the offload section of a plan (planner/plan/verdict.py): native measured, lmcache cannot tell
_EFFECT = {"can_tell": True, "estimate": 0.4, "interval": {"lo": 0.3, "hi": 0.55, "level": 0.9}}
TOKENS_DOC = {
    "forecast": {"kv_demand": {"unit": "KV tokens"}},
    "offload": {"modes": {
        "native": {
            "today": {"effects": [
                {**_EFFECT, "outcome": "ttft_p90_s"},
                {**_EFFECT, "outcome": "preemptions_per_1k", "estimate": -80.0,
                 "interval": {"lo": -100.0, "hi": -60.0, "level": 0.9}},
                {**_EFFECT, "outcome": "ttft_p50_s", "can_tell": False},
            ]},
            "bill": {"can_tell": True, "engines_without_offload": 10, "engines_with_mode": 8,
                     "engines_with_mode_range": [7, 9], "gpu_hours_saved_per_day": 48.0,
                     "gpu_hours_saved_range": [24.0, None]},
        },
        "lmcache": {"today": {"effects": []}, "bill": {"can_tell": False}},
    }},
    "cpu_tier": SECTION,  # tests/tierdoc.py
}  # fmt: skip
ENGINES_DOC = {"forecast": {"kv_demand": {"unit": "engines of KV"}}, "cpu_tier": CANNOT}
Series = dict[str, list[tuple[dict[str, str], float]]]


def parse(text: bytes | str) -> Series:
    """Every sample of an exposition by sample name: [(labels, value), …]."""
    out: Series = {}
    raw = text.decode() if isinstance(text, bytes) else text
    for family in text_string_to_metric_families(raw):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def value(series: Series, name: str, **labels: str) -> float:
    found = [
        v for lab, v in series.get(name, []) if all(lab.get(k) == w for k, w in labels.items())
    ]
    assert len(found) == 1, (name, labels, series.get(name))
    return found[0]


def labelsets(series: Series, metric: sm.MetricDef, **labels: str) -> list[dict[str, str]]:
    return [
        lab
        for lab, _ in series.get(metric.name, [])
        if all(lab.get(k) == w for k, w in labels.items())
    ]


def plan(cluster: str, group: str, created: float, mode: str | None, doc: Mapping[str, Any],
         **headline: float | None) -> PlanRecord:  # fmt: skip
    return PlanRecord(
        cluster=cluster,
        group=group,
        created_at=created,
        window_from=created - 86_400,
        window_until=created - 60,
        horizon_s=7 * 86_400,
        version="0.1.0",
        mode=mode,
        document=doc,
        headline=headline,
    )


FULL = {
    "score": 0.55,
    "breakeven_native": 0.62, "breakeven_native_lo": 0.55, "breakeven_native_hi": 0.71,
    "breakeven_lmcache": 0.48, "breakeven_lmcache_lo": 0.40, "breakeven_lmcache_hi": 0.57,
    "capacity_native": 1.25, "capacity_native_lo": 1.1, "capacity_native_hi": 1.42,
    "capacity_lmcache": 1.3, "capacity_lmcache_lo": 1.2, "capacity_lmcache_hi": None,
    "equal_kv_gain_native": 0.12, "equal_kv_gain_native_lo": 0.05,
    "equal_kv_gain_native_hi": 0.19,
    "kv_util_now": 0.83,
    "forecast_peak": 1.5e6, "forecast_peak_lo": 1.2e6, "forecast_peak_hi": 1.9e6,
    "kv_capacity": 2.0e6,
    "saturation_s": 3.0e5, "saturation_lo_s": 1.0e5, "saturation_hi_s": 6.0e5,
    "p_saturation": 0.35,
}  # fmt: skip


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh, migrated store: a SQLite file, or a new schema on the shared PostgreSQL."""
    if request.param == "sqlite":
        with Store(f"sqlite:///{tmp_path / 'kvscope.db'}") as s:
            s.migrate()
            yield s
        return
    server: str = request.getfixturevalue("postgres_url")
    admin = server.replace("postgresql+psycopg://", "postgresql://")
    schema = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(admin, autocommit=True) as con:
        con.execute(f"CREATE SCHEMA {schema}")
    try:
        with Store(f"{server}?options=-csearch_path%3D{schema}") as s:
            s.migrate()
            yield s
    finally:
        with psycopg.connect(admin, autocommit=True) as con:
            con.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture
def two_plans(store: Store) -> Store:
    """prod-a's cluster plan (superseding an older one) and prod-b's plan of one model group,
    which could not tell several figures and measured demand in engines, not tokens."""
    store.save_plan(plan("prod-a", "", NOW - 9_000, "none", TOKENS_DOC, score=0.2))
    store.save_plan(plan("prod-a", "", NOW - 600, "native", TOKENS_DOC, **FULL))
    partial = {k: None for k in PLAN_HEADLINE} | {
        "score": 0.3,
        "breakeven_lmcache": 0.7,  # bounds unknown
        "kv_util_now": 0.41,
        "forecast_peak": 3.0, "forecast_peak_lo": 2.5, "forecast_peak_hi": 3.5,
        "kv_capacity": 4.0,
        "p_saturation": 0.0,
    }  # fmt: skip
    store.save_plan(plan("prod-b", "llama-70b", NOW - 1_800, "lmcache", ENGINES_DOC, **partial))
    return store


# --------------------------------------------------------------------------- plan gauges


def test_store_latest_plans_two_clusters_gives_newest_per_group(two_plans: Store) -> None:
    latest = two_plans.latest_plans()
    assert [(p.cluster, p.group, p.mode) for p in latest] == [
        ("prod-a", "", "native"),
        ("prod-b", "llama-70b", "lmcache"),
    ]
    assert [p.mode for p in two_plans.latest_plans("prod-b")] == ["lmcache"]
    assert two_plans.latest_plans("nowhere") == []


def test_render_plan_metrics_two_plans_one_series_per_mode_exactly_one_chosen(
    two_plans: Store,
) -> None:
    series = parse(render_plan_metrics(two_plans, now=NOW))
    for cluster, group, chosen in (("prod-a", "", "native"), ("prod-b", "llama-70b", "lmcache")):
        rows = {
            lab["mode"]: v
            for lab, v in series[sm.PLAN_RECOMMENDED_MODE.name]
            if lab["cluster"] == cluster and lab["group"] == group
        }
        assert sorted(rows) == sorted(sm.PLAN_MODES)
        assert [m for m, v in rows.items() if v == 1.0] == [chosen]
        assert sum(rows.values()) == 1.0


def test_render_plan_metrics_full_plan_gives_every_figure_with_bounds(two_plans: Store) -> None:
    s = parse(render_plan_metrics(two_plans, now=NOW))
    a = {"cluster": "prod-a", "group": ""}
    assert value(s, sm.PLAN_DECISION_SCORE.name, **a) == 0.55
    for mode, (est, lo, hi) in {
        "native": (0.62, 0.55, 0.71),
        "lmcache": (0.48, 0.40, 0.57),
    }.items():
        got = [
            value(s, sm.PLAN_BREAKEVEN_KV_USAGE.name, **a, mode=mode, bound=b) for b in sm.BOUNDS
        ]
        assert got == [est, lo, hi]
    assert value(s, sm.PLAN_CAPACITY_RATIO.name, **a, mode="native", bound="upper") == 1.42
    assert value(s, sm.PLAN_CAPACITY_RATIO.name, **a, mode="lmcache", bound="lower") == 1.2
    # a lower bound has no upper series
    assert labelsets(s, sm.PLAN_CAPACITY_RATIO, **a, mode="lmcache", bound="upper") == []
    ttft = {"mode": "native", "ttft_quantile": "p90"}
    assert value(s, sm.PLAN_TODAY_TTFT_RATIO.name, **a, **ttft, bound="upper") == 0.55
    assert labelsets(s, sm.PLAN_TODAY_TTFT_RATIO, **a, ttft_quantile="p50") == []  # cannot tell
    assert value(s, sm.PLAN_TODAY_PREEMPTIONS.name, **a, mode="native", bound="lower") == -100.0
    engines = {
        (lab["mode"], lab["bound"]): v for lab, v in s[sm.PLAN_ENGINES_NEEDED.name]
        if lab["cluster"] == "prod-a"
    }  # fmt: skip
    assert engines == {("none", "estimate"): 10, ("native", "estimate"): 8,
                       ("native", "lower"): 7, ("native", "upper"): 9}  # fmt: skip
    saved = labelsets(s, sm.PLAN_GPUS_SAVED, **a, mode="native")
    assert sorted(x["bound"] for x in saved) == ["estimate", "lower"]  # a bound: no upper
    assert value(s, sm.PLAN_GPUS_SAVED.name, **a, mode="native", bound="estimate") == 2.0
    assert value(s, sm.PLAN_KV_USAGE.name, **a) == 0.83
    assert value(s, sm.PLAN_KV_DEMAND_PEAK.name, **a, bound="lower") == 1.2e6
    assert value(s, sm.PLAN_KV_DEMAND_PEAK_OF_CAPACITY.name, **a, bound="upper") == 1.9e6 / 2e6
    assert value(s, sm.PLAN_KV_CAPACITY.name, **a) == 2.0e6
    assert value(s, sm.PLAN_TIME_TO_SATURATION.name, **a, bound="estimate") == 3.0e5
    assert value(s, sm.PLAN_SATURATION_PROBABILITY.name, **a) == 0.35
    assert value(s, sm.PLAN_FORECAST_HORIZON.name, **a) == 7 * 86_400
    assert value(s, sm.PLAN_CREATED.name, **a) == NOW - 600
    assert value(s, sm.PLAN_AGE.name, **a) == 600.0  # from `now`, not the wall clock


def test_render_plan_metrics_none_figures_omitted_never_nan(two_plans: Store) -> None:
    s = parse(render_plan_metrics(two_plans, now=NOW))
    b = {"cluster": "prod-b", "group": "llama-70b"}
    assert all(math.isfinite(v) for rows in s.values() for _, v in rows)
    assert [x["bound"] for x in labelsets(s, sm.PLAN_BREAKEVEN_KV_USAGE, **b)] == ["estimate"]
    assert labelsets(s, sm.PLAN_BREAKEVEN_KV_USAGE, **b, mode="native") == []
    assert labelsets(s, sm.PLAN_CAPACITY_RATIO, **b) == []
    assert labelsets(s, sm.PLAN_ENGINES_NEEDED, **b) == []
    assert labelsets(s, sm.PLAN_TIME_TO_SATURATION, **b) == []
    assert value(s, sm.PLAN_SATURATION_PROBABILITY.name, **b) == 0.0  # 0 is a figure, kept
    # demand in engines' worth of KV: no _tokens series, the fraction of capacity instead
    assert labelsets(s, sm.PLAN_KV_DEMAND_PEAK, **b) == []
    assert labelsets(s, sm.PLAN_KV_CAPACITY, **b) == []
    assert value(s, sm.PLAN_KV_DEMAND_PEAK_OF_CAPACITY.name, **b, bound="estimate") == 0.75
    assert value(s, sm.PLAN_AGE.name, **b) == 1_800.0
    # no closed-loop figures unless the caller passes them
    assert sm.PLAN_FORECAST_COVERAGE.name not in s


def _tier(s: Series, metric: sm.MetricDef, **labels: str) -> dict[tuple[str, ...], float]:
    """(mode, size[, bound]) -> value of one cpu_tier gauge of prod-a's plan."""
    rest = [k for k in ("mode", "size", "bound") if k in metric.labels and k not in labels]
    return {
        tuple(lab[k] for k in rest): v
        for lab, v in s.get(metric.name, [])
        if lab["cluster"] == "prod-a" and all(lab.get(k) == w for k, w in labels.items())
    }


def test_render_plan_metrics_cpu_tier_gives_each_size_with_its_model_based_range(
    two_plans: Store,
) -> None:
    s = parse(render_plan_metrics(two_plans, now=NOW))
    extra = _tier(s, sm.PLAN_CPU_TIER_EXTRA_HIT_RATIO)
    sizes = {"0.5x", "1x", "2x", "4x"}
    assert {size for mode, size, _ in extra if mode == "native"} == sizes | {"recommended"}
    assert {size for mode, size, _ in extra if mode == "lmcache"} == sizes  # none recommended
    assert [extra["native", "2x", b] for b in sm.BOUNDS] == [0.08, 0.05, 0.11]
    assert [extra["native", "1x", b] for b in sm.BOUNDS] == [0.0, 0.0, 0.0]  # 0 is a figure
    # lmcache 4x cannot tell: its range, no estimate
    assert ("lmcache", "4x", "estimate") not in extra
    assert (extra["lmcache", "4x", "lower"], extra["lmcache", "4x", "upper"]) == (0.05, 0.22)
    assert len(extra) == 5 * 3 + 3 * 3 + 2
    tokens = _tier(s, sm.PLAN_CPU_TIER_AVOIDED_PREFILL, bound="estimate")
    assert tokens["native", "4x"] == 4650.0 and tokens["lmcache", "2x"] == 2700.0
    capacity = _tier(s, sm.PLAN_CPU_TIER_CAPACITY_RATIO)
    assert capacity["native", "recommended", "upper"] == 1.11
    assert not [k for k in capacity if k[:2] == ("lmcache", "4x")]  # null: no series
    assert _tier(s, sm.PLAN_CPU_TIER_EXTRAPOLATED) == {
        ("native", "0.5x"): 0.0, ("native", "1x"): 0.0, ("native", "2x"): 1.0,
        ("native", "4x"): 1.0, ("native", "recommended"): 1.0,
        ("lmcache", "0.5x"): 0.0, ("lmcache", "1x"): 0.0, ("lmcache", "2x"): 1.0,
        ("lmcache", "4x"): 1.0,
    }  # fmt: skip
    assert _tier(s, sm.PLAN_CPU_TIER_RECOMMENDED) == {("native",): 62.0 * 1024**3}
    # prod-b's plan cannot tell (no engine exports the histograms): no series at all
    for metric in (sm.PLAN_CPU_TIER_EXTRA_HIT_RATIO, sm.PLAN_CPU_TIER_EXTRAPOLATED):
        assert labelsets(s, metric, cluster="prod-b") == []


def test_render_plan_metrics_cpu_tier_older_or_partial_sections_give_what_they_hold(
    store: Store,
) -> None:
    odd = section()
    rows = odd["native"]["rows"]
    rows[2]["extra_hit_ratio"] = {"estimate": None, "lo": None, "hi": None}
    rows[3]["multiple"] = 2.0  # a second "2x": the first one's series only
    del rows[0]["extrapolated"]
    odd["native"]["recommended"] = {"gib": None, "multiple": None, "why": "no knee"}
    odd["lmcache"] = None
    store.save_plan(plan("old", "", NOW - 10, "none", {"offload": None}))  # before cpu_tier
    store.save_plan(plan("odd", "", NOW - 10, "none", {"cpu_tier": odd}))
    s = parse(render_plan_metrics(store, now=NOW))
    for metric in (sm.PLAN_CPU_TIER_EXTRA_HIT_RATIO, sm.PLAN_CPU_TIER_RECOMMENDED):
        assert labelsets(s, metric, cluster="old") == []
    assert labelsets(s, sm.PLAN_CPU_TIER_RECOMMENDED, cluster="odd") == []
    assert labelsets(s, sm.PLAN_CPU_TIER_EXTRA_HIT_RATIO, cluster="odd", mode="lmcache") == []
    got = {(x["size"], x["bound"]) for x in labelsets(s, sm.PLAN_CPU_TIER_EXTRA_HIT_RATIO,
                                                      cluster="odd")}  # fmt: skip
    assert {size for size, _ in got} == {"0.5x", "1x", "recommended"}  # 2x: nulls, then a dup
    tokens = labelsets(s, sm.PLAN_CPU_TIER_AVOIDED_PREFILL, cluster="odd", size="2x")
    assert len(tokens) == 3  # the first 2x row's, not the duplicate's
    assert value(s, sm.PLAN_CPU_TIER_AVOIDED_PREFILL.name, cluster="odd", size="2x",
                 bound="estimate") == 3100.0  # fmt: skip
    flags = {x["size"] for x in labelsets(s, sm.PLAN_CPU_TIER_EXTRAPOLATED, cluster="odd")}
    assert flags == {"1x", "2x", "recommended"}  # 0.5x has no flag


def test_render_plan_metrics_coverage_given_adds_realised_and_nominal(two_plans: Store) -> None:
    coverage = {("prod-a", ""): (0.82, 0.9), ("prod-b", "llama-70b"): (math.nan, 0.8)}
    s = parse(render_plan_metrics(two_plans, now=NOW, coverage=coverage))
    a = {"cluster": "prod-a", "group": ""}
    assert value(s, sm.PLAN_FORECAST_COVERAGE.name, **a) == 0.82
    assert value(s, sm.PLAN_FORECAST_NOMINAL_COVERAGE.name, **a) == 0.9
    assert labelsets(s, sm.PLAN_FORECAST_COVERAGE, cluster="prod-b") == []  # NaN: omitted
    assert value(s, sm.PLAN_FORECAST_NOMINAL_COVERAGE.name, cluster="prod-b") == 0.8


def test_render_plan_metrics_plan_without_mode_gives_no_mode_series(store: Store) -> None:
    store.save_plan(plan("c", "", NOW - 10, None, {}, score=None))
    s = parse(render_plan_metrics(store, now=NOW))
    assert sm.PLAN_RECOMMENDED_MODE.name not in s and sm.PLAN_DECISION_SCORE.name not in s
    assert value(s, sm.PLAN_AGE.name, cluster="c", group="") == 10.0


def test_render_plan_metrics_empty_store_renders_nothing(store: Store) -> None:
    assert render_plan_metrics(store) == b""


def test_plan_collector_registered_reads_store_at_each_collect(store: Store) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=True)
    registry.register(PlanCollector(store, coverage=lambda: None, clock=lambda: NOW))
    assert generate_latest(registry) == b""
    store.save_plan(plan("c", "", NOW - 5, "none", {}))
    assert value(parse(generate_latest(registry)), sm.PLAN_AGE.name, cluster="c") == 5.0


def test_plan_modes_equal_the_planners() -> None:
    from planner.decide.evidence import MODES

    assert tuple(MODES) == sm.PLAN_MODES


# --------------------------------------------------------------------------- collector health


@dataclass
class _Stats:
    ticks: int = 0
    skipped_ticks: int = 0
    windows_written: int = 0
    store_errors: int = 0
    loop_errors: int = 0
    last_lag_s: float = 0.0


def test_collector_health_ticks_move_counters_and_stamp_only_clean_ticks() -> None:
    h = CollectorHealth(version="9.9.9", cluster="c", mode="direct", targets=["a", "b"])
    s = parse(h.render())
    assert value(s, sm.COLLECTOR_SCRAPES.name, target="a", outcome="up") == 0.0
    assert value(s, sm.COLLECTOR_TARGETS.name) == 2
    assert value(s, sm.BUILD_INFO.name, version="9.9.9") == 1
    assert value(s, sm.COLLECTOR_INFO.name, cluster="c", mode="direct") == 1
    assert sm.COLLECTOR_TARGET_UP.name not in s  # unknown until scraped
    h.scraped("a", "up", 0.01)
    h.scraped("b", "http_status", 0.02)
    h.ticked(_Stats(ticks=1, windows_written=5, last_lag_s=0.003), at=100.0)
    h.ticked(_Stats(ticks=2, windows_written=5, store_errors=1), at=200.0)
    h.ticked(_Stats(ticks=3, skipped_ticks=2, windows_written=9, store_errors=1, last_lag_s=0.25),
             at=300.0)  # fmt: skip
    s = parse(h.render())
    assert value(s, sm.COLLECTOR_SCRAPES.name, target="b", outcome="http_status") == 1
    assert value(s, sm.COLLECTOR_TARGET_UP.name, target="a") == 1
    assert value(s, sm.COLLECTOR_TARGET_UP.name, target="b") == 0
    assert value(s, f"{sm.COLLECTOR_SCRAPE_DURATION}_count", target="b") == 1
    assert value(s, f"{sm.COLLECTOR_SCRAPE_DURATION}_sum", target="a") == 0.01
    assert value(s, sm.COLLECTOR_TICKS.name) == 3
    assert value(s, sm.COLLECTOR_SKIPPED_TICKS.name) == 2
    assert value(s, sm.COLLECTOR_WINDOWS_WRITTEN.name) == 9
    assert value(s, sm.COLLECTOR_STORE_ERRORS.name) == 1
    assert value(s, sm.COLLECTOR_TICK_LAG.name) == 0.25
    assert value(s, sm.COLLECTOR_LAST_SUCCESSFUL_TICK.name) == 300.0  # 200: a store error
    h.ticked(_Stats(ticks=4, windows_written=9, store_errors=1, last_lag_s=-0.5), at=400.0)
    assert value(parse(h.render()), sm.COLLECTOR_TICK_LAG.name) == 0.0  # early: no lag


def test_collector_health_targets_change_drops_gone_series() -> None:
    h = CollectorHealth(version="1", cluster="c", mode="direct", targets=["a", "b"])
    h.scraped("b", "timeout", 1.0)
    h.set_targets(["a", "c"])
    s = parse(h.render())
    assert value(s, sm.COLLECTOR_TARGETS.name) == 2
    assert {lab["target"] for lab in labelsets(s, sm.COLLECTOR_SCRAPES)} == {"a", "c"}
    assert labelsets(s, sm.COLLECTOR_TARGET_UP) == []


def test_collect_direct_with_health_counts_match_the_loop(tmp_path: Path) -> None:
    h = CollectorHealth(version="1", cluster="t", mode="direct")
    with expo_server() as srv, Store(f"sqlite:///{tmp_path / 'k.db'}") as store:
        store.migrate()
        targets = TargetSet("t", (
            Target("up0", srv.add("/m", FIXTURE.read_bytes()), "vllm"),
            Target("err", srv.add("/500", b"no\n", status=500), "vllm"),
        ))  # fmt: skip
        stats = asyncio.run(
            # 0.5 s ticks: a scrape's deadline is the tick's, and a 0.05 s one timed out the
            # 554-line fixture under a loaded CI machine (an "up" counted as a timeout)
            collect_direct(targets, store, interval_s=0.5, window_s=1.0, timeout_s=5,
                           concurrency=4, max_body_bytes=1 << 24, max_ticks=4, health=h)
        )  # fmt: skip
    s = parse(h.render())
    # every tick scrapes both targets once; under a loaded machine a scrape can still miss
    # its tick's deadline (a timeout), so the counts are checked against the loop's own
    by: dict[tuple[str, str], float] = {
        (lab["target"], lab["outcome"]): v for lab, v in s[sm.COLLECTOR_SCRAPES.name]
    }
    assert {o for (t, o), v in by.items() if t == "up0" and v} <= {"up", "timeout"}
    assert {o for (t, o), v in by.items() if t == "err" and v} <= {"http_status", "timeout"}
    assert sum(v for (t, _), v in by.items() if t == "up0") == 4
    assert sum(v for (t, _), v in by.items() if t == "err") == 4
    assert by[("up0", "up")] >= 1 and by[("err", "http_status")] >= 1
    failed = sum(v for (_, o), v in by.items() if o != "up")
    assert failed == sum(stats.failures.values())
    assert sum(by.values()) == stats.scrapes == 8
    assert value(s, sm.COLLECTOR_TICKS.name) == stats.ticks == 4
    assert value(s, sm.COLLECTOR_WINDOWS_WRITTEN.name) == stats.windows_written > 0
    assert value(s, sm.COLLECTOR_TARGETS.name) == 2
    assert value(s, sm.COLLECTOR_LAST_SUCCESSFUL_TICK.name) > 0


@pytest.mark.prometheus
def test_collect_prometheus_with_health_counts_each_query(
    tmp_path: Path, live_prometheus: LiveProm
) -> None:
    h = CollectorHealth(version="1", cluster="prom", mode="prometheus")
    with (
        PrometheusSource(live_prometheus.url) as source,
        Store(f"sqlite:///{tmp_path / 'k.db'}") as store,
    ):
        store.migrate()
        h.set_targets([source.url])
        stats = asyncio.run(
            collect_prometheus(source, store, cluster="prom", window_s=2, since_s=60,
                               interval_s=0.5, settle_s=0, max_polls=2, health=h)
        )  # fmt: skip
    s = parse(h.render())
    queries = value(s, sm.COLLECTOR_SCRAPES.name, target=source.url, outcome="up")
    assert queries >= 1 and value(s, f"{sm.COLLECTOR_SCRAPE_DURATION}_count") == queries
    assert value(s, sm.COLLECTOR_WINDOWS_WRITTEN.name) == stats.windows_written > 0
    assert value(s, sm.COLLECTOR_TICKS.name) == 2
    assert value(s, sm.COLLECTOR_TARGET_UP.name, target=source.url) == 1


# --------------------------------------------------------------------------- serving


@pytest.mark.parametrize(
    ("text", "expected"),
    [("127.0.0.1:9464", ("127.0.0.1", 9464)), ("[::1]:9464", ("::1", 9464)),
     ("localhost:0", ("localhost", 0)), (" 0.0.0.0:80 ", ("0.0.0.0", 80))],
)  # fmt: skip
def test_parse_listen_addr_host_port_gives_pair(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen_addr(text) == expected


@pytest.mark.parametrize("text", ["9464", ":9464", "host:", "host:port", "h:70000", "[]:1", ""])
def test_parse_listen_addr_malformed_raises_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="is not HOST:PORT"):
        parse_listen_addr(text, "--x")


def _get(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.status, resp.headers["Content-Type"], resp.read().decode()


def test_serve_metrics_real_http_serves_registry_then_releases_port() -> None:
    h = CollectorHealth(version="1", cluster="c", mode="direct", targets=["a"])
    port = free_port()
    with serve_metrics(f"127.0.0.1:{port}", h.registry) as server:
        assert server.url == f"http://127.0.0.1:{port}/metrics"
        status, ctype, body = _get(server.url)
        assert status == 200 and ctype.startswith("text/plain")
        assert value(parse(body), sm.COLLECTOR_TARGETS.name) == 1
    with pytest.raises(urllib.error.URLError):
        _get(f"http://127.0.0.1:{port}/metrics")
    with socket.socket() as sock:  # the port is free again for the next server
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen()


def _status(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_serve_metrics_healthz_follows_the_check_and_metrics_stay_served() -> None:
    h = CollectorHealth(version="1", cluster="c", mode="direct", targets=["a"])
    verdict = [(True, "ok: fine")]
    with serve_metrics(f"127.0.0.1:{free_port()}", h.registry, check=lambda: verdict[0]) as srv:
        base = srv.url.removesuffix("/metrics")
        assert _status(base + "/healthz") == (200, "ok: fine\n")
        verdict[0] = (False, "stale: no")
        assert _status(base + "/healthz") == (503, "stale: no\n")
        status, body = _status(srv.url)  # the exposition is unaffected
        assert status == 200 and sm.COLLECTOR_TARGETS.name in body
    # without a check /healthz is just another path of the exposition, as before
    with serve_metrics(f"127.0.0.1:{free_port()}", h.registry) as srv:
        status, body = _status(srv.url.removesuffix("/metrics") + "/healthz")
        assert status == 200 and sm.COLLECTOR_TARGETS.name in body


def test_serve_metrics_ipv6_loopback_serves_healthz() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    h = CollectorHealth(version="1", cluster="c", mode="direct", stale_after_s=60.0)
    try:
        srv = serve_metrics(f"[::1]:{free_port()}", h.registry, check=h.alive)
    except ConfigError as exc:
        pytest.skip(f"::1 not bindable here: {exc}")
    with srv:
        assert srv.url.startswith("http://[::1]:")
        assert _status(srv.url.removesuffix("/metrics") + "/healthz")[0] == 200


@pytest.mark.parametrize(
    ("beats", "now", "alive", "text"),
    [
        ([], 100.0, True, "ok: nothing scraped yet, started 100 s ago"),
        ([], 301.0, False, "stale: nothing scraped yet, started 301 s ago (limit 300 s)"),
        (["scrape@250"], 500.0, True, "ok: last scrape or tick 250 s ago"),
        (["tick@100"], 401.0, False, "stale: last scrape or tick 301 s ago (limit 300 s)"),
        (["tick@100", "scrape@390"], 401.0, True, "ok: last scrape or tick 11 s ago"),
    ],
)
def test_collector_health_alive_after_stale_after_s_without_a_scrape_or_tick(
    beats: list[str], now: float, alive: bool, text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [0.0]
    monkeypatch.setattr("collector.health.time.monotonic", lambda: clock[0])
    h = CollectorHealth(version="1", cluster="c", mode="direct", stale_after_s=300.0)
    ticks = 0
    for beat in beats:
        kind, at = beat.split("@")
        clock[0] = float(at)
        if kind == "scrape":
            h.scraped("a", "connection_refused", 0.1)  # a failed scrape still proves the loop
        else:
            ticks += 1
            h.ticked(_Stats(ticks=ticks, store_errors=ticks))  # a tick with a store error too
    assert h.alive(now) == (alive, text)
    assert CollectorHealth(version="1", cluster="c", mode="d").alive(1e9)[0]  # no bound


def test_serve_metrics_port_in_use_raises_config_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        addr = f"127.0.0.1:{busy.getsockname()[1]}"
        with pytest.raises(ConfigError, match=rf"--m {re.escape(addr)}: cannot listen"):
            serve_metrics(addr, CollectorHealth(version="1", cluster="c", mode="d").registry,
                          what="--m")  # fmt: skip


@pytest.mark.skipif(not PROMTOOL.exists(), reason="promtool not installed")
def test_expositions_pass_promtool_lint(two_plans: Store) -> None:
    h = CollectorHealth(version="0.1.0", cluster="c", mode="direct", targets=["a", "b"])
    h.scraped("a", "up", 0.01)
    h.scraped("b", "connect", 0.5)
    h.ticked(_Stats(ticks=1, windows_written=3), at=NOW)
    coverage = {("prod-a", ""): (0.82, 0.9)}
    for text in (render_plan_metrics(two_plans, now=NOW, coverage=coverage), h.render()):
        proc = subprocess.run(
            [str(PROMTOOL), "check", "metrics"], input=text, capture_output=True, timeout=30,
            check=False,
        )  # fmt: skip
        assert proc.returncode == 0 and proc.stdout == proc.stderr == b"", (proc, text.decode())


# --------------------------------------------------------------------------- names


def test_metric_names_follow_prometheus_naming() -> None:
    names = [m.name for m in sm.ALL_METRICS]
    assert len(names) == len(set(names))
    units = {"seconds": "_seconds", "seconds since the epoch": "_timestamp_seconds",
             "KV tokens": "_tokens"}  # fmt: skip
    for m in sm.ALL_METRICS:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", m.name) and ":" not in m.name, m.name
        assert m.name.startswith(f"{sm.NAMESPACE}_"), m.name
        assert m.name.endswith("_total") == (m.type == "counter"), m.name
        assert m.name.endswith("_info") == (m.unit == "1"), m.name
        assert m.name.endswith("_ratio") == m.unit.startswith("ratio"), m.name
        if m.unit in units:
            assert m.name.endswith(units[m.unit]), m.name
        assert len(m.labels) == len(set(m.labels)) and m.help.endswith("."), m.name
        # cluster first (planner), target (collector), route (the API's requests)
        assert m.labels[:1] in ((), ("cluster",), ("target",), ("route",), ("version",)), m.name


def _metric_like(token: str) -> bool:
    """A kvscope_ token that names (or would name) a metric, not an identifier such as a
    staging table or a label: one of ours with its series suffixes, a name in one of our
    metric families, or a name with a Prometheus unit/type suffix. A token ending in "_" is
    a prefix (``…_plan_*`` in prose), not a name."""
    if token.endswith("_"):
        return False
    ours = {n for m in sm.ALL_METRICS for n in (*m.series_names, m.name)}
    ours |= {m.name.removesuffix("_total") + "_created" for m in sm.ALL_METRICS}
    families = {"_".join(m.name.split("_")[:2]) + "_" for m in sm.ALL_METRICS}
    suffixes = ("_total", "_seconds", "_bytes", "_ratio", "_info", "_tokens", "_bucket",
                "_count", "_sum", "_created")  # fmt: skip
    return token in ours or token.startswith(tuple(families)) or token.endswith(suffixes)


# Files generated from collector/selfmetrics.py (dashboards, rules, and both as Kubernetes
# objects): they spell the names it gave them; their generators import the constants and
# their --check keeps them in step.
GENERATED = tuple(f"{d.as_posix()}/" for d in (DASHBOARD_DIR, RULES_DIR, K8S_DIR))
SKIP_DIRS = {"__pycache__", "node_modules", "build", "dist"}
TOKEN = re.compile(rf"(?<![A-Za-z0-9_]){sm.NAMESPACE}_[a-z_]+")
BLOCK = re.compile(re.escape(sm.TABLE_BEGIN) + ".*?" + re.escape(sm.TABLE_END), re.DOTALL)


def _tree() -> Iterator[Path]:
    """Our .py/.yaml/.yml/.json/.md files: not hidden directories (.venv, .git), caches,
    build output or ./out (make demo's)."""
    for top, dirs, files in os.walk(ROOT):
        here = Path(top)
        dirs[:] = sorted(
            d for d in dirs
            if not (d.startswith(".") or d in SKIP_DIRS or d.endswith(".egg-info")
                    or (here == ROOT and d == "out"))
        )  # fmt: skip
        for name in sorted(files):
            if name.endswith((".py", ".yaml", ".yml", ".json", ".md")):
                yield here / name


def test_metric_names_spelled_only_in_selfmetrics() -> None:
    module = Path(sm.__file__).resolve()
    stray: list[str] = []
    for path in _tree():
        rel = path.relative_to(ROOT).as_posix()
        if path.resolve() == module or rel.startswith(GENERATED):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if path.suffix == ".md":  # the generated table is the module's own words
            text = BLOCK.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        for n, line in enumerate(text.splitlines(), 1):
            stray += [f"{rel}:{n}: {t}" for t in TOKEN.findall(line) if _metric_like(t)]
    assert stray == [], "spell kvscope_ metric names only in collector/selfmetrics.py " \
        "(import its constants):\n" + "\n".join(stray)  # fmt: skip


def test_metric_names_check_finds_a_stray_spelling() -> None:
    name = sm.PLAN_AGE.name
    assert TOKEN.findall(f'q = "max({name}) > 3600"') == [name] and _metric_like(name)
    identifiers = [f"{sm.NAMESPACE}_{s}" for s in ("windows_in", "write", "stat")]
    assert not any(_metric_like(t) for t in identifiers)  # the store's and PromQL's own
    assert TOKEN.findall(f"test_{name}") == []
    assert not _metric_like(name.removesuffix("age_seconds"))  # a family's prefix in prose


def test_readme_metrics_table_is_the_modules() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found = BLOCK.search(readme)
    assert found is not None, "README.md has no generated metrics table"
    table = found.group(0).removeprefix(sm.TABLE_BEGIN).removesuffix(sm.TABLE_END).strip("\n")
    assert table + "\n" == sm.markdown_table(), (
        "README.md's metrics table is stale: replace it with `python -m collector.selfmetrics`"
    )
    rows = {line.split("|")[1].strip().strip("`") for line in table.splitlines()[2:]}
    assert rows == {m.name for m in sm.ALL_METRICS}


def test_metric_selector_known_labels_gives_promql() -> None:
    assert sm.PLAN_AGE.selector(cluster="a") == f'{sm.PLAN_AGE}{{cluster="a"}}'
    assert sm.COLLECTOR_TICKS.selector() == str(sm.COLLECTOR_TICKS)
    with pytest.raises(ConfigError, match="no label"):
        sm.PLAN_AGE.selector(pod="x")
