"""planner.fit."""
