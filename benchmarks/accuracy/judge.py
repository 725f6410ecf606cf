"""Judging one fit against its truth: the scoring rules of benchmarks/accuracy/study.py (its
docstring defines the outcomes) and the gain comparison at three utilizations."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from benchmarks.accuracy.truth import Crossing, TruthCurve

if TYPE_CHECKING:
    from planner.fit.gain import GainFit

TOLERANCE = 0.05  # ±5 percentage points of utilization
# one-sided verdicts of planner.fit.gain: the sign they claim where the data tell it
BOUNDS = {"positive_above": "positive", "negative_below": "negative"}


@dataclass(frozen=True, slots=True)
class GainCheck:
    """True and fitted relative gain at one utilization."""

    u: float
    true: float
    fitted: float
    lo: float
    hi: float

    @property
    def covered(self) -> bool:
        return self.lo <= self.true <= self.hi


@dataclass(frozen=True, slots=True)
class ModeResult:
    """One offload mode of one case: truth, fit and the verdict of the comparison."""

    mode: str
    outcome: str
    true_u: float | None  # first true crossing inside the fit's support (None: none)
    true_lo: float | None  # 90 % bootstrap interval of that crossing
    true_hi: float | None
    true_sign: str  # crosses | positive | negative | unknown (on the fit's support)
    truth_determinate: bool
    true_crossings: tuple[float, ...]  # every true crossing on the truth's support
    fitted_u: float | None
    lo: float | None
    hi: float | None
    open_lo: bool
    open_hi: bool
    error_pp: float | None
    covered: bool | None
    can_tell: bool
    verdict: str
    why: str
    support: tuple[float, float]
    truth_support: tuple[float, float]
    gains: tuple[GainCheck, ...]
    cov_type: str
    windows: int


def judge(truth: TruthCurve, fit: GainFit) -> ModeResult:
    """Compare one fit with its truth (scoring rules in the module docstring)."""
    lo, hi = fit.support
    has_support = math.isfinite(lo) and math.isfinite(hi)
    sign = truth.sign_on(lo, hi) if has_support else "unknown"
    first = truth.first_in(lo, hi) if has_support else None
    true_u = first.u if first else None
    if first is not None:
        determinate = first.hi - first.lo <= TOLERANCE
    else:
        determinate = sign in ("positive", "negative")
    reported = fit.verdict == "crosses"
    ranged = reported or fit.verdict in BOUNDS  # an interval on u*, two-sided or a bound
    f_u = fit.estimate if reported else None
    i_lo, i_hi = (fit.interval.lo, fit.interval.hi) if ranged else (None, None)
    open_lo = bool(ranged and i_lo is not None and i_lo <= lo + 1e-12)
    open_hi = bool(ranged and i_hi is not None and i_hi >= hi - 1e-12)
    error = covered = None
    if reported and true_u is not None and f_u is not None:
        error = 100.0 * (f_u - true_u)
    if ranged and i_lo is not None and i_hi is not None and true_u is not None:
        covered = (open_lo or i_lo <= true_u) and (open_hi or true_u <= i_hi)
    outcome = _outcome(
        fit, sign, first, error, i_lo=i_lo, i_hi=i_hi, open_lo=open_lo, open_hi=open_hi
    )
    if not determinate:
        outcome = "truth_flat"
    return ModeResult(
        mode=truth.mode, outcome=outcome, true_u=true_u,
        true_lo=first.lo if first else None, true_hi=first.hi if first else None,
        true_sign=sign, truth_determinate=determinate,
        true_crossings=tuple(c.u for c in truth.crossings), fitted_u=f_u, lo=i_lo, hi=i_hi,
        open_lo=open_lo, open_hi=open_hi, error_pp=error, covered=covered,
        can_tell=fit.can_tell, verdict=fit.verdict, why=fit.why, support=(lo, hi),
        truth_support=truth.support, gains=_gain_checks(truth, fit), cov_type=fit.cov_type,
        windows=fit.n,
    )  # fmt: skip


def _outcome(
    fit: GainFit, sign: str, first: Crossing | None, error: float | None, *,
    i_lo: float | None, i_hi: float | None, open_lo: bool, open_hi: bool,
) -> str:  # fmt: skip
    if fit.verdict == "crosses":
        if first is None:
            return "false_crossing" if fit.can_tell else "cannot_tell"
        if not fit.can_tell:
            return "cannot_tell"
        assert error is not None and i_lo is not None and i_hi is not None
        if abs(error) <= 100 * TOLERANCE:
            return "ok"
        miss = max(i_lo - first.u if not open_lo else 0.0, first.u - i_hi if not open_hi else 0.0)
        return "confidently_wrong" if miss > TOLERANCE else "off"
    if fit.verdict in BOUNDS:
        claimed = BOUNDS[fit.verdict]
        if first is None:
            return "bound_holds" if sign == claimed else "wrong_sign"
        assert i_lo is not None and i_hi is not None
        # "u* <= i_hi" (positive gain above) or "u* >= i_lo" (negative below), within ±5 pp
        holds = (
            first.u <= i_hi + TOLERANCE if claimed == "positive" else first.u >= i_lo - TOLERANCE
        )
        return "bound_holds" if holds else "bound_wrong"
    if fit.verdict in ("positive_throughout", "negative_throughout"):
        claimed = fit.verdict.split("_")[0]
        if sign == claimed:
            return "agrees_none"
        if first is None:
            return "wrong_sign"
        # "no break-even in [lo, hi]" puts u* beyond the edge where the claimed sign starts:
        # right to within the tolerance when the true crossing is that close to the edge
        lo, hi = fit.support
        edge = lo if (claimed == "positive") == first.rising else hi
        return "agrees_edge" if abs(first.u - edge) <= TOLERANCE else "missed"
    return "cannot_tell"


def _gain_checks(truth: TruthCurve, fit: GainFit) -> tuple[GainCheck, ...]:
    """Relative gain, true vs fitted (with its pointwise 90 % interval), at 20/50/80 % of the
    utilizations both cover."""
    if not fit.grid:
        return ()
    a = max(fit.support[0], truth.support[0])
    b = min(fit.support[1], truth.support[1])
    if not a < b:
        return ()
    us = [p.u for p in fit.grid]
    out = []
    for q in (0.2, 0.5, 0.8):
        u = a + q * (b - a)
        out.append(
            GainCheck(
                u=u,
                true=truth.gain(u),
                fitted=_lin(u, us, [p.relative for p in fit.grid]),
                lo=_lin(u, us, [p.relative_interval.lo for p in fit.grid]),
                hi=_lin(u, us, [p.relative_interval.hi for p in fit.grid]),
            )
        )
    return tuple(out)


def _lin(u: float, xs: list[float], ys: list[float]) -> float:
    return float(np.interp(u, xs, ys))
