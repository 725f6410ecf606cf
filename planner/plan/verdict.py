"""The offload verdict of `kvscope plan`: per mode, what it does today, its capacity at the
SLO and the bill, each with its interval and the units behind it.

Today's effects (planner/fit/effects.py), capacity at the SLO (planner/fit/capacity.py) and
GPU-hours saved at the forecast peak (planner/deploy/sizing.py), over units: engines or the
LMCache pools they share. Fewer than 2 units per arm: "cannot tell", with an experiment.

Method: planner/plan/METHODS.md#verdict
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from core.errors import InsufficientHistory, KvscopeError
from planner.decide.evidence import CapacityEvidence, ValueCI
from planner.deploy.sizing import DEFAULT_HEADROOM, engine_bill, engine_capacity
from planner.domain.slo import Slo
from planner.domain.values import finite
from planner.fit.capacity import CapacityComparison, fit_capacity
from planner.fit.effects import TodayEffects, fit_today
from planner.fit.units import engine_keys, unit_keys
from planner.frames.groups import text_values
from planner.plan.fits import interval_dict
from planner.plan.proposal import propose
from planner.plan.verdict_switchback import switchback_capacity, switchback_today, switching_for

if TYPE_CHECKING:
    import numpy.typing as npt
    import pandas as pd

    from planner.decide.evidence import Evidence
    from store.tables import EngineRecord

log = logging.getLogger(__name__)
MODES = ("native", "lmcache")
REPORT_LEVEL = 0.90  # the intervals printed (the accuracy study checks their coverage)
CLAIM_LEVEL = 0.95  # the intervals a measured vote reads


@dataclass(frozen=True, slots=True, eq=False)
class ModeVerdict:
    """One mode's estimands (None: not estimated, ``why`` says why), its evidence and, when
    it cannot tell, the experiment that would settle it (planner/plan/proposal.py)."""

    mode: str
    today: TodayEffects | None
    capacity: CapacityComparison | None
    evidence: CapacityEvidence
    why: str = ""
    experiment: Mapping[str, Any] | None = None


def pools_of(engines: Sequence[EngineRecord]) -> dict[str, str]:
    """engine source -> its LMCache pool, from the engine facts (``pool``)."""
    out = {}
    for e in engines:
        pool = (e.facts or {}).get("pool")
        if pool:
            out[e.source] = str(pool)
    return out


def run_verdicts(
    frame: pd.DataFrame,
    engines: Sequence[EngineRecord],
    *,
    slo: Slo | None = None,
    seed: int = 0,
) -> dict[str, ModeVerdict]:
    """Every mode's verdict (METHODS.md#verdict); a mode no engine ran is "cannot tell" with
    the experiment that would start one (engines drawn at random with ``seed``)."""
    slo = slo or Slo()
    modes = set(frame["offload_mode"].astype(str).unique().tolist()) if len(frame) else set()
    pools = pools_of(engines)
    units: npt.NDArray[np.object_] | None = None  # each row's unit: the same for every mode
    out = {}
    for mode in MODES:
        if "none" not in modes:
            out[mode] = _cannot(mode, "no engine ran without offload to compare with")
            continue
        switching = switching_for(frame, mode)
        if switching:
            try:
                out[mode] = _switchback(frame, switching, mode, slo, seed)
            except Exception as exc:  # loop boundary: one estimand must not sink the plan
                log.warning("plan: switchback of %s failed: %s", mode, exc, exc_info=True)
                out[mode] = _cannot(mode, f"switchback failed: {type(exc).__name__}: {exc}")
        elif mode not in modes:
            v = _cannot(mode, f"no engine ran {mode} offload")
            out[mode] = replace(v, experiment=propose(frame, mode, switching=(),
                                units_with_mode=0, pools=pools, seed=seed, why=v.why))  # fmt: skip
        else:
            units = unit_keys(frame, pools) if units is None else units
            v = _verdict(frame, units, mode, slo)
            if not v.evidence.can_tell:
                v = replace(v, experiment=propose(
                    frame, mode, switching=(), units_with_mode=v.evidence.units[0],
                    pools=pools, seed=seed, why=v.evidence.why))  # fmt: skip
            out[mode] = v
    return out


def _switchback(
    frame: pd.DataFrame, switching: list[str], mode: str, slo: Slo, seed: int
) -> ModeVerdict:
    """A mode run as a switchback on ``switching[0]`` (planner/plan/verdict_switchback.py);
    engines of other modes and the other switching engines are left out."""
    keys = engine_keys(frame)
    modes = text_values(frame["offload_mode"])
    canary = switching[0]
    rows = (keys == canary) | (np.isin(modes, ["none"]) & ~np.isin(keys, switching))
    sub = frame[rows].reset_index(drop=True)
    today = switchback_today(sub, mode, REPORT_LEVEL)
    cap = switchback_capacity(sub, canary, mode, slo=slo, level=REPORT_LEVEL,
                              claim_level=CLAIM_LEVEL, seed=seed)  # fmt: skip
    ev = replace(capacity_evidence(cap), design="switchback")
    experiment = None
    if not ev.can_tell:
        experiment = propose(sub, mode, switching=(canary,), units_with_mode=1, pools={},
                             seed=seed, why=ev.why)  # fmt: skip
    return ModeVerdict(mode, today, cap, ev, "", experiment)


def _cannot(mode: str, why: str) -> ModeVerdict:
    return ModeVerdict(mode, None, None, CapacityEvidence(False, why=why), why)


def _verdict(frame: pd.DataFrame, units: Any, mode: str, slo: Slo) -> ModeVerdict:
    today: TodayEffects | None = None
    cap: CapacityComparison | None = None
    why = []
    try:
        today = fit_today(frame, units, mode=mode, level=REPORT_LEVEL)
    except InsufficientHistory as exc:
        why.append(f"today: {exc}")
    except KvscopeError as exc:
        why.append(f"today: refused: {exc}")
    except Exception as exc:  # loop boundary: one estimand must not sink the plan
        log.warning("plan: today's effect of %s failed: %s", mode, exc, exc_info=True)
        why.append(f"today: failed: {type(exc).__name__}: {exc}")
    try:
        cap = fit_capacity(frame, units, mode=mode, slo=slo, level=REPORT_LEVEL,
                           claim_level=CLAIM_LEVEL)  # fmt: skip
    except KvscopeError as exc:
        why.append(f"capacity: refused: {exc}")
    except Exception as exc:  # loop boundary
        log.warning("plan: capacity of %s failed: %s", mode, exc, exc_info=True)
        why.append(f"capacity: failed: {type(exc).__name__}: {exc}")
    return ModeVerdict(mode, today, cap, capacity_evidence(cap), "; ".join(why))


def capacity_evidence(cap: CapacityComparison | None) -> CapacityEvidence:
    """The Evidence record of a capacity comparison (what R7 and sizing read)."""
    if cap is None:
        return CapacityEvidence(False, why="capacity not estimated")
    units = (cap.units_treated, cap.units_control)
    if not cap.can_tell:
        return CapacityEvidence(False, units=units, why=cap.why, settle=cap.settle)
    hi = cap.ratio if cap.bound == "lower" else cap.interval.hi
    chi = cap.ratio if cap.bound == "lower" else cap.claim_interval.hi
    ratio = _vci(cap.ratio, cap.interval.lo, hi, cap.interval.level)
    claim = _vci(cap.ratio, cap.claim_interval.lo, chi, cap.claim_interval.level)
    if ratio is None:
        return CapacityEvidence(False, units=units, why="capacity interval not finite")
    return CapacityEvidence(True, ratio, claim, cap.bound == "lower", units, why=cap.why)


def _vci(est: float, lo: float, hi: float, level: float) -> ValueCI | None:
    if not all(math.isfinite(v) for v in (est, lo, hi)) or not lo <= est <= hi:
        return None
    return ValueCI(est, lo, hi, level)


# ----------------------------------------------------------------------------- JSON


def today_dict(t: TodayEffects) -> dict[str, Any]:
    return {
        "can_tell": t.can_tell,
        "why": t.why,
        "level": t.level,
        "effects": [
            {
                "outcome": e.outcome,
                "label": e.label,
                "unit": e.unit,
                "scale": e.scale,
                "without_offload": finite(e.control),
                "estimate": finite(e.estimate),
                "interval": interval_dict(e.interval),
                "df": finite(e.df),
                "windows": e.windows,
                "can_tell": e.can_tell,
                "why": e.why,
            }
            for e in t.effects
        ],
        "balance": [
            {
                "covariate": b.covariate,
                "with_mode": finite(b.treated_mean),
                "without_offload": finite(b.control_mean),
                "smd": finite(b.smd),
                "unbalanced": b.unbalanced,
            }
            for b in t.balance
        ],
        "adjusted_for": list(t.covariates),
        "method": t.method,
        "assumptions": list(t.assumptions),
        "warnings": list(t.warnings),
    }


def capacity_dict(c: CapacityComparison) -> dict[str, Any]:
    return {
        "can_tell": c.can_tell,
        "why": c.why,
        "settle": c.settle or None,
        "slo": {"ttft_s": c.slo.ttft_s, "quantile": c.slo.quantile, "text": c.slo.text()},
        "ratio": finite(c.ratio),
        "interval": interval_dict(c.interval),
        "claim_interval": interval_dict(c.claim_interval),
        "lower_bound": c.bound == "lower",
        "df": finite(c.df),
        "unit": "tokens/s per engine (prompt + generated) within the SLO",
        "without_offload_tokens_per_s": finite(c.none_capacity),
        "with_mode_tokens_per_s": finite(c.mode_capacity),
        "units": [
            {
                "unit": u.unit,
                "mode": u.mode,
                "engines": u.engines,
                "tokens_per_s": finite(u.value),
                "status": u.status,
                "windows": u.windows,
                "missed_slo": u.missed,
            }
            for u in c.units
        ],
        "method": c.method,
        "assumptions": list(c.assumptions),
    }


def verdict_section(
    verdicts: Mapping[str, ModeVerdict], evidence: Evidence | None, slo: Slo
) -> dict[str, Any]:
    """The plan's ``offload`` section: the SLO and, per mode, today / capacity / bill."""
    modes: dict[str, Any] = {}
    for mode, v in verdicts.items():
        t = v.today
        entry: dict[str, Any] = {
            "units": {
                "with_mode": v.evidence.units[0],
                "without_offload": v.evidence.units[1],
                "engines_with_mode": t.engines_treated if t else None,
                "engines_without_offload": t.engines_control if t else None,
                "unit": "engine, or the LMCache pool engines share",
            },
            "design": v.evidence.design,
            "today": today_dict(t) if t else None,
            "capacity": capacity_dict(v.capacity) if v.capacity else None,
            "capacity_gain": v.evidence.text() if v.evidence.can_tell else None,
            "bill": None,
            "why": v.why or (v.evidence.why if not v.evidence.can_tell else ""),
            "experiment": dict(v.experiment) if v.experiment else None,
        }
        if evidence is not None:
            entry["bill"] = _bill(evidence, v.evidence)
        modes[mode] = entry
    return {
        "slo": {"ttft_s": slo.ttft_s, "quantile": slo.quantile, "text": slo.text()},
        "levels": {"reported": REPORT_LEVEL, "claims": CLAIM_LEVEL},
        "modes": modes,
        "basis": (
            "units are engines or LMCache pools, never windows; a measured claim needs 2 "
            "units per arm; today = effects at the load each engine carried, adjusted for "
            "traffic mix; capacity = load within the SLO (planner/plan/verdict.py)"
        ),
    }


def _bill(ev: Evidence, fit: CapacityEvidence) -> dict[str, Any]:
    peak = ev.demand_peak
    cap = engine_capacity(ev)
    if peak is None or cap is None:
        return {"can_tell": False, "why": "no demand forecast or engine capacity"}
    b = engine_bill(peak.estimate, cap[0], DEFAULT_HEADROOM, fit, ev.tp)
    if b is None:
        return {"can_tell": False, "why": fit.why or "capacity ratio cannot tell"}
    return {
        "can_tell": True,
        "peak": finite(peak.estimate),
        "peak_unit": ev.demand_unit,
        "engines_without_offload": b.needed,
        "engines_with_mode": b.with_offload,
        "engines_with_mode_range": list(b.with_offload_range),
        "gpu_hours_saved_per_day": finite(b.gpu_hours_saved_per_day),
        "gpu_hours_saved_range": [
            None if x is None else finite(x) for x in b.gpu_hours_saved_range
        ],
        "rests_on": b.rests_on,
        "headroom": DEFAULT_HEADROOM,
    }
