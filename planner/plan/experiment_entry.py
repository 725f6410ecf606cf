"""A gain fit's planned experiment (planner/plan/experiment.py) as its plan entry, with the
vLLM / LMCache configs for the switched engines (planner/deploy/sizing.py for the mode)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from collector.errors import ConfigError
from planner.deploy.sizing import size
from planner.plan.experiment import design_entry, plan_experiment

if TYPE_CHECKING:
    import pandas as pd

    from planner.decide.decision import Decision
    from planner.decide.evidence import Evidence
    from planner.plan.fits import FitRun


def add_experiment(
    run: FitRun, frame: pd.DataFrame, u_now: float | None, ev: Evidence, decision: Decision
) -> None:
    """Set ``run.entry["experiment"]`` when the gain fit cannot tell; leave it out otherwise."""
    from planner.fit.gain import GainFit

    fit = run.result
    if not isinstance(fit, GainFit):
        return
    design = plan_experiment(frame, fit, u_now)
    if design is None:
        return
    configs: dict[str, str] = {}
    why = ""
    try:
        sizing = size(ev, dataclasses.replace(decision, mode=design.mode))
        configs = dict(sizing.configs)
        if not configs:
            why = "no configs: " + "; ".join(sizing.unknowns or sizing.notes or ("not sized",))
    except ConfigError as exc:
        why = f"no configs: {exc}"
    run.entry["experiment"] = design_entry(design, configs, why)
