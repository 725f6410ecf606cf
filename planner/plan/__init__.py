"""planner.plan."""
