"""planner.advise."""
