"""kvscope advisory API (FastAPI), thin over planner and store."""
