"""kvscope planner/simulate."""
