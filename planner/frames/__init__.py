"""planner.frames."""
