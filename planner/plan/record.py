"""The answer of `kvscope plan` as records: a Plan, the plan of each model group inside it,
the details the plots need, and NoData when the store has nothing to plan on.

planner/plan/build.py makes them; ``Plan.to_dict()`` is the JSON of `kvscope plan --json`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from core.errors import KvscopeError
from planner.decide.decision import Decision
from planner.decide.evidence import Evidence
from planner.deploy.sizing import Sizing
from planner.domain.values import json_ready
from planner.plan.fits import FitRun
from planner.plan.forecast import ForecastRun
from planner.plan.verdict import ModeVerdict

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["SEE_GROUPS", "GroupPlan", "NoData", "Plan", "PlanDetails"]


SEE_GROUPS = (
    "decision, sizing and configs per model group: groups[].plan. The top level pools the "
    "groups' observations only: a decision or a fleet size on no fit across models would "
    "rest on nothing"
)


class NoData(KvscopeError):
    """The store holds no windows for the cluster and period asked about."""


@dataclass(frozen=True, slots=True, eq=False)
class PlanDetails:
    """What the plots need beyond the JSON: the frame, the fit objects, the forecasts; and
    the seconds each stage took (read, frame, fits, then what still ran beside the fits:
    observe, the verdicts and the forecasts; cpu_tier, decide)."""

    frame: pd.DataFrame
    fits: Mapping[str, FitRun]
    forecasts: ForecastRun
    seconds: Mapping[str, float] = field(default_factory=dict)
    verdicts: Mapping[str, ModeVerdict] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, eq=False)
class Plan:
    """The answer of `kvscope plan`; ``to_dict()`` is its JSON (module docstring)."""

    cluster: str | None
    window: Mapping[str, Any]
    happening: Mapping[str, Any]
    evidence: Evidence
    decision: Decision | None  # None: several model groups, each decided apart (groups)
    # per offload mode: today's effects, capacity at the SLO, the bill (planner/plan/verdict.py);
    # None with several model groups (each group's plan has its own)
    offload: Mapping[str, Any] | None
    # "What a CPU tier would buy" (planner/plan/tier.py); None with several model groups
    cpu_tier: Mapping[str, Any] | None
    fits: Mapping[str, Mapping[str, Any]]
    forecast: Mapping[str, Any]
    sizing: Sizing | None
    sizing_error: str | None
    cost: Mapping[str, Any] | None
    basis: tuple[str, ...]
    details: PlanDetails
    group: str | None = None  # the model group planned (``--group``), else None
    groups: tuple[GroupPlan, ...] = ()  # each group's own plan, when there are several

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (non-finite numbers become null); ``group`` / ``groups`` appear only
        when the plan is of one group of several / of several groups. With several groups
        the top level's ``decision``, ``sizing`` and ``configs`` are null and ``see_groups``
        says where they are: each group's plan holds its own."""
        sizing: dict[str, Any] | None = (
            self.sizing.to_dict() if self.sizing else {"error": self.sizing_error}
        )
        configs: dict[str, str] | None = dict(self.sizing.configs) if self.sizing else {}
        if self.decision is None:
            sizing = configs = None
        out: dict[str, Any] = json_ready(
            {
                "cluster": self.cluster,
                "window": dict(self.window),
                "happening": dict(self.happening),
                "decision": self.decision.to_dict() if self.decision else None,
                "offload": dict(self.offload) if self.offload else None,
                "cpu_tier": dict(self.cpu_tier) if self.cpu_tier else None,
                "fits": {k: dict(v) for k, v in self.fits.items()},
                "forecast": dict(self.forecast),
                "sizing": sizing,
                "configs": configs,
                "cost": dict(self.cost) if self.cost else None,
                "evidence": asdict(self.evidence),
                "basis": list(self.basis),
            }
        )
        if self.group is not None:
            out["group"] = self.group
        if self.decision is None:
            out["see_groups"] = SEE_GROUPS
        if self.groups:
            out["groups"] = [g.to_dict() for g in self.groups]
        return out


@dataclass(frozen=True, slots=True, eq=False)
class GroupPlan:
    """A group's own plan inside a cluster's plan (``Plan.groups``)."""

    name: str
    engines: tuple[str, ...]
    sources: tuple[str, ...]
    plan: Plan

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "engines": list(self.engines),
            "sources": list(self.sources),
            "plan": self.plan.to_dict(),
        }
