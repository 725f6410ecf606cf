"""The planner gauges of core.kvscope_metrics (``PLAN_METRICS``) read from a store: the
latest stored plan of every (cluster, group) — group "" is the whole-cluster plan — plus the
closed loop's realised forecast coverage, which the caller passes in (collector does not
import the planner).

- :func:`render_plan_metrics` gives the text exposition;
- :class:`PlanCollector` is the same as a prometheus_client collector for a registry of the
  caller's; :func:`plan_families` the metric families both are made of.

A plan figure that is None gives no series (never NaN).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from core.kvscope_metrics import (
    BOUNDS,
    GAIN_MODES,
    PLAN_AGE,
    PLAN_BREAKEVEN_KV_USAGE,
    PLAN_CAPACITY_RATIO,
    PLAN_CPU_TIER_AVOIDED_PREFILL,
    PLAN_CPU_TIER_CAPACITY_RATIO,
    PLAN_CPU_TIER_EXTRA_HIT_RATIO,
    PLAN_CPU_TIER_EXTRAPOLATED,
    PLAN_CPU_TIER_RECOMMENDED,
    PLAN_CREATED,
    PLAN_DECISION_SCORE,
    PLAN_DEPLOYED_MODE,
    PLAN_ENGINES_NEEDED,
    PLAN_FORECAST_COVERAGE,
    PLAN_FORECAST_HORIZON,
    PLAN_FORECAST_NOMINAL_COVERAGE,
    PLAN_GPUS_SAVED,
    PLAN_KV_CAPACITY,
    PLAN_KV_DEMAND_PEAK,
    PLAN_KV_DEMAND_PEAK_OF_CAPACITY,
    PLAN_KV_USAGE,
    PLAN_METRICS,
    PLAN_MODES,
    PLAN_RECOMMENDED_MODE,
    PLAN_SATURATION_PROBABILITY,
    PLAN_TIME_TO_SATURATION,
    PLAN_TODAY_PREEMPTIONS,
    PLAN_TODAY_TTFT_RATIO,
    MetricDef,
)
from store.tables import PlanRecord

__all__ = ["Coverage", "PlanCollector", "PlanSource", "plan_families", "render_plan_metrics"]

# (cluster, group) -> (realised coverage, nominal coverage), from planner.plan.outcome.
Coverage = Mapping[tuple[str, str], tuple[float, float]]
_TOKENS_UNIT = "token"  # the plan's KV demand unit ("KV tokens", or "engines of KV")
_GIB = 1024**3
_TIER_MODES = ("native", "lmcache")  # the cpu_tier section's tiers
_TIER_FIGURES = (
    ("extra_hit_ratio", PLAN_CPU_TIER_EXTRA_HIT_RATIO),
    ("avoided_prefill_tokens_per_s", PLAN_CPU_TIER_AVOIDED_PREFILL),
    ("capacity_ratio", PLAN_CPU_TIER_CAPACITY_RATIO),
)


class PlanSource(Protocol):
    """What the plan gauges read: store.store.Store satisfies it."""

    def latest_plans(self, cluster: str | None = None) -> list[PlanRecord]: ...


def _finite(value: Any) -> float | None:
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _demand_unit(document: Mapping[str, Any]) -> str | None:
    """The unit the plan measured KV demand and capacity in (its forecast's, else evidence's)."""
    forecast = document.get("forecast")
    kv = forecast.get("kv_demand") if isinstance(forecast, Mapping) else None
    unit = kv.get("unit") if isinstance(kv, Mapping) else None
    if not isinstance(unit, str):
        evidence = document.get("evidence")
        unit = evidence.get("demand_unit") if isinstance(evidence, Mapping) else None
    return unit if isinstance(unit, str) else None


def _deployed_mode(document: Mapping[str, Any]) -> str | None:
    """The offload mode the plan found deployed (its "happening" section), if it could tell."""
    happening = document.get("happening")
    current = happening.get("current_mode") if isinstance(happening, Mapping) else None
    mode = current.get("mode") if isinstance(current, Mapping) else None
    return mode if isinstance(mode, str) else None


def _interval(
    headline: Mapping[str, float | None], est: str, lo: str, hi: str
) -> list[tuple[str, float]]:
    pairs = zip(BOUNDS, (headline.get(est), headline.get(lo), headline.get(hi)), strict=True)
    return [(bound, v) for bound, raw in pairs if (v := _finite(raw)) is not None]


class _Families:
    def __init__(self) -> None:
        self.by_name = {
            m.name: GaugeMetricFamily(m.name, m.help, labels=m.labels) for m in PLAN_METRICS
        }

    def add(self, metric: MetricDef, labels: Sequence[str], value: float | None) -> None:
        if value is not None and math.isfinite(value):
            self.by_name[metric.name].add_metric(list(labels), value)

    def one_hot(self, metric: MetricDef, key: tuple[str, str], mode: str | None) -> None:
        """One series per mode, 1 for ``mode`` (None: no series)."""
        if mode is None:
            return
        for m in PLAN_MODES if mode in PLAN_MODES else (*PLAN_MODES, mode):
            self.add(metric, (*key, m), 1.0 if m == mode else 0.0)


def _bounds(d: Mapping[str, Any] | None, est: str = "estimate") -> list[tuple[str, float]]:
    """(bound, value) of an entry with ``est`` and an ``interval`` {lo, hi}."""
    if not isinstance(d, Mapping):
        return []
    iv = d.get("interval")
    if not isinstance(iv, Mapping):
        iv = {}
    values = (d.get(est), iv.get("lo"), iv.get("hi"))
    pairs = zip(BOUNDS, values, strict=True)
    return [(b, v) for b, raw in pairs if (v := _finite(raw)) is not None]


def _add_offload(out: _Families, key: tuple[str, str], document: Mapping[str, Any]) -> None:  # noqa: PLR0912 - one branch per optional plan field it exports
    """Today's effects and the bill of each mode (the plan's ``offload`` section)."""
    section = document.get("offload")
    modes = section.get("modes") if isinstance(section, Mapping) else None
    if not isinstance(modes, Mapping):
        return
    for mode, entry in sorted(modes.items()):
        if not isinstance(entry, Mapping):
            continue
        today = entry.get("today")
        if not isinstance(today, Mapping):
            today = {}
        for e in today.get("effects") or ():
            if not isinstance(e, Mapping) or not e.get("can_tell"):
                continue
            name = str(e.get("outcome"))
            if name.startswith("ttft_p") and name.endswith("_s"):
                for bound, v in _bounds(e):
                    out.add(PLAN_TODAY_TTFT_RATIO, (*key, mode, name[5:-2], bound), v)
            elif name == "preemptions_per_1k":
                for bound, v in _bounds(e):
                    out.add(PLAN_TODAY_PREEMPTIONS, (*key, mode, bound), v)
        bill = entry.get("bill")
        if not isinstance(bill, Mapping) or not bill.get("can_tell"):
            continue
        out.add(PLAN_ENGINES_NEEDED, (*key, "none", "estimate"),
                _finite(bill.get("engines_without_offload")))  # fmt: skip
        span = bill.get("engines_with_mode_range") or (None, None)
        for bound, raw in zip(BOUNDS, (bill.get("engines_with_mode"), *span), strict=False):
            out.add(PLAN_ENGINES_NEEDED, (*key, mode, bound), _finite(raw))
        saved = bill.get("gpu_hours_saved_range") or (None, None)
        for bound, raw in zip(BOUNDS, (bill.get("gpu_hours_saved_per_day"), *saved), strict=False):
            hours = _finite(raw)
            out.add(PLAN_GPUS_SAVED, (*key, mode, bound), None if hours is None else hours / 24)


def _tier_size(row: Mapping[str, Any]) -> str | None:
    """A cpu_tier row's ``size`` label: "recommended", or its multiple of HBM ("0.5x")."""
    if row.get("label") == "recommended":
        return "recommended"
    multiple = _finite(row.get("multiple"))
    return None if multiple is None else f"{multiple:g}x"


def _tier_bounds(e: Any, can_tell: bool) -> list[tuple[str, float]]:
    """(bound, value) of a cpu_tier estimate ``{estimate, lo, hi}``; a row that cannot tell
    keeps its range and loses its estimate."""
    if not isinstance(e, Mapping):
        return []
    values = (e.get("estimate") if can_tell else None, e.get("lo"), e.get("hi"))
    pairs = zip(BOUNDS, values, strict=True)
    return [(b, v) for b, raw in pairs if (v := _finite(raw)) is not None]


def _add_cpu_tier(out: _Families, key: tuple[str, str], document: Mapping[str, Any]) -> None:
    """What a CPU tier would buy, per tier and size (the plan's ``cpu_tier`` section; a plan
    older than the section, or one that cannot tell, gives no series)."""
    section = document.get("cpu_tier")
    if not isinstance(section, Mapping) or not section.get("can_tell"):
        return
    for mode in _TIER_MODES:
        tier = section.get(mode)
        if not isinstance(tier, Mapping):
            continue
        seen: set[str] = set()
        for row in tier.get("rows") or ():
            size = _tier_size(row) if isinstance(row, Mapping) else None
            if size is None or size in seen:
                continue
            seen.add(size)
            labels = (*key, mode, size)
            can_tell = bool(row.get("can_tell"))
            for field, metric in _TIER_FIGURES:
                for bound, v in _tier_bounds(row.get(field), can_tell):
                    out.add(metric, (*labels, bound), v)
            if isinstance(row.get("extrapolated"), bool):
                out.add(PLAN_CPU_TIER_EXTRAPOLATED, labels, float(row["extrapolated"]))
        rec = tier.get("recommended")
        gib = _finite(rec.get("gib")) if isinstance(rec, Mapping) else None
        if gib is not None and gib >= 0:
            out.add(PLAN_CPU_TIER_RECOMMENDED, (*key, mode), gib * _GIB)


def _add_plan(out: _Families, plan: PlanRecord, now: float) -> None:
    h = plan.headline
    key = (plan.cluster, plan.group)
    out.one_hot(PLAN_RECOMMENDED_MODE, key, plan.mode)
    out.one_hot(PLAN_DEPLOYED_MODE, key, _deployed_mode(plan.document))
    out.add(PLAN_DECISION_SCORE, key, _finite(h.get("score")))
    for mode in GAIN_MODES:
        for bound, v in _interval(
            h, f"breakeven_{mode}", f"breakeven_{mode}_lo", f"breakeven_{mode}_hi"
        ):
            out.add(PLAN_BREAKEVEN_KV_USAGE, (*key, mode, bound), v)
        for bound, v in _interval(
            h, f"capacity_{mode}", f"capacity_{mode}_lo", f"capacity_{mode}_hi"
        ):
            out.add(PLAN_CAPACITY_RATIO, (*key, mode, bound), v)
    _add_offload(out, key, plan.document)
    _add_cpu_tier(out, key, plan.document)
    out.add(PLAN_KV_USAGE, key, _finite(h.get("kv_util_now")))
    unit = _demand_unit(plan.document)
    in_tokens = unit is not None and _TOKENS_UNIT in unit.lower()
    capacity = _finite(h.get("kv_capacity"))
    for bound, v in _interval(h, "forecast_peak", "forecast_peak_lo", "forecast_peak_hi"):
        if in_tokens:
            out.add(PLAN_KV_DEMAND_PEAK, (*key, bound), v)
        if capacity is not None and capacity > 0:
            out.add(PLAN_KV_DEMAND_PEAK_OF_CAPACITY, (*key, bound), v / capacity)
    if in_tokens:
        out.add(PLAN_KV_CAPACITY, key, capacity)
    for bound, v in _interval(h, "saturation_s", "saturation_lo_s", "saturation_hi_s"):
        out.add(PLAN_TIME_TO_SATURATION, (*key, bound), v)
    out.add(PLAN_SATURATION_PROBABILITY, key, _finite(h.get("p_saturation")))
    out.add(PLAN_FORECAST_HORIZON, key, _finite(plan.horizon_s) or None)
    out.add(PLAN_AGE, key, max(0.0, now - plan.created_at))
    out.add(PLAN_CREATED, key, plan.created_at)


def plan_families(
    store: PlanSource, *, now: float | None = None, coverage: Coverage | None = None
) -> list[Metric]:
    """The planner gauges of the latest plan of every (cluster, group), as metric families
    (families without a series left out). ``now``: the age's reference (default: the wall
    clock); ``coverage``: the closed loop's (realised, nominal) per (cluster, group)."""
    at = time.time() if now is None else now
    out = _Families()
    for plan in store.latest_plans():
        _add_plan(out, plan, at)
    for (cluster, group), (realised, nominal) in sorted((coverage or {}).items()):
        out.add(PLAN_FORECAST_COVERAGE, (cluster, group), _finite(realised))
        out.add(PLAN_FORECAST_NOMINAL_COVERAGE, (cluster, group), _finite(nominal))
    return [f for f in out.by_name.values() if f.samples]


class PlanCollector:
    """The planner gauges as a prometheus_client collector, read from the store at each
    scrape: ``registry.register(PlanCollector(store, coverage=provider))``."""

    def __init__(
        self,
        store: PlanSource,
        *,
        coverage: Callable[[], Coverage | None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.coverage = coverage
        self.clock = clock

    def describe(self) -> list[Metric]:
        return []  # registering must not read the store; names are ours alone

    def collect(self) -> Iterator[Metric]:
        coverage = self.coverage() if self.coverage is not None else None
        yield from plan_families(self.store, now=self.clock(), coverage=coverage)


def render_plan_metrics(
    store: PlanSource, *, now: float | None = None, coverage: Coverage | None = None
) -> bytes:
    """The planner gauges in the Prometheus text format (version 0.0.4); see plan_families."""
    registry = CollectorRegistry(auto_describe=False)
    fixed = now if now is not None else time.time()
    registry.register(PlanCollector(store, coverage=lambda: coverage, clock=lambda: fixed))
    return generate_latest(registry)
