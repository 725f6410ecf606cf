"""Time to HBM saturation from a forecast band, and the simulated crossing probability.

Crossing times of the interpolated point forecast and of the band's bounds (not quantiles
of a first-passage time); the probability of reaching capacity within the horizon from
200–1000 seeded simulated paths, with its Monte Carlo standard error, or the rule-of-three
bound when no path (or every path) saturates (Hanley & Lippman-Hand 1983, JAMA 249(13)).

Method: planner/forecast/METHODS.md#saturation
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.forecast.models import Fitted, crossing_probability

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    FloatArray = npt.NDArray[np.float64]

SIMULATED_PATHS = 1000
MIN_SIMULATED_PATHS = 200
MAX_SIM_DRAWS = 2_000_000  # paths × steps: ~3 s of ETS simulation for 10^4 steps here


def simulated_paths(steps: int) -> int:
    """Paths for a horizon of ``steps`` buckets (a function of the horizon only)."""
    return max(MIN_SIMULATED_PATHS, min(SIMULATED_PATHS, MAX_SIM_DRAWS // max(steps, 1)))


RULE_OF_THREE_LEVEL = 0.95  # -ln(0.05) = 3.0: Hanley & Lippman-Hand 1983, JAMA 249(13)


def rule_of_three(probability: float | None, paths: int | None) -> dict[str, Any] | None:
    """The 95 % bound on a simulated probability of exactly 0 or 1 (else None).

    None of ``paths`` independent paths saturating bounds P below 3/paths at 95 % (one-sided;
    from (1 - P)^paths = 0.05, -ln 0.05 ≈ 3); all of them saturating bounds it above
    1 - 3/paths (Hanley & Lippman-Hand 1983, JAMA 249(13):1743-1745). Here the Monte Carlo
    standard error sqrt(p(1-p)/paths) is 0 and says nothing.
    """
    if probability is None or not paths or probability not in (0.0, 1.0):
        return None
    width = min(3.0 / paths, 1.0)
    none = probability == 0.0
    what = (
        f"no path of {paths} saturates: P < 3/{paths}"
        if none
        else f"all {paths} paths saturate: P > 1 - 3/{paths}"
    )
    return {
        "lo": 0.0 if none else 1.0 - width,
        "hi": width if none else 1.0,
        "level": RULE_OF_THREE_LEVEL,
        "paths": paths,
        "saturating_paths": 0 if none else paths,
        "method": f"rule of three (Hanley & Lippman-Hand 1983, JAMA 249(13)): {what}",
    }


def crossing(prev: float, values: FloatArray, capacity: float, cadence: float) -> float | None:
    """Seconds after the origin when the midpoint-interpolated ``values`` reach capacity."""
    for j, v in enumerate(values):
        if v >= capacity:
            before = prev if j == 0 else float(values[j - 1])
            frac = 1.0 if v == before else (capacity - before) / (v - before)
            return max(0.0, (j - 0.5 + min(max(frac, 0.0), 1.0)) * cadence)
    return None


@dataclass(frozen=True, slots=True)
class Saturation:
    """Seconds after the forecast origin (None: not within the horizon)."""

    ts: float | None
    lo: float | None
    hi: float | None
    probability: float | None
    note: str
    paths: int | None = None
    se: float | None = None  # Monte Carlo standard error of ``probability``


def capacity_notes(history: FloatArray, capacity: float, agg: str) -> list[str]:
    """What a time to saturation from this history rests on (for ``Forecast.assumptions``)."""
    notes = []
    if agg == "mean":
        notes.append(
            "saturation judged on bucket means: peaks inside a bucket run higher "
            "(agg='max' forecasts the bucket peaks instead)"
        )
    if float(history.max()) >= 0.95 * capacity:
        notes.append(
            "history reaches >= 95 % of capacity: observed usage is censored there "
            "(vLLM queues or preempts instead of exceeding it), so demand above capacity "
            "is unseen and the trend may be understated"
        )
    return notes


def saturation(
    final: Fitted,
    y: FloatArray,
    band: tuple[FloatArray, FloatArray, FloatArray],
    *,
    scale: float,
    capacity: float,
    seed: int,
    simulate: bool,
) -> Saturation:
    """Band crossings (caller units; ``band`` = mean, lo, hi) and the crossing probability."""
    mean, lo, hi = band
    last = float(y[-1]) * scale
    if last >= capacity:
        note = f"already saturated: the last bucket ({last:.6g}) >= capacity {capacity:.6g}"
        return Saturation(0.0, 0.0, 0.0, 1.0, note)
    cad = final.cadence_s
    ts = crossing(last, mean, capacity, cad)
    ts_lo = crossing(last, hi, capacity, cad)
    ts_hi = crossing(last, lo, capacity, cad)
    note = (
        f"reaches capacity: point forecast {_hours(ts)}, "
        f"upper bound {_hours(ts_lo)}, lower bound {_hours(ts_hi)}; "
        f"peak forecast {mean.max() / capacity:.0%} of capacity"
    )
    prob = se = None
    paths = simulated_paths(len(mean))
    if simulate:
        prob = crossing_probability(final, y, len(mean), capacity / scale, seed=seed, paths=paths)
    else:
        note += "; crossing probability skipped (time budget)"
    if prob is None:
        return Saturation(ts, ts_lo, ts_hi, None, note)
    se = math.sqrt(prob * (1.0 - prob) / paths)
    return Saturation(ts, ts_lo, ts_hi, prob, note, paths, se)


def _hours(s: float | None) -> str:
    return "not within the horizon" if s is None else f"in {s / 3600:.1f} h"
