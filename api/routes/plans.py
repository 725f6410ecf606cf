"""Stored plans: the latest (with its age), the history, its forecast, the closed loop.

Plans are made by `kvscope plan --save` (or its schedule) and kept in the store's plans
table; these routes only read them. The closed loop (``accuracy``) scores every plan whose
horizon has passed against the windows that arrived later (planner.plan's score_plans).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response

from api.deps import Cluster, State, StoreDep, cached_heavy, duration_s, require_read
from api.error_responses import ApiError, responses
from api.respond import dumps, json_ok
from api.schemas import (
    DURATION_PATTERN,
    AccuracyOut,
    CpuTierOut,
    ForecastOut,
    OffloadOut,
    PlanOut,
    PlansOut,
)
from store.store import Store
from store.tables import PlanRecord

router = APIRouter(prefix="/v1", tags=["plans"], dependencies=[Depends(require_read)])
_ERRORS = responses(400, 401, 404, 422, 503)

GroupQuery = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=500,
        description="a model group (model@gpu:tpN, as the plan names them); default: the "
        "whole-cluster plan",
        examples=["llama-3.1-8b@h100:tp1"],
    ),
]


def summary(plan: PlanRecord, now: float) -> dict[str, Any]:
    """A stored plan without its document: identity, age, window, mode, headline figures."""
    return {
        "id": plan.id,
        "cluster": plan.cluster,
        "group": plan.group,
        "created_at": plan.created_at,
        "age_s": max(0.0, now - plan.created_at),
        "window_from": plan.window_from,
        "window_until": plan.window_until,
        "horizon_s": plan.horizon_s,
        "version": plan.version,
        "mode": plan.mode,
        "headline": dict(plan.headline),
    }


def latest(store: Store, cluster: str, group: str | None, *, document: bool = True) -> PlanRecord:
    plan = store.latest_plan(cluster, group or "", document=document)
    if plan is None:
        what = f"group {group!r} of cluster {cluster!r}" if group else f"cluster {cluster!r}"
        raise ApiError(
            404,
            f"no stored plan for {what}: run `kvscope plan --save`",
            "group" if group else "cluster",
        )
    return plan


@router.get("/clusters/{cluster}/plan", response_model=PlanOut, responses=_ERRORS)
def plan(cluster: Cluster, store: StoreDep, state: State, group: GroupQuery = None) -> Response:
    """The latest stored plan (the `kvscope plan --json` document) and its age."""
    record = latest(store, cluster, group, document=False)
    assert record.id is not None
    doc = state.plan_document(record.id, record.created_at)
    if doc is None:  # replaced between the two reads: read it whole
        record = latest(store, cluster, group)
        return json_ok({**summary(record, time.time()), "document": dict(record.document)})
    head = dumps(summary(record, time.time()))
    return Response(head[:-1] + b',"document":' + doc + b"}", media_type="application/json")


@router.get("/clusters/{cluster}/plans", response_model=PlansOut, responses=_ERRORS)
def plans(
    cluster: Cluster,
    store: StoreDep,
    since: Annotated[
        str | None,
        Query(
            pattern=DURATION_PATTERN,
            max_length=5,
            description="only plans made in this period (default: all)",
            examples=["7d"],
        ),
    ] = None,
    group: Annotated[
        str | None,
        Query(
            max_length=500,
            description='only this group ("" = whole-cluster plans; default: every group)',
            examples=[""],
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000, examples=[100])] = 100,
) -> Response:
    """The plan history, newest first, with each plan's headline figures."""
    now = time.time()
    since_s = duration_s(since) if since is not None else None
    records = store.plans(
        cluster, group, since=None if since_s is None else now - since_s, limit=limit
    )
    return json_ok(
        {
            "cluster": cluster,
            "group": group,
            "since_s": since_s,
            "plans": [summary(r, now) for r in records],
        }
    )


def _section(store: Store, cluster: str, group: str | None, name: str) -> Response:
    """One section of the latest plan's document, with the plan's identity and age."""
    record = latest(store, cluster, group)
    section = record.document.get(name)
    return json_ok(
        {
            "cluster": cluster,
            "group": record.group,
            "plan_id": record.id,
            "created_at": record.created_at,
            "age_s": max(0.0, time.time() - record.created_at),
            name: dict(section) if isinstance(section, dict) else {},
        }
    )


@router.get("/clusters/{cluster}/forecast", response_model=ForecastOut, responses=_ERRORS)
def forecast(cluster: Cluster, store: StoreDep, group: GroupQuery = None) -> Response:
    """The latest plan's forecast: KV demand against HBM capacity, time to saturation."""
    return _section(store, cluster, group, "forecast")


@router.get("/clusters/{cluster}/offload", response_model=OffloadOut, responses=_ERRORS)
def offload(cluster: Cluster, store: StoreDep, group: GroupQuery = None) -> Response:
    """The latest plan's offload verdict per mode: today's effects (TTFT, E2E, preemptions
    at the load each engine carried), capacity at the SLO against no offload, the bill
    (engines and GPU-hours a day at the forecast peak), each with its interval and the
    engines or LMCache pools behind it; the experiment that would settle a mode that cannot
    tell. Empty for a plan made per model group: ask for a group."""
    return _section(store, cluster, group, "offload")


@router.get("/clusters/{cluster}/cpu-tier", response_model=CpuTierOut, responses=_ERRORS)
def cpu_tier(cluster: Cluster, store: StoreDep, group: GroupQuery = None) -> Response:
    """What a CPU tier would buy, from the latest plan: per tier (vLLM native offload per
    engine, an LMCache L1 pool per node) and size (0.5×–4× the HBM KV size, and the
    recommended one) the prefix-cache hit ratio, the re-prefill it avoids and the modelled
    capacity at the SLO, each with a model-based interval (not a confidence interval), and the
    hit-ratio curve; modelled from vLLM's KV residency histograms (``--kv-cache-metrics``).
    Empty for a plan older than the section, or made per model group: ask for a group."""
    return _section(store, cluster, group, "cpu_tier")


def coverage_of(outcomes: Sequence[Any]) -> dict[tuple[str, str], tuple[float, float]]:
    """(realised, nominal) KV-demand coverage per (cluster, group) of scored outcomes, pooled
    over their points (api.plan_metrics.Coverage, for /metrics)."""
    points: dict[tuple[str, str], list[float]] = {}
    for o in outcomes:
        if o.pending or o.kv_points <= 0:
            continue
        acc = points.setdefault((o.cluster, o.group), [0.0, 0.0, 0.0])
        acc[0] += o.kv_covered
        acc[1] += o.kv_points
        acc[2] += o.level * o.kv_points
    return {key: (c / n, lv / n) for key, (c, n, lv) in points.items()}


@router.get(
    "/clusters/{cluster}/accuracy",
    response_model=AccuracyOut,
    responses=responses(400, 401, 404, 422, 429, 503),
)
async def accuracy(cluster: Cluster, store: StoreDep, state: State) -> Response:
    """The closed loop: each past plan whose horizon has passed, scored against the windows
    that came after it (forecast coverage, saturation, capacity ratios), and their summary. Scoring
    re-plans the later windows, so it runs on the heavy-work pool (the same answer for
    cache_ttl_s)."""
    from planner.plan import accuracy_summary, score_plans  # noqa: PLC0415 - start-up: planner.plan (numpy, pandas: ~0.3 s) loads on the first request, not on the API's start-up

    def work() -> dict[str, Any]:
        outcomes = score_plans(store, cluster)
        state.remember_coverage(cluster, coverage_of(outcomes))
        return {
            "cluster": cluster,
            "summary": accuracy_summary(outcomes),
            "outcomes": [o.to_dict() for o in outcomes],
        }

    return json_ok(await cached_heavy(state, f"accuracy\x00{cluster}", work, "plan scoring"))
