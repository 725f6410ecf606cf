"""planner.report."""
