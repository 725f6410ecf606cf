"""planner.deploy."""
