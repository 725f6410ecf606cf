"""Forecasts of KV demand and request rate, with backtests and time to saturation.

- ``data``: the demand series from windows; ``models``: naive / ETS / SARIMAX candidates;
- ``backtest``: rolling-origin interval scores that choose the model and report coverage;
- ``saturation``: time to HBM saturation and P(saturation) by simulated paths;
- ``implied_kv``: KV implied by the request-rate forecast (Little's law);
  ``kv_rate_agreement``: do the two forecasts tell the same story;
- ``demand``: :func:`forecast_demand`, the whole forecast of one series.
"""

from planner.forecast.data import demand_series_from_windows
from planner.forecast.demand import Forecast, forecast_demand

__all__ = ["Forecast", "demand_series_from_windows", "forecast_demand"]
