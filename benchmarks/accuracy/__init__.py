"""The planner accuracy study: synthetic telemetry, simulator A/B truth and the judge (not
shipped)."""
