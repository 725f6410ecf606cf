"""kvscope planner: cost model, fits, decisions, forecasts, sizing and the cluster simulator."""
