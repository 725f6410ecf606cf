"""`kvscope plan`: the orchestration from the store's windows to a Plan.

- ``build``: :func:`build_plan` (read, frame, observe, fit, forecast, decide, size);
- ``observe``: what is happening; ``fits`` and ``forecast``: running the fits and forecasts
  for a plan; ``basis``: the Evidence they fill; ``groups``: plans per model group;
- ``record``: the Plan, GroupPlan and NoData records (``Plan.to_dict()`` is the JSON);
- ``history``: a plan as the store keeps it (:func:`plan_records`, its :func:`headline`).
"""

from planner.plan.build import build_plan
from planner.plan.history import headline, plan_records
from planner.plan.record import GroupPlan, NoData, Plan, PlanDetails

__all__ = ["GroupPlan", "NoData", "Plan", "PlanDetails", "build_plan", "headline", "plan_records"]
