"""The closed loop: every stored plan whose horizon has passed, scored against what happened.

What happened is read by the plan's own path (:func:`build_plan` on the later windows, same
cluster and model group). Per plan: coverage of the KV-demand forecast's bucket intervals,
whether saturation came earlier, later or as predicted (within one bucket), and whether the
later capacity estimate lies in the plan's interval; :func:`accuracy_summary` pools them
with Wilson intervals (Wilson 1927, JASA 22(158)), indicative as the points are correlated.

Method: planner/plan/METHODS.md#outcome
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

from core.errors import ConfigError
from planner.domain.values import finite, json_ready
from planner.forecast.data import rebucket
from planner.plan.build import build_plan
from planner.plan.forecast import FORECAST_LEVEL
from planner.plan.record import NoData, Plan
from store.tables import PlanRecord

if TYPE_CHECKING:
    from store.store import Store

__all__ = [
    "GAIN_MODES",
    "SATURATION_VERDICTS",
    "CapacityCheck",
    "PlanOutcome",
    "accuracy_summary",
    "score_plan",
    "score_plans",
    "wilson",
]

# saturated at 99 % of capacity: observed use is censored there (vLLM preempts instead of
# exceeding it), so summed peaks seldom touch 100 % (METHODS.md#outcome)
SATURATED_SHARE = 0.99
SATURATION_VERDICTS = ("as_predicted", "earlier", "later", "not_reached_as_predicted",
                       "reached_unpredicted", "unknown")  # fmt: skip
GAIN_MODES = ("native", "lmcache")
MAX_PLANS = 2_000  # the newest plans scored: three weeks of plans made every 15 min
SUMMARY_LEVEL = 0.95
_Z95 = 1.959963984540054  # standard normal 0.975 quantile
# the later build_plan only has to build the KV series and fit the gains: its forecast is
# cut to one candidate and no simulation (the time budget is a guard, planner/forecast/demand.py)
_LATER_FORECAST_SECONDS = 0.05


@dataclass(frozen=True, slots=True)
class CapacityCheck:
    """One mode's capacity ratio: the plan's interval against the later plan's estimate."""

    mode: str
    predicted: float
    lo: float
    hi: float | None  # None: the plan knew only a lower bound
    measured: float | None  # None: the later windows cannot tell
    inside: bool | None


@dataclass(frozen=True, slots=True)
class PlanOutcome:
    """A stored plan scored against the windows that came after it (METHODS.md#outcome)."""

    plan_id: int
    cluster: str
    group: str
    created_at: float
    horizon_end: float
    level: float  # nominal level of the KV-demand forecast interval (e.g. 0.9)
    kv_points: int  # realised KV-demand points compared with the forecast
    kv_covered: int  # of them inside the forecast interval
    coverage: float | None  # kv_covered / kv_points (None: nothing to compare)
    saturation: str  # one of SATURATION_VERDICTS
    saturated_at: float | None
    capacity: tuple[CapacityCheck, ...]
    pending: bool = False  # horizon not yet passed: nothing compared

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (non-finite numbers become null; capacity a list of objects)."""
        out: dict[str, Any] = json_ready(self)
        return out


# --------------------------------------------------------------------------- one plan


def _kv(document: Mapping[str, Any]) -> Mapping[str, Any]:
    forecast = document.get("forecast") or {}
    kv = forecast.get("kv_demand") if isinstance(forecast, Mapping) else None
    return kv if isinstance(kv, Mapping) else {}


def _points(kv: Mapping[str, Any]) -> list[tuple[float, float, float]]:
    """(bucket start, lo, hi) of every finite forecast point."""
    out = []
    for p in kv.get("points") or ():
        t, lo, hi = finite(p[0]), finite(p[2]), finite(p[3])
        if t is not None and lo is not None and hi is not None:
            out.append((t, lo, hi))
    return out


def horizon_end(rec: PlanRecord) -> float:
    """When the plan's horizon ends: window_until + horizon_s, or the end of its last forecast
    bucket when that is later."""
    kv = _kv(rec.document)
    end = rec.window_until + rec.horizon_s
    cadence = finite(kv.get("cadence_s"))
    points = _points(kv)
    if cadence and points:
        end = max(end, points[-1][0] + cadence)
    return end


def _saturation(  # noqa: PLR0917 - the prediction and what happened
    realised: Mapping[int, float],
    points: Mapping[int, tuple[float, float, float]],
    kv: Mapping[str, Any],
    capacity: float | None,
    cadence: float,
    origin: float,
) -> tuple[str, float | None]:
    """(verdict, saturated_at) of the realised buckets against the predicted bounds."""
    if capacity is None or not realised:
        return "unknown", None
    lo, hi = finite(kv.get("time_to_saturation_lo_s")), finite(kv.get("time_to_saturation_hi_s"))
    tol = cadence
    at: float | None = None
    for b in sorted(realised):
        if realised[b] >= SATURATED_SHARE * capacity:
            at = points[b][0] + cadence / 2
            break
    seen_until = points[max(realised)][0] + cadence - origin  # end of the last realised bucket
    forecast_end = points[max(points)][0] + cadence - origin
    whole = seen_until >= forecast_end - tol
    if at is not None:
        s = at - origin
        if lo is None:
            return "reached_unpredicted", at
        if s < lo - tol:
            return "earlier", at
        if hi is not None and s > hi + tol:
            return "later", at
        return "as_predicted", at
    if lo is None:
        return ("not_reached_as_predicted" if whole else "unknown"), None
    if hi is not None:
        return ("later" if seen_until > hi + tol else "unknown"), None
    return ("as_predicted" if whole else "unknown"), None


def _capacity_checks(rec: PlanRecord, later: Plan | None) -> tuple[CapacityCheck, ...]:
    h = rec.headline
    out = []
    for mode in GAIN_MODES:
        est, lo, hi = (finite(h.get(f"capacity_{mode}{k}")) for k in ("", "_lo", "_hi"))
        if est is None or lo is None:
            continue  # the plan gave no interval for this mode: nothing to check
        measured = None
        fit = getattr(later.evidence, f"{mode}_capacity") if later is not None else None
        if fit is not None and fit.can_tell and fit.ratio is not None and not fit.lower_bound:
            measured = finite(fit.ratio.estimate)
        # a lower-bound ratio (hi None) is checked on its lower end only
        inside = None if measured is None else lo <= measured <= (math.inf if hi is None else hi)
        out.append(CapacityCheck(mode, est, lo, hi, measured, inside))
    return tuple(out)


def _realised(later: Plan | None, kv: Mapping[str, Any], cadence: float) -> dict[int, float] | None:
    """Realised bucket peaks by bucket index (t / cadence), None when not comparable."""
    if later is None:
        return None
    series = later.details.forecasts.kv_series
    later_kv = later.forecast.get("kv_demand") or {}
    if series is None or not len(series) or later_kv.get("unit") != kv.get("unit"):
        return None
    buckets = rebucket(series, cadence, agg="max")
    return {round(t / cadence): v for t, v in buckets.items()}


def score_plan(rec: PlanRecord, later: Plan | None, *, now: float) -> PlanOutcome:
    """One stored plan against ``later``, the plan of the windows after it (None: no later
    windows); pending when its horizon ends after ``now`` (METHODS.md#outcome)."""
    kv = _kv(rec.document)
    level = finite(kv.get("level")) or FORECAST_LEVEL
    ident = (int(rec.id or 0), rec.cluster, rec.group, rec.created_at, horizon_end(rec), level)
    if rec.window_until + rec.horizon_s > now:
        return PlanOutcome(*ident, kv_points=0, kv_covered=0, coverage=None,
                           saturation="unknown", saturated_at=None, capacity=(),
                           pending=True)  # fmt: skip
    cadence = finite(kv.get("cadence_s"))
    origin = finite(kv.get("origin_epoch"))
    capacity = finite(kv.get("capacity_total")) or finite(kv.get("capacity"))
    points = {round(t / cadence): (t, lo, hi) for t, lo, hi in _points(kv)} if cadence else {}
    realised = _realised(later, kv, cadence) if cadence and points and origin is not None else None
    matched = {b: v for b, v in (realised or {}).items() if b in points}
    covered = sum(points[b][1] <= v <= points[b][2] for b, v in matched.items())
    verdict, at = "unknown", None
    if matched and cadence and origin is not None:
        verdict, at = _saturation(matched, points, kv, capacity, cadence, origin)
    return PlanOutcome(
        *ident,
        kv_points=len(matched),
        kv_covered=covered,
        coverage=covered / len(matched) if matched else None,
        saturation=verdict,
        saturated_at=at,
        capacity=_capacity_checks(rec, later),
    )


def _later_plan(store: Store, rec: PlanRecord, until: float) -> Plan | None:
    """build_plan over the windows after the plan (same cluster and group), None without any."""
    kv = _kv(rec.document)
    seed = kv.get("seed")
    try:
        return build_plan(
            store,
            cluster=rec.cluster,
            since=rec.window_until,
            until=until,
            horizon_s=finite(kv.get("cadence_s")) or 60.0,
            seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else 0,
            forecast_seconds=_LATER_FORECAST_SECONDS,
            group=rec.group or None,
        )
    except NoData:
        return None
    except ConfigError:
        if rec.group:  # the arguments are valid: the group has no engine in the later windows
            return None
        raise


def score_plans(
    store: Store, cluster: str | None = None, *, now: float | None = None
) -> list[PlanOutcome]:
    """Every stored plan (of ``cluster``, or all), newest first, scored against the windows
    that came after it; plans whose horizon ends after ``now`` (default: the clock) are
    returned pending. StoreError when the store cannot be read."""
    at = time.time() if now is None else now
    cache: dict[tuple[str, str, float, float], Plan | None] = {}
    out = []
    for rec in store.plans(cluster, limit=MAX_PLANS):
        later = None
        if rec.window_until + rec.horizon_s <= at:
            until = horizon_end(rec)
            key = (rec.cluster, rec.group, rec.window_until, until)
            if key not in cache:
                cache[key] = _later_plan(store, rec, until)
            later = cache[key]
        out.append(score_plan(rec, later, now=at))
    return out


# --------------------------------------------------------------------------- the summary


def wilson(k: int, n: int, level: float = SUMMARY_LEVEL) -> tuple[float, float] | None:
    """Wilson score interval of the share k/n (Wilson 1927), None when n = 0."""
    if n <= 0:
        return None
    if not 0 <= k <= n:
        raise ConfigError(f"wilson: need 0 <= k <= n, got k={k}, n={n}")

    z = _Z95 if level == SUMMARY_LEVEL else NormalDist().inv_cdf(0.5 + level / 2)
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    lo, hi = max(0.0, centre - half), min(1.0, centre + half)
    return (0.0 if k == 0 else lo), (1.0 if k == n else hi)  # exact ends, no rounding residue


def _share(k: int, n: int) -> dict[str, Any]:
    iv = wilson(k, n)
    return {
        "share": k / n if n else None,
        "interval": None
        if iv is None
        else {"lo": iv[0], "hi": iv[1], "level": SUMMARY_LEVEL, "method": "Wilson score"},
    }


def accuracy_summary(outcomes: Sequence[PlanOutcome]) -> dict[str, Any]:
    """The closed loop pooled over plans (METHODS.md#outcome): plans scored and pending, the
    realised KV-demand coverage against its nominal level, the saturation verdicts, the gain
    checks inside / outside their intervals."""
    scored = [o for o in outcomes if not o.pending]
    points = sum(o.kv_points for o in scored)
    covered = sum(o.kv_covered for o in scored)
    nominal = sum(o.level * o.kv_points for o in scored) / points if points else None
    cov = _share(covered, points)
    iv = cov["interval"]
    verdicts = dict.fromkeys(SATURATION_VERDICTS, 0)
    for o in scored:
        verdicts[o.saturation] = verdicts.get(o.saturation, 0) + 1
    checks = [g for o in scored for g in o.capacity]

    def counts(gs: Sequence[CapacityCheck]) -> dict[str, Any]:
        inside = sum(g.inside is True for g in gs)
        outside = sum(g.inside is False for g in gs)
        return {"checks": len(gs), "inside": inside, "outside": outside,
                "cannot_tell": len(gs) - inside - outside,
                **_share(inside, inside + outside)}  # fmt: skip

    return {
        "plans": len(outcomes),
        "scored": len(scored),
        "pending": len(outcomes) - len(scored),
        "kv_demand": {
            "plans": sum(o.kv_points > 0 for o in scored),
            "points": points,
            "covered": covered,
            "coverage": cov["share"],
            "interval": iv,
            "nominal": nominal,
            "nominal_inside": None
            if iv is None or nominal is None
            else iv["lo"] <= nominal <= iv["hi"],
            "note": "pooled points are serially correlated (the buckets of one forecast, "
            "overlapping horizons): the coverage and its interval are indicative",
        },
        "saturation": verdicts,
        "capacity": {
            **counts(checks),
            "by_mode": {m: counts([g for g in checks if g.mode == m]) for m in GAIN_MODES},
            "note": "both estimates are noisy: with equal, independent errors a 90 % interval "
            "holds the later estimate ≈ 75 % of the time even when the capacity did not move",
        },
    }
