"""benchmarks.accuracy.study: the fitted offload break-even against the simulator's own A/B truth.

The fast test runs two chat cases (the family with a load-driven break-even) of the
``test`` split with the FAST budget; the slow one four ``dev`` cases with the study's
budget. Both check the study's promise: the fitted break-even is within ±5 pp of a
determinate truth or the fit says it cannot tell, and it is never confidently wrong.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from benchmarks.accuracy.fitsynth import synthetic_frame
from benchmarks.accuracy.judge import TOLERANCE, ModeResult, judge
from benchmarks.accuracy.scenarios import HELDOUT_SET, HELDOUT_SETS, draw
from benchmarks.accuracy.study import FAST, FULL, CaseResult, run_case
from benchmarks.accuracy.truth import LevelResult, TruthCurve, truth_curve
from core.errors import ConfigError
from planner.fit.common import Interval
from planner.fit.gain import fit_gain

WRONG = ("confidently_wrong", "false_crossing", "wrong_sign", "missed", "off", "bound_wrong")


def _check(result: CaseResult) -> list[ModeResult]:
    for m in result.modes:
        assert m.outcome not in WRONG, (result.name, m)
        if m.truth_determinate and m.true_u is not None and m.can_tell:
            assert m.error_pp is not None and abs(m.error_pp) <= 100 * TOLERANCE, m
        # never confidently wrong: a fitted interval may miss a true crossing only by little
        if m.true_u is not None and m.lo is not None and m.hi is not None:
            assert m.true_lo is not None and m.true_hi is not None
            gap = max(m.lo - m.true_hi, m.true_lo - m.hi, 0.0)
            assert gap <= TOLERANCE, (result.name, m)
    return list(result.modes)


@pytest.mark.slow  # ~70 s of simulation: `make test-slow` (and CI) runs it
def test_accuracy_fast_chat_cases_within_tolerance_or_cannot_tell() -> None:
    modes = [m for i in (1, 2) for m in _check(run_case(draw("test", i), FAST))]
    # not vacuous: the truth located a break-even and the fit answered about the gains.
    # With 2 engines a mode the CR2 intervals use Bell-McCaffrey degrees of freedom
    # (planner/fit/cr2.py), and both cases' break-evens are "cannot tell" (with t(G-1)
    # they were answered); `kvscope plan` then prints the experiment that settles it
    # (tests/planner/test_experiment*.py). What the fit still says must hold: its gain
    # intervals at the measured levels cover the simulator's true gain (5 of 6 here).
    assert any(m.true_u is not None for m in modes)
    gains = [g for m in modes for g in m.gains]
    assert len(gains) >= 4
    for g in gains:
        assert math.isfinite(g.true) and g.lo <= g.fitted <= g.hi
    covered = sum(g.lo <= g.true <= g.hi for g in gains)
    assert covered >= 2 * len(gains) / 3, [(g.lo, g.true, g.hi) for g in gains]


@pytest.mark.slow
@pytest.mark.timeout(900)  # the full budget: it overran 300 s on a shared 2-core machine
def test_accuracy_dev_cases_within_tolerance_or_cannot_tell() -> None:
    modes = [m for i in range(4) for m in _check(run_case(draw("dev", i), FULL))]
    assert sum(m.truth_determinate for m in modes) >= 2


def _level(mode: str, rate: float, u: float, tp: float, swap: bool = False) -> LevelResult:
    """One measured level with three batches whose u differ by ±1 % (``swap``: in the
    opposite order, so the two arms' batch noise does not cancel in the bootstrap)."""
    us = (u * 1.01, u * 0.99, u) if swap else (u * 0.99, u * 1.01, u)
    return LevelResult(mode, rate, 1, u, tp, 0, math.nan, 0.0, us, (tp,) * 3, tp)


def _rising_truth() -> TruthCurve:
    """Same offered rates and throughputs; offload needs 10 % less KV above rate 2 and 2 %
    more below: the gain tp_off(u)/tp_none(u) - 1 changes sign between u 0.2 and 0.4."""
    rates = [1.0, 2.0, 3.0, 4.0]
    none = [_level("none", r, 0.1 * r * r / 1.6, 1000.0 * r) for r in rates]
    off = [
        _level("native", r, p.u * (1.02 if r <= 2 else 0.9), p.tp)
        for r, p in zip(rates, none, strict=True)
    ]
    return truth_curve("native", none, off, seed=1)


def test_truth_curve_locates_the_crossing_of_the_utilization_matched_gain() -> None:
    curve = _rising_truth()
    [crossing] = curve.crossings
    assert crossing.rising and 0.25 < crossing.u < 0.6
    assert crossing.lo <= crossing.u <= crossing.hi
    assert curve.gain(curve.support[0]) < 0 < curve.gain(curve.support[1])
    assert curve.sign_on(crossing.u + 0.05, 1.0) == "positive"
    assert curve.sign_on(0.0, crossing.lo - 0.01) == "negative"


def test_judge_flat_truth_is_not_scored() -> None:
    rates = [1.0, 2.0, 3.0]
    none = [_level("none", r, 0.2 * r, 1000.0 * r) for r in rates]
    off = [
        _level("native", r, 0.2 * r * (1.0 + 0.001 * (r - 2)), 1000.0 * r, swap=True) for r in rates
    ]
    curve = truth_curve("native", none, off, seed=2)
    assert curve.crossings == () and curve.sign_on(0.0, 1.0) == "flat"
    frame = synthetic_frame(20, 240, seed=1, modes=("none", "native"))
    result = judge(curve, fit_gain(frame, offload="native", level=0.9))
    assert result.outcome == "truth_flat" and not result.truth_determinate


@pytest.mark.parametrize(("shift", "outcome"), [(0.0, "bound_holds"), (-0.2, "bound_wrong")])
def test_judge_one_sided_bound_holds_or_is_wrong(shift: float, outcome: str) -> None:
    truth = _rising_truth()
    [crossing] = truth.crossings
    fit = fit_gain(synthetic_frame(20, 240, seed=1, modes=("none", "native")), level=0.9)
    lo, _ = fit.support
    # "gain > 0 from u_1 on: u* <= u_1", with u_1 at the true crossing or 20 pp below it
    bound = replace(
        fit, verdict="positive_above", estimate=math.nan,
        interval=Interval(lo, crossing.u + 0.01 + shift, 0.9),
    )  # fmt: skip
    result = judge(truth, bound)
    assert result.outcome == outcome and result.open_lo and not result.open_hi
    assert result.fitted_u is None and result.covered is (outcome == "bound_holds")
    assert ("bound_wrong" in WRONG) and (outcome in WRONG) is (outcome == "bound_wrong")


def test_heldout_sets_draw_their_own_cases_and_an_unknown_set_is_named() -> None:
    current = draw("heldout", 0)
    assert current == draw("heldout", 0, HELDOUT_SET)
    assert len({draw("heldout", 0, s).seed for s in HELDOUT_SETS}) == len(HELDOUT_SETS)
    assert draw("dev", 0, 3) == draw("dev", 0)  # the set applies to the held-out split only
    with pytest.raises(ConfigError, match="held-out set 99: choose one of"):
        draw("heldout", 0, 99)
