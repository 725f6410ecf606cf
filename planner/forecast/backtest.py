"""Rolling-origin backtest of one fitted candidate (Tashman 2000), shared origins for all.

``plan_backtest`` places 5–24 origins over the last part of the history, each holding out
``h_b`` buckets; ``backtest`` forecasts from each with the parameters fixed (no look-ahead)
and pools coverage, MAPE, MASE (Hyndman & Koehler 2006) and the interval score (Gneiting &
Raftery 2007, eq. 43) that ranks the candidates. Pooled points are serially correlated:
the figures are indicative.

Method: planner/forecast/METHODS.md#backtest
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from planner.forecast.data import SeriesError
from planner.forecast.models import Fitted, predict

if TYPE_CHECKING:
    import numpy.typing as npt

    FloatArray = npt.NDArray[np.float64]

MAX_ORIGINS = 24
MIN_ORIGINS = 3
BACKTEST_TARGET_POINTS = 60


def plan_backtest(n: int, steps: int, train_min: int) -> tuple[int, list[int]]:
    """(h_b, origins): origins are the indices of the first held-out point, ascending."""
    hb = min(steps, n - train_min)
    while hb >= 1:
        spacing = max(1, hb // 2)
        wanted = min(MAX_ORIGINS, max(5, math.ceil(BACKTEST_TARGET_POINTS / hb)))
        k = min(wanted, (n - train_min - hb) // spacing + 1)
        if k >= MIN_ORIGINS or hb == 1:
            return hb, [n - hb - i * spacing for i in reversed(range(k))]
        hb //= 2
    return 0, []


@dataclass(frozen=True, slots=True)
class Scores:
    interval_score: float
    coverage: float
    mape: float | None
    mase: float | None
    points: int


def backtest(
    f: Fitted, y: FloatArray, *, origins: list[int], hb: int, level: float, mase_den: float
) -> Scores:
    alpha = 1.0 - level
    actual, mean, lo, hi = [], [], [], []
    for o in origins:
        m, lower, upper = predict(f, y[:o], hb, level)
        actual.append(y[o : o + hb])
        mean.append(np.maximum(m, 0.0))
        lo.append(np.maximum(lower, 0.0))
        hi.append(np.maximum(upper, 0.0))
    a, m_, lo_, hi_ = (np.concatenate(x) for x in (actual, mean, lo, hi))
    if not (np.isfinite(m_).all() and np.isfinite(lo_).all() and np.isfinite(hi_).all()):
        raise SeriesError(f"{f.spec.label}: non-finite forecast in the backtest")
    score = (hi_ - lo_) + (2 / alpha) * ((lo_ - a) * (a < lo_) + (a - hi_) * (a > hi_))
    err = np.abs(a - m_)
    abs_a = np.abs(a)
    near_zero = abs_a.min() < 0.05 * max(abs_a.mean(), 1e-12)
    return Scores(
        interval_score=float(score.mean()),
        coverage=float(np.mean((a >= lo_) & (a <= hi_))),
        mape=None if near_zero else float(100 * np.mean(err / abs_a)),
        mase=float(err.mean() / mase_den) if mase_den > 0 else None,
        points=len(a),
    )
