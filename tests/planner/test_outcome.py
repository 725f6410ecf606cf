"""The closed loop (planner/plan/outcome.py) on stores whose later windows are known.

Two engines of 1000 blocks × 16 tokens (capacity 32,000 KV tokens) report their KV-cache
use every minute for two hours: 0.5 in the first hour (the history the plans were made on);
in the second, cluster ``steady`` stays at 0.5 while cluster ``jump`` stays at 0.5 for half
an hour and then runs full (1.0). The plans are hand-made records whose forecast bands and
saturation bounds are chosen so that every score is known in advance.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import fields, replace
from types import SimpleNamespace
from typing import Any

import pytest

from core.records import Window
from planner.decide.evidence import CapacityEvidence, Evidence, ValueCI
from planner.plan import CapacityCheck, PlanOutcome, accuracy_summary, score_plans
from planner.plan.outcome import _capacity_checks, wilson
from store.store import Store
from store.tables import PlanRecord

T0 = 1_764_000_000.0 // 3600 * 3600  # UTC-aligned, so 5-min buckets start on the hour
SPLIT = T0 + 3600  # end of the plans' history, start of what they are scored on
END = T0 + 7200
CAP = 2 * 1000 * 16.0
CADENCE = 300.0
NOW = END + 60
JUMP_AT = SPLIT + 1800  # cluster jump runs full from here


def usage(cluster: str, t: float) -> float:
    return 1.0 if cluster == "jump" and t >= JUMP_AT else 0.5


def kv_window(source: str, start: float, use: float) -> Window:
    labels = (("engine", "0"),)
    return Window(
        source, "kv_cache_usage_ratio", labels, start, 60.0, "gauge", 4, mean=use, max=use
    )


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    windows = [
        kv_window(f"{c}-{e}", t, usage(c, t))
        for c in ("steady", "jump")
        for e in range(2)
        for t in (T0 + 60.0 * m for m in range(120))
    ]
    with Store(db_url) as s:
        s.migrate()
        s.write_windows(windows)
        for c in ("steady", "jump"):
            for e in range(2):
                s.upsert_engine(c, f"{c}-{e}", model="llama-3.1-8b", gpu="h100",
                                tensor_parallel=1, offload="none",
                                facts={"num_gpu_blocks": 1000, "block_size": 16})  # fmt: skip
        yield s


def plan(
    cluster: str,
    lo: float,
    hi: float,
    *,
    sat: tuple[float | None, float | None] = (None, None),
    key: int = 0,
    until: float = SPLIT,
) -> PlanRecord:
    """A plan of ``cluster`` made on the history up to ``until``: every forecast bucket of the
    next hour predicts [lo, hi] × capacity; ``sat`` = (earliest, latest) saturation after
    the origin (None: not within the horizon); ``key`` makes the window range unique."""
    points = [[until + CADENCE * i, (lo + hi) / 2 * CAP, lo * CAP, hi * CAP] for i in range(12)]
    kv = {
        "points": points,
        "cadence_s": CADENCE,
        "level": 0.9,
        "origin_epoch": until,
        "capacity_total": CAP,
        "unit": "KV tokens",
        "time_to_saturation_s": sat[0],
        "time_to_saturation_lo_s": sat[0],
        "time_to_saturation_hi_s": sat[1],
    }
    return PlanRecord(cluster, "", until, T0 + key, until, 3600.0, "test", "none",
                      {"forecast": {"kv_demand": kv, "horizon_s": 3600.0}})  # fmt: skip


def scored(store: Store, *records: PlanRecord, now: float = NOW) -> dict[int, PlanOutcome]:
    ids = [store.save_plan(r) for r in records]
    by_id = {o.plan_id: o for o in score_plans(store, now=now)}
    return {i: by_id[i] for i in ids}


def test_score_plans_band_holding_every_later_point_covers_all(store: Store) -> None:
    (o,) = scored(store, plan("steady", 0.4, 0.6)).values()
    assert (o.kv_points, o.kv_covered, o.coverage) == (12, 12, 1.0)
    assert o.level == 0.9 and not o.pending and o.horizon_end == END
    assert (o.saturation, o.saturated_at) == ("not_reached_as_predicted", None)
    assert o.capacity == ()


def test_score_plans_demand_jumping_above_the_band_covers_nothing(store: Store) -> None:
    low, wide, early, late = scored(
        store,
        plan("jump", 0.2, 0.3),  # 0.5 then 1.0: above the band at every bucket
        plan("jump", 0.4, 0.6, key=1),  # holds the first half hour only
        plan("jump", 0.9, 1.1, sat=(3000.0, 3500.0), key=2),  # predicted in 50-58 min
        plan("jump", 0.9, 1.1, sat=(300.0, 900.0), key=3),  # predicted in 5-15 min
    ).values()
    full_at = JUMP_AT + CADENCE / 2  # the first full bucket's midpoint
    assert (low.kv_points, low.kv_covered, low.coverage) == (12, 0, 0.0)
    assert (low.saturation, low.saturated_at) == ("reached_unpredicted", full_at)
    assert (wide.kv_covered, wide.coverage) == (6, 0.5)
    assert (early.saturation, early.saturated_at) == ("earlier", full_at)
    assert late.saturation == "later"


def test_score_plans_saturation_inside_the_bounds_as_predicted(store: Store) -> None:
    reached, steady_open, steady_missed = scored(
        store,
        plan("jump", 0.9, 1.1, sat=(1500.0, 2400.0)),  # full at 1950 s after the origin
        plan("steady", 0.4, 0.6, sat=(600.0, None)),  # upper bound only: may be after
        plan("steady", 0.4, 0.6, sat=(600.0, 1200.0), key=1),  # surely by 20 min: was not
    ).values()
    assert reached.saturation == "as_predicted"
    assert reached.saturated_at == pytest.approx(SPLIT + 1950.0)
    assert (steady_open.saturation, steady_open.saturated_at) == ("as_predicted", None)
    assert steady_missed.saturation == "later"


def test_score_plans_horizon_not_passed_is_pending(store: Store) -> None:
    done, waiting = scored(
        store,
        plan("steady", 0.4, 0.6),
        plan("steady", 0.4, 0.6, until=SPLIT + 1800),  # its hour ends 29 min after NOW
    ).values()
    assert not done.pending and done.coverage == 1.0
    assert waiting.pending and (waiting.kv_points, waiting.coverage) == (0, None)
    assert (waiting.saturation, waiting.capacity) == ("unknown", ())
    summary = accuracy_summary(list(score_plans(store, now=NOW)))
    assert (summary["plans"], summary["scored"], summary["pending"]) == (2, 1, 1)
    assert summary["kv_demand"]["points"] == 12 and summary["kv_demand"]["coverage"] == 1.0
    assert summary["saturation"]["not_reached_as_predicted"] == 1
    # once its horizon has passed, the same plan is scored
    later = {o.plan_id: o for o in score_plans(store, now=SPLIT + 5400)}
    assert not later[waiting.plan_id].pending and later[waiting.plan_id].kv_points == 6


def test_score_plans_no_later_windows_unknown(store: Store) -> None:
    (o,) = scored(store, plan("steady", 0.4, 0.6, until=END), now=END + 7200).values()
    assert (o.kv_points, o.coverage, o.saturation, o.pending) == (0, None, "unknown", False)


def test_score_plans_one_cluster_only(store: Store) -> None:
    store.save_plan(plan("steady", 0.4, 0.6))
    store.save_plan(plan("jump", 0.4, 0.6))
    assert {o.cluster for o in score_plans(store, "jump", now=NOW)} == {"jump"}


# --------------------------------------------------------------------------- capacity


def capacity_plan(**headline: float | None) -> PlanRecord:
    return PlanRecord("c", "", T0, T0 - 7200, T0, 7200.0, "test", "none", {}, headline)


def later_with(**capacity: CapacityEvidence) -> Any:
    """What _capacity_checks reads of a later plan: its evidence."""
    ev = Evidence(native_capacity=capacity.get("native_capacity"),
                  lmcache_capacity=capacity.get("lmcache_capacity"))  # fmt: skip
    return SimpleNamespace(evidence=ev)


@pytest.mark.parametrize(
    ("headline", "later", "expected"),
    [
        # two-sided interval, the later estimate inside
        ({"capacity_native": 1.2, "capacity_native_lo": 1.1, "capacity_native_hi": 1.3},
         {"native_capacity": CapacityEvidence(True, ValueCI(1.25, 1.1, 1.4))},
         [("native", 1.25, True)]),
        # the later estimate outside
        ({"capacity_native": 1.2, "capacity_native_lo": 1.1, "capacity_native_hi": 1.3},
         {"native_capacity": CapacityEvidence(True, ValueCI(1.5, 1.4, 1.6))},
         [("native", 1.5, False)]),
        # a lower bound (hi None) holds any later estimate above it
        ({"capacity_lmcache": 1.2, "capacity_lmcache_lo": 1.1, "capacity_lmcache_hi": None},
         {"lmcache_capacity": CapacityEvidence(True, ValueCI(2.0, 1.8, 2.2))},
         [("lmcache", 2.0, True)]),
        # the later plan gives only a bound: nothing measured
        ({"capacity_native": 1.2, "capacity_native_lo": 1.1, "capacity_native_hi": 1.3},
         {"native_capacity": CapacityEvidence(True, ValueCI(1.3, 1.2, 1.3), lower_bound=True)},
         [("native", None, None)]),
        # the later plan cannot tell
        ({"capacity_native": 1.2, "capacity_native_lo": 1.1, "capacity_native_hi": 1.3},
         {"native_capacity": CapacityEvidence(False, why="1 unit")},
         [("native", None, None)]),
        # the plan gave no interval: nothing to check
        ({"capacity_native": None}, {}, []),
    ],
)  # fmt: skip
def test_capacity_checks_later_estimate_against_stored_interval(
    headline: dict[str, float | None],
    later: dict[str, CapacityEvidence],
    expected: list[tuple[str, float | None, bool | None]],
) -> None:
    checks = _capacity_checks(capacity_plan(**headline), later_with(**later))
    assert [(c.mode, c.measured, c.inside) for c in checks] == expected


# --------------------------------------------------------------------------- the summary


def outcome(
    points: int,
    covered: int,
    saturation: str = "as_predicted",
    gains: Sequence[CapacityCheck] = (),
) -> PlanOutcome:
    return PlanOutcome(1, "c", "", T0, END, 0.9, points, covered,
                       covered / points if points else None, saturation, None,
                       tuple(gains))  # fmt: skip


def test_wilson_known_values() -> None:
    none, every = wilson(0, 10), wilson(10, 10)
    assert none == pytest.approx((0.0, 0.2775), abs=1e-4) and none is not None and none[0] == 0
    assert every == pytest.approx((0.7225, 1.0), abs=1e-4) and every is not None and every[1] == 1
    assert wilson(45, 50) == pytest.approx((0.7864, 0.9565), abs=1e-4)
    assert wilson(0, 0) is None


def test_accuracy_summary_pools_points_verdicts_and_gains() -> None:
    inside = CapacityCheck("native", 0.1, 0.0, 0.2, 0.15, True)
    outside = CapacityCheck("lmcache", 0.1, 0.0, 0.2, 0.35, False)
    blind = CapacityCheck("native", 0.1, 0.0, 0.2, None, None)
    pending = replace(outcome(0, 0, "unknown"), pending=True)
    s = accuracy_summary([outcome(30, 30, gains=[inside, blind]), outcome(20, 15, "earlier",
                          gains=[outside]), outcome(0, 0, "unknown"), pending])  # fmt: skip
    assert (s["plans"], s["scored"], s["pending"]) == (4, 3, 1)
    kv = s["kv_demand"]
    assert (kv["plans"], kv["points"], kv["covered"], kv["coverage"]) == (2, 50, 45, 0.9)
    assert (kv["interval"]["lo"], kv["interval"]["hi"]) == pytest.approx((0.7864, 0.9565), abs=1e-4)
    assert kv["nominal"] == pytest.approx(0.9) and kv["nominal_inside"] is True
    assert s["saturation"] == {"as_predicted": 1, "earlier": 1, "later": 0,
                               "not_reached_as_predicted": 0, "reached_unpredicted": 0,
                               "unknown": 1}  # fmt: skip
    g = s["capacity"]
    assert (g["checks"], g["inside"], g["outside"], g["cannot_tell"]) == (3, 1, 1, 1)
    assert g["share"] == 0.5
    assert g["by_mode"]["native"]["inside"] == 1 and g["by_mode"]["lmcache"]["outside"] == 1


def test_accuracy_summary_nothing_scored_has_no_coverage() -> None:
    s = accuracy_summary([])
    assert s["kv_demand"]["coverage"] is None and s["kv_demand"]["interval"] is None
    assert s["plans"] == s["scored"] == s["pending"] == 0


def test_plan_outcome_to_dict_json_ready() -> None:
    d = outcome(10, 9, gains=[CapacityCheck("native", 0.1, 0.0, 0.2, math.nan, None)]).to_dict()
    assert d["capacity"] == [{"mode": "native", "predicted": 0.1, "lo": 0.0, "hi": 0.2,
                           "measured": None, "inside": None}]  # fmt: skip
    assert d["coverage"] == 0.9 and d["pending"] is False
    assert set(d) >= {f.name for f in fields(PlanOutcome)}
