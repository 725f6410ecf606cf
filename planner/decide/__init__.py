"""planner.decide."""
