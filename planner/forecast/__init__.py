"""planner.forecast."""
