"""Do the KV-demand and request-rate forecasts of a plan tell the same story?

Both are extrapolated separately (planner/plan/forecast.py), so they can contradict: a trend
model can take the request rate to 4× while the KV forecast stays flat. At a fixed request
mix the KV in use follows the request rate (Little's law: requests in the engine = rate ×
time each spends there), so their growth ratios over the same horizon should agree within
their intervals. This module compares them; it hides neither: both forecasts are reported
with their backtest scores, and a note says when they disagree. Which one sizing follows is
decided in planner/forecast/implied_kv.py (the KV the rate forecast implies, by Little's law with
factors measured on the same history).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from planner.forecast.demand import Forecast

NOW_WINDOW_S = 3600.0  # "now" = the mean of the last hour of history (as kv_evidence)


def growth(fc: Forecast, series: pd.Series, at: float) -> dict[str, Any] | None:
    """The forecast's point at or before epoch `at` over the last hour of history:
    (ratio, lo, hi) at the forecast's level, with the backtest scores beside it."""
    points = [p for p in fc.points if p[0] <= at] or list(fc.points[:1])
    if not points or series is None or not len(series):
        return None
    last = series[series.index >= float(series.index.max()) - NOW_WINDOW_S]
    now = float(last.mean())
    t, mean, lo, hi = points[-1]
    if not (math.isfinite(now) and now > 0 and all(map(math.isfinite, (mean, lo, hi)))):
        return None
    return {
        "now": now,
        "at_epoch": t,
        "forecast": mean,
        "ratio": mean / now,
        "ratio_lo": min(lo, mean) / now,
        "ratio_hi": max(hi, mean) / now,
        "level": fc.level,
        "method": fc.method,
        "backtest_coverage": fc.backtest_coverage,
        "backtest_mase": fc.backtest_mase,
        "backtest_origins": fc.backtest_origins,
        "backtest_horizon_s": fc.backtest_horizon_steps * fc.cadence_s,
        "history_s": float(series.index.max() - series.index.min()) + fc.cadence_s,
    }


def _scores(name: str, g: dict[str, Any]) -> str:
    cov, mase = g["backtest_coverage"], g["backtest_mase"]
    return (
        f"{name} {g['method']}: backtest coverage "
        f"{'n/a' if cov is None else f'{cov:.0%}'}, MASE {'n/a' if mase is None else f'{mase:.2f}'}"
        f" over {g['backtest_origins']} origins, {g['backtest_horizon_s'] / 3600:.2g} h ahead"
    )


def compare(
    kv: Forecast | None,
    kv_series: pd.Series | None,
    rate: Forecast | None,
    rate_series: pd.Series | None,
    capacity: float | None,
) -> dict[str, Any] | None:
    """Growth of both forecasts to the same time (the earlier of their last points), whether
    their intervals overlap, and a note when they do not. None unless both exist."""
    if kv is None or rate is None or kv_series is None or rate_series is None:
        return None
    if not kv.points or not rate.points:
        return None
    at = min(kv.points[-1][0], rate.points[-1][0])
    g_kv, g_rate = growth(kv, kv_series, at), growth(rate, rate_series, at)
    if g_kv is None or g_rate is None:
        return None
    agree = g_kv["ratio_lo"] <= g_rate["ratio_hi"] and g_rate["ratio_lo"] <= g_kv["ratio_hi"]
    out: dict[str, Any] = {"kv_demand": g_kv, "request_rate": g_rate, "agree": agree, "note": ""}
    if agree:
        return out
    ahead = (at - max(kv.origin_epoch, rate.origin_epoch)) / 3600

    def iv(g: dict[str, Any]) -> str:
        return f"{g['ratio']:.2g}× [{g['ratio_lo']:.2g}, {g['ratio_hi']:.2g}]"

    note = (
        f"the forecasts disagree: {ahead:.3g} h ahead the request rate grows {iv(g_rate)} "
        f"but KV demand {iv(g_kv)} ({g_kv['level']:.0%} intervals, no overlap). At a fixed "
        "request mix KV in use follows the request rate (Little's law), so at least one "
        f"extrapolation is off; {_scores('request rate', g_rate)}; "
        f"{_scores('KV demand', g_kv)}; history {g_kv['history_s'] / 3600:.2g} h"
    )
    if capacity is not None and capacity > 0:
        implied = g_kv["now"] * g_rate["ratio"]
        out["kv_implied_by_rate"] = implied
        if implied > capacity:
            note += (
                f". At the request rate's growth KV demand would reach {implied:,.0f} "
                f"({implied / capacity:.2g}× the HBM KV capacity): saturation, if that rate "
                "forecast holds"
            )
    out["note"] = note
    return out
