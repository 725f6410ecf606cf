"""`kvscope plan`: the orchestration from the store's windows to a Plan.

- ``build``: :func:`build_plan` (read, frame, observe, fit, forecast, decide, size);
- ``observe``: what is happening; ``fits`` and ``forecast``: running the fits and forecasts
  for a plan; ``basis``: the Evidence they fill; ``group_plans``: plans per model group;
- ``record``: the Plan, GroupPlan and NoData records (``Plan.to_dict()`` is the JSON);
- ``history``: a plan as the store keeps it (:func:`plan_records`, its :func:`headline`);
- ``outcome``: the closed loop, stored plans scored against what happened
  (:func:`score_plans`, :func:`accuracy_summary`).
Its names load with their module on first use (PEP 562): the reading child starts sooner.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from planner.plan.build import build_plan
    from planner.plan.history import headline, plan_records
    from planner.plan.outcome import (
        CapacityCheck,
        PlanOutcome,
        accuracy_summary,
        score_plans,
    )
    from planner.plan.record import GroupPlan, NoData, Plan, PlanDetails

_HOME = {
    "build_plan": "build",
    "headline": "history",
    "plan_records": "history",
    "CapacityCheck": "outcome",
    "PlanOutcome": "outcome",
    "accuracy_summary": "outcome",
    "score_plans": "outcome",
    "GroupPlan": "record",
    "NoData": "record",
    "Plan": "record",
    "PlanDetails": "record",
}
__all__ = ["CapacityCheck", "GroupPlan", "NoData", "Plan", "PlanDetails", "PlanOutcome",
           "accuracy_summary", "build_plan", "headline", "plan_records",
           "score_plans"]  # fmt: skip


def __getattr__(name: str) -> Any:
    """A name of ``__all__`` from its module, imported now (AttributeError: not one)."""
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
