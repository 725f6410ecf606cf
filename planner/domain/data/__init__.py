"""Data files shipped with the planner (hardware.yaml: GPUs, models, storage tiers)."""
