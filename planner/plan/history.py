"""A plan as the store keeps it: its headline figures (store.tables.PLAN_HEADLINE) and
the PlanRecord `kvscope plan --save` writes, one per model group when there are several.

The headline is read from the plan's typed records (Evidence, Decision), never re-parsed from
its JSON; a figure the plan could not give is None.
"""

from __future__ import annotations

from typing import Any

from core.errors import ConfigError
from planner.decide.evidence import CapacityEvidence, ValueCI
from planner.domain.values import finite
from planner.fit.registry import EQUAL_KV
from planner.plan.record import Plan
from store.tables import PlanRecord

__all__ = ["headline", "plan_records"]


def _ci(prefix: str, v: ValueCI | None, lo: str = "_lo", hi: str = "_hi") -> dict[str, Any]:
    if v is None:
        return {prefix: None, prefix + lo: None, prefix + hi: None}
    return {prefix: finite(v.estimate), prefix + lo: finite(v.lo), prefix + hi: finite(v.hi)}


def _capacity(mode: str, c: CapacityEvidence | None) -> dict[str, Any]:
    """capacity_<mode> (ratio, 90 % interval); the upper end is None for a lower bound."""
    told = c is not None and c.can_tell and c.ratio is not None
    out = _ci(f"capacity_{mode}", c.ratio if told and c else None)
    if told and c is not None and c.lower_bound:
        out[f"capacity_{mode}_hi"] = None
    return out


def _equal_kv(plan: Plan, mode: str) -> dict[str, Any]:
    """The equal-KV-use diagnostic's break-even and its relative tokens/s at current KV use."""
    entry = plan.fits.get(EQUAL_KV + mode) or {}
    at = entry.get("at_current_util") or {}
    iv = entry.get("interval") or {}
    crossed = entry.get("verdict") == "crosses" and entry.get("can_tell")
    riv = at.get("relative_interval") or {}
    return {
        f"breakeven_{mode}": finite(entry.get("estimate")) if crossed else None,
        f"breakeven_{mode}_lo": finite(iv.get("lo")) if crossed else None,
        f"breakeven_{mode}_hi": finite(iv.get("hi")) if crossed else None,
        f"equal_kv_gain_{mode}": finite(at.get("relative")) if at.get("in_support") else None,
        f"equal_kv_gain_{mode}_lo": finite(riv.get("lo")) if at.get("in_support") else None,
        f"equal_kv_gain_{mode}_hi": finite(riv.get("hi")) if at.get("in_support") else None,
    }


def headline(plan: Plan) -> dict[str, float | None]:
    """The figures stored as columns beside the plan's JSON (None: the plan could not tell)."""
    ev = plan.evidence
    kv = plan.forecast.get("kv_demand") or {}
    saturation = ev.time_to_saturation_s
    return {
        "score": plan.decision.score if plan.decision else None,
        **_capacity("native", ev.native_capacity),
        **_capacity("lmcache", ev.lmcache_capacity),
        **_equal_kv(plan, "native"),
        **_equal_kv(plan, "lmcache"),
        "kv_util_now": finite(ev.kv_util_p50),
        **_ci("forecast_peak", ev.demand_peak),
        "kv_capacity": finite(kv.get("capacity_total")),
        "saturation_s": finite(saturation.estimate) if saturation else None,
        "saturation_lo_s": finite(saturation.lo) if saturation else None,
        "saturation_hi_s": finite(saturation.hi) if saturation else None,
        "p_saturation": finite(kv.get("saturation_probability")),
    }


def plan_records(plan: Plan, *, cluster: str, version: str, created_at: float) -> list[PlanRecord]:
    """The records of a plan of ``cluster``: the cluster's (group ""), and each model group's
    when the plan was made per group (its ``groups``); a plan of one ``--group`` is stored
    under that name."""
    if plan.cluster not in (None, cluster):
        raise ConfigError(f"a plan of cluster {plan.cluster!r} stored as {cluster!r}")

    def one(p: Plan, group: str) -> PlanRecord:
        window = plan.window
        return PlanRecord(
            cluster=cluster,
            group=group,
            created_at=created_at,
            window_from=float(window["first"]),
            window_until=float(window["last"]),
            horizon_s=float(p.forecast.get("horizon_s") or 0.0),
            version=version,
            mode=p.decision.mode if p.decision else None,
            document=p.to_dict(),
            headline=headline(p),
        )

    records = [one(plan, plan.group or "")]
    records += [one(g.plan, g.name) for g in plan.groups]
    return records
