"""Schema creation and upgrades: ``migrate(db)`` and the steps from each older version.

Each step of MIGRATIONS turns version n into n + 1 inside migrate()'s one transaction, after
create_all() has added any new table. Schema 10 keeps windows once (series, head, chunks:
store/tables.py); the step from 9 moves every window of ``windows`` there and drops
``windows`` and its packed copy, so the steps before it that only reshaped those tables
(partitions, packs, indexes) have nothing left to do.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import Connection, delete, insert, inspect, text

from core.errors import StoreError
from store import partitions
from store.db import Database
from store.tables import SCHEMA_VERSION, Base, SchemaVersionRow
from store.windows_v9 import move_windows

_PG_MIGRATE_LOCK = 0x6B7673636F7065  # pg_advisory_xact_lock key ("kvscope")
_MODES_8 = ("native", "lmcache")
_ENDS_8 = ("", "_lo", "_hi")


def _plans_8(conn: Connection) -> None:
    """Schema 7 -> 8: the plans' gain_<mode>_now columns were a throughput gain at equal KV
    use; they keep their values under that name (equal_kv_gain_<mode>), and the capacity
    ratio at the SLO gets columns of its own (None for plans made before)."""
    have = {c["name"] for c in inspect(conn).get_columns("plans")}
    for m in _MODES_8:
        for end in _ENDS_8:
            old, new, cap = f"gain_{m}_now{end}", f"equal_kv_gain_{m}{end}", f"capacity_{m}{end}"
            if old in have and new not in have:
                conn.execute(text(f"ALTER TABLE plans RENAME COLUMN {old} TO {new}"))
            if cap not in have:
                conn.execute(text(f"ALTER TABLE plans ADD COLUMN {cap} DOUBLE PRECISION"))


def _nothing(_conn: Connection) -> None:
    """A step whose table create_all() has just added, or that reshaped ``windows`` (9 -> 10
    replaces it)."""


# 1-2 plans, 2-3 engine_changes, 3-4 rollup_states (tables create_all() adds); 4-5 windows
# partitioned, 5-7 packed hours, 8-9 windows.buckets (9 -> 10 replaces what they shaped)
MIGRATIONS: dict[int, Callable[[Connection], None]] = {
    1: _nothing,
    2: _nothing,
    3: _nothing,
    4: _nothing,
    5: _nothing,
    6: _nothing,
    7: _plans_8,
    8: _nothing,
    9: move_windows,  # every window into series, head and chunks; windows dropped
}


def migrate(db: Database) -> int:
    """Create or upgrade the schema (idempotent, safe to race); return the version."""
    with db.tx("migrate", write=True) as conn:
        if db.dialect == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATE_LOCK})
        version = db.read_version(conn)
        if version is not None and version > SCHEMA_VERSION:
            raise StoreError(db.version_message(version))
        if db.dialect == "postgresql":  # chunks, chunks_5m: partitioned (store.partitions)
            missing = [p for p in partitions.PARENTS if not inspect(conn).has_table(p)]
            tables = [t for t in Base.metadata.sorted_tables if t.name not in partitions.PARENTS]
            Base.metadata.create_all(conn, tables=tables, checkfirst=True)
            for parent in missing:
                partitions.create(conn, parent)
        else:
            Base.metadata.create_all(conn, checkfirst=True)
        for step in range(SCHEMA_VERSION if version is None else version, SCHEMA_VERSION):
            if step not in MIGRATIONS:
                raise StoreError(f"{db.url}: no upgrade path from schema version {step}")
            MIGRATIONS[step](conn)
        conn.execute(delete(SchemaVersionRow))
        conn.execute(
            insert(SchemaVersionRow).values(id=1, version=SCHEMA_VERSION, migrated_at=time.time())
        )
    db.schema_ok = True
    return SCHEMA_VERSION
