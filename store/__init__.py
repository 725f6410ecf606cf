"""kvscope's SQL store (SQLite or PostgreSQL): ``store.store.Store`` is its public face.

tables (the schema), db (connection and transactions), series, chunks (the closed hours'
format), writes, reads and frame (windows in and out), retention, partitions (PostgreSQL),
migrate and windows_v9 (upgrades), inventory, plans and handoff (the small tables).
It imports core and store only; the collector writes through it, planner and api read.
"""
