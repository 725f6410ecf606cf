"""Rolling-origin backtest of one fitted candidate (Tashman 2000), shared origins for all.

Origins are the indices of the first held-out bucket. ``plan_backtest`` puts them over the
last part of the history: each holds out ``h_b`` buckets (the forecast horizon when the
history allows, halved until >= 3 origins fit), origins are ``h_b // 2`` apart (so held-out
stretches overlap and start at different times of day), 5 to 24 of them, aiming at >= 60
held-out points, and the first origin leaves ``train_min`` buckets to fit on.

``backtest`` forecasts from every origin with the parameters fixed (estimated once on the
data before the first origin: no look-ahead) and pools every (origin, step):
- coverage: the share of held-out values inside the clipped (>= 0) interval;
- MAPE (%): withheld (None) when some actual is < 5 % of the mean actual, where it explodes;
- MASE: mean absolute error / in-sample MAE of the (seasonal) naive forecast on the training
  data (Hyndman & Koehler 2006), None when that MAE is 0 (a constant series);
- interval score (Gneiting & Raftery 2007, eq. 43): width + (2/alpha) x the miss distance,
  the proper score the candidates are ranked by.
The pooled points are serially correlated (overlapping windows, autocorrelated errors), so
these figures are indicative, not tight estimates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner.forecast.data import SeriesError
from planner.forecast.models import Fitted, predict

if TYPE_CHECKING:
    import numpy as np
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
    import numpy as np

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
