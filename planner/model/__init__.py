"""planner.model."""
