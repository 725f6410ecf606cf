"""Stored plans (store/plans.py) on a real SQLite file and a real PostgreSQL 15."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from core.errors import ConfigError
from store.store import Store
from store.tables import PLAN_HEADLINE, PlanRecord

T0 = 1_764_000_000.0


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    with Store(db_url) as s:
        s.migrate()
        yield s


def rec(
    cluster: str = "prod",
    group: str = "",
    *,
    created: float = T0,
    start: float = T0 - 3600,
    **headline: float | None,
) -> PlanRecord:
    return PlanRecord(
        cluster=cluster,
        group=group,
        created_at=created,
        window_from=start,
        window_until=start + 3600,
        horizon_s=7200.0,
        version="0.1.0",
        mode="native",
        document={"decision": {"mode": "native"}, "forecast": {"horizon_s": 7200.0}},
        headline=headline,
    )


def test_save_plan_same_window_twice_one_row_values_replaced(store: Store) -> None:
    first = store.save_plan(rec(score=0.5, kv_capacity=1e6))
    changed = replace(
        rec(created=T0 + 60, score=0.7),
        mode="lmcache",
        version="0.2.0",
        document={"decision": {"mode": "lmcache"}},
    )
    again = store.save_plan(changed)
    assert again == first
    (only,) = store.plans()
    assert only.id == first and only.created_at == T0 + 60
    assert (only.mode, only.version) == ("lmcache", "0.2.0")
    assert only.document == {"decision": {"mode": "lmcache"}}
    assert only.headline["score"] == 0.7
    assert only.headline["kv_capacity"] is None  # replaced by the new plan's (unknown) figure
    assert set(only.headline) == set(PLAN_HEADLINE)


def test_save_plan_other_window_or_group_adds_a_row(store: Store) -> None:
    ids = {
        store.save_plan(rec()),
        store.save_plan(rec(start=T0)),  # a later history
        store.save_plan(rec(group="llama@h100:tp1")),
        store.save_plan(rec(cluster="other")),
    }
    assert len(ids) == 4 and len(store.plans()) == 4


def test_plans_newest_first_by_created_then_id(store: Store) -> None:
    a = store.save_plan(rec(created=T0 + 10, start=T0))
    b = store.save_plan(rec(created=T0 + 30, start=T0 + 10))
    c = store.save_plan(rec(created=T0 + 20, start=T0 + 20))
    d = store.save_plan(rec(created=T0 + 30, start=T0 + 30))  # ties b: the later id first
    assert [p.id for p in store.plans()] == [d, b, c, a]
    assert [p.id for p in store.plans(limit=2)] == [d, b]
    latest = store.latest_plan("prod")
    assert latest is not None and latest.id == d


def test_plans_since_group_and_cluster_filters(store: Store) -> None:
    old = store.save_plan(rec(created=T0))
    new = store.save_plan(rec(created=T0 + 100, start=T0))
    grouped = store.save_plan(rec(group="g1", created=T0 + 50))
    other = store.save_plan(rec(cluster="east", created=T0 + 200))
    assert [p.id for p in store.plans(since=T0 + 100)] == [other, new]
    assert [p.id for p in store.plans("prod", "")] == [new, old]
    assert [p.id for p in store.plans("prod", "g1")] == [grouped]
    assert [p.id for p in store.plans("prod")] == [new, grouped, old]
    assert [p.id for p in store.plans(group="g1", since=T0 + 60)] == []
    assert store.plans("nowhere") == []
    latest = store.latest_plan("prod", "g1")
    assert latest is not None and latest.id == grouped
    assert store.latest_plan("prod", "g2") is None


@pytest.mark.parametrize(
    ("headline", "match"),
    [
        ({"scroe": 0.5}, "unknown field(s) scroe"),
        ({"score": "high"}, "'score' must be a number or None, got 'high'"),
        ({"p_saturation": True}, "'p_saturation' must be a number or None, got True"),
    ],
)
def test_save_plan_bad_headline_refused_naming_it(
    store: Store, headline: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigError, match=match.replace("(", r"\(").replace(")", r"\)")):
        store.save_plan(replace(rec(), headline=headline))
    assert store.plans() == []


def test_save_plan_window_from_after_until_refused(store: Store) -> None:
    bad = replace(rec(), window_from=T0 + 10, window_until=T0)
    with pytest.raises(ConfigError, match="plan window: from"):
        store.save_plan(bad)


def test_save_plan_non_finite_headline_stored_as_unknown(store: Store) -> None:
    store.save_plan(rec(score=float("nan"), forecast_peak=float("inf"), kv_capacity=2.5e6))
    (p,) = store.plans()
    assert p.headline["score"] is None and p.headline["forecast_peak"] is None
    assert p.headline["kv_capacity"] == 2.5e6


def test_plans_limit_below_one_refused(store: Store) -> None:
    with pytest.raises(ConfigError, match="limit must be >= 1"):
        store.plans(limit=0)


def test_clusters_every_registered_cluster_by_name(store: Store) -> None:
    assert store.clusters() == []
    store.save_plan(rec(cluster="west"))
    store.upsert_engine("east", "e0", offload="none")
    store.save_plan(rec(cluster="west", group="g"))
    assert store.clusters() == ["east", "west"]
