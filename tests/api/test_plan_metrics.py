"""api.plan_metrics: the plan gauges of GET /metrics read from a real store (SQLite, and
PostgreSQL for the latest-plan query), and promtool's lint of their exposition."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from api.plan_metrics import PlanCollector, render_plan_metrics
from core import kvscope_metrics as sm
from planner.decide.evidence import MODES
from store.store import Store
from store.tables import PLAN_HEADLINE, PlanRecord
from tests.samples import PROMTOOL, Series, assert_promtool_clean, labelsets, parse, value
from tests.tierdoc import CANNOT, SECTION, section

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "metrics" / "vllm-0.33.0-metrics-default.txt"
NOW = 1_764_000_000.0
# the offload section of a plan (planner/plan/verdict.py): native measured, lmcache cannot tell
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
    registry = CollectorRegistry(auto_describe=True)
    registry.register(PlanCollector(store, coverage=lambda: None, clock=lambda: NOW))
    assert generate_latest(registry) == b""
    store.save_plan(plan("c", "", NOW - 5, "none", {}))
    assert value(parse(generate_latest(registry)), sm.PLAN_AGE.name, cluster="c") == 5.0


def test_plan_modes_equal_the_planners() -> None:
    assert tuple(MODES) == sm.PLAN_MODES


@pytest.mark.skipif(not PROMTOOL.exists(), reason="promtool not installed")
def test_plan_exposition_passes_promtool_lint(two_plans: Store) -> None:
    text = render_plan_metrics(two_plans, now=NOW, coverage={("prod-a", ""): (0.82, 0.9)})
    assert_promtool_clean(text)
