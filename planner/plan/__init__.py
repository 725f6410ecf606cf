"""`kvscope plan`: the orchestration from the store's windows to a Plan.

- ``build``: :func:`build_plan` (read, frame, observe, fit, forecast, decide, size);
- ``observe``: what is happening; ``fits`` and ``forecast``: running the fits and forecasts
  for a plan; ``basis``: the Evidence they fill; ``group_plans``: plans per model group;
- ``record``: the Plan, GroupPlan and NoData records (``Plan.to_dict()`` is the JSON);
- ``history``: a plan as the store keeps it (:func:`plan_records`, its :func:`headline`);
- ``outcome``: the closed loop, stored plans scored against what happened
  (:func:`score_plans`, :func:`accuracy_summary`).
"""

from planner.plan.build import build_plan
from planner.plan.history import headline, plan_records
from planner.plan.outcome import CapacityCheck, PlanOutcome, accuracy_summary, score_plans
from planner.plan.record import GroupPlan, NoData, Plan, PlanDetails

__all__ = ["CapacityCheck", "GroupPlan", "NoData", "Plan", "PlanDetails", "PlanOutcome",
           "accuracy_summary", "build_plan", "headline", "plan_records",
           "score_plans"]  # fmt: skip
