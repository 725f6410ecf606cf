"""planner/plan/experiment.py: the planned A/B's standard error against a seeded Monte Carlo
of the real gain fit on that design (benchmarks/accuracy/fitsynth.py + abtest.py)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from benchmarks.accuracy.abtest import switch_engines
from benchmarks.accuracy.fitsynth import Truth, synthetic_frame
from planner.fit.common import t_quantile
from planner.fit.gain import fit_gain
from planner.plan.experiment import Design, needs_experiment, plan_experiment

TRUTH = Truth(break_even={"native": 0.35}, gain_slope=2000.0)
PILOT = 90  # windows (1.5 h) per engine: too few to tell
REPS = 30


def _frame(windows: int, seed: int, noise: float) -> pd.DataFrame:
    """8 engines, 2 with native offload; engine SD a tenth of the window noise."""
    return synthetic_frame(
        8, windows, seed=seed, truth=TRUTH, modes=("none", "none", "none", "native"),
        noise_tokens_per_s=noise, engine_sd_tokens_per_s=noise / 10.0,
    )  # fmt: skip


def _planned(seed: int, noise: float) -> tuple[Design, float]:
    frame = _frame(PILOT, seed, noise)
    fit = fit_gain(frame, offload="native")
    u_now = float(frame["kv_util"].median())
    assert needs_experiment(fit, u_now)
    design = plan_experiment(frame, fit, u_now)
    assert design is not None and design.reachable
    return design, u_now


def _true_log_gain(u: float) -> float:
    """The generator's gain as a log ratio at u (its mean engine: 1500 + 9000·u tokens/s)."""
    none = 1500.0 + 9000.0 * u
    return math.log1p(TRUTH.gain_slope * (u - TRUTH.break_even["native"]) / none)


@pytest.mark.parametrize(("seed", "noise"), [(25, 300.0), (28, 600.0)])
def test_planned_se_and_power_match_a_monte_carlo_of_the_fit(seed: int, noise: float) -> None:
    design, _ = _planned(seed, noise)
    ses: list[list[float]] = [[] for _ in design.targets]
    hits = [0 for _ in design.targets]
    for r in range(REPS):
        full = _frame(PILOT + int(design.hours * 60), 10_000 + r, noise)
        since = float(full["start"].min()) + PILOT * 60.0
        fit = fit_gain(
            switch_engines(full, design.switch, since, "native", TRUTH), offload="native"
        )
        n_eng = sum(c for _, c in fit.engines_by_mode)
        tq = t_quantile(0.95, n_eng - 1)
        for i, t in enumerate(design.targets):
            p = min(fit.grid, key=lambda q: abs(q.u - t.u))
            lo, hi = (math.log1p(x) for x in (p.relative_interval.lo, p.relative_interval.hi))
            se = (hi - lo) / (2 * tq)
            ses[i].append(se)
            # the estimate's error, moved to the planned effect: detected with the power?
            err = math.log1p(p.relative) - _true_log_gain(p.u)
            hits[i] += abs(t.delta + err) > tq * se
    for i, t in enumerate(design.targets):
        achieved = math.sqrt(float(np.mean(np.square(ses[i]))))
        ratio = achieved / design.se_planned[i]
        power = hits[i] / REPS
        print(
            f"{t.what}: planned se {design.se_planned[i]:.4f} achieved {achieved:.4f} "
            f"(x{ratio:.2f}); power planned {design.power[i]:.2f}, achieved {power:.2f}"
        )
        # measured (these seeds): gain targets x0.71, break-even x0.79 and x1.85 — the second
        # break-even target sits at the support's low edge, where the refit on more data
        # chooses more knots (cross-validation) and a point costs more than the pilot said
        assert 0.5 <= ratio <= (1.25 if t.what == "gain" else 2.0)
        assert power >= design.power[i] - (0.15 if t.what == "gain" else 0.4)


def test_a_fit_that_can_tell_plans_nothing() -> None:
    frame = _frame(600, 3, 300.0)
    fit = fit_gain(frame, offload="native")
    u_now = float(frame["kv_util"].median())
    assert fit.can_tell and not needs_experiment(fit, u_now)
    assert plan_experiment(frame, fit, u_now) is None


def test_more_engines_not_more_hours_once_the_engine_spread_dominates() -> None:
    design, _ = _planned(25, 300.0)
    noise = design.noise
    floor = noise.sigma_b * math.sqrt(1 / design.treated + 1 / (design.engines - design.treated))
    assert all(s >= floor for s in design.se_planned)
    assert len(design.switch) == design.treated - 2  # the 2 native engines stay in the arm
    assert any("engines, not the windows" in a for a in design.assumptions)


def test_study_case_is_seeded_and_its_design_is_the_one_run() -> None:
    from benchmarks.accuracy.heldout5 import case
    from benchmarks.accuracy.study_experiment import run_case

    a, b = run_case(case(2)), run_case(case(2))
    a.pop("seconds")
    b.pop("seconds")
    assert a == b
    assert a["pilot"]["needs"] and "design" in a and "after" in a
