"""Packed hours (collector/store_blocks.py, schema 6) on a real SQLite file and a real
PostgreSQL 15: read_frame gives the same frame from the packs as from the rows, a re-written
window is never counted twice, migration 5 -> 6 keeps every row, and retention drops packs."""

from __future__ import annotations

import math
import sqlite3
from dataclasses import replace
from typing import Any

import pandas as pd
import pytest
import sqlalchemy

from collector.records import Labels, Window
from collector.store import Store
from collector.store_blocks import BLOCK_S
from collector.store_frame import windows_frame

T0 = 1_764_000_000.0 - 1_764_000_000.0 % BLOCK_S  # an hour boundary
HOURS = 3


def _win(source: str, signal: str, start: float, value: float | None, model: str) -> Window:
    labels: Labels = (("engine", source), ("model_name", model))
    kind = "gauge" if "usage" in signal else "counter"
    rate = None if value is None else value / 60
    return Window(source, signal, labels, start, 60.0, kind, 4, delta=value, rate=rate,  # type: ignore[arg-type]
                  mean=value, p99=math.nan if value is None else value * 2)  # fmt: skip


def history(value_of: Any = None) -> list[Window]:
    """Two sources, two signals (one with two label sets), HOURS hours of minutes; some NULLs."""
    out = []
    for m in range(HOURS * 60):
        for s, source in enumerate(("e1", "e2")):
            for signal, models in (("kv_usage", ("a",)), ("prompt_tokens", ("a", "b"))):
                for model in models:
                    value = None if m % 17 == 0 else s + m / 7 + len(model)
                    if value_of is not None:
                        value = value_of(source, signal, m, value)
                    out.append(_win(source, signal, T0 + 60.0 * m, value, model))
    return out


def _count(db_url: str, table: str) -> int:
    engine = sqlalchemy.create_engine(db_url)
    with engine.connect() as conn:
        n = int(conn.execute(sqlalchemy.text(f"SELECT count(*) FROM {table}")).scalar_one())
    engine.dispose()
    return n


def _same(store: Store, **filters: Any) -> pd.DataFrame:
    """read_frame from the packs equals it from the rows and read_windows' frame."""
    frame = store.read_frame(**filters)
    pd.testing.assert_frame_equal(frame, store.read_frame(packed=False, **filters))
    pd.testing.assert_frame_equal(frame, windows_frame(store.read_windows(**filters)))
    return frame


@pytest.mark.parametrize(
    "filters",
    [
        {},
        {"signals": ["prompt_tokens"]},
        {"sources": ["e2"]},
        {"since": T0 + 1_000.0, "until": T0 + 2 * BLOCK_S + 61.0},
        {"cluster": "c", "signals": ["kv_usage"], "since": T0 + BLOCK_S},
        {"cluster": "nowhere"},
    ],
)
def test_packed_frame_equals_rows(db_url: str, filters: dict[str, Any]) -> None:
    with Store(db_url, batch_size=500) as s:
        s.migrate()
        s.upsert_engine("c", "e1")
        s.write_windows(history())
        frame = _same(s, **filters)
        if not filters:
            assert len(frame) == len(history())
    # SQLite: the two complete hours of each source packed, the newest left as rows
    packed = 2 * (HOURS - 1) if db_url.startswith("sqlite") else 0
    assert _count(db_url, "packed_hours") == packed


def test_rewritten_window_replaces_the_packed_one(db_url: str) -> None:
    with Store(db_url, batch_size=500) as s:
        s.migrate()
        s.write_windows(history())
        before = len(s.read_frame())
        # re-write minute 5 of e1 (a packed hour) with new values, twice: no double count
        changed = [w for w in history(lambda src, _sig, m, v: 99.0 if src == "e1" and m == 5 else v)
                   if w.source == "e1" and w.start == T0 + 300.0]  # fmt: skip
        s.write_windows(changed)
        s.write_windows(changed)
        frame = _same(s)
        assert len(frame) == before
        hit = frame[(frame["source"] == "e1") & (frame["start"] == T0 + 300.0)]
        assert len(hit) == 3 and set(hit["mean"]) == {99.0}
        if db_url.startswith("sqlite"):
            assert _count(db_url, "packed_hours") == 2 * (HOURS - 1) - 1  # e1's first hour
            assert s.pack_windows() == len(changed) * 60  # that hour packed again, whole
            assert _count(db_url, "packed_hours") == 2 * (HOURS - 1)
            s.write_windows(changed)  # unpacked again ...
            assert _count(db_url, "packed_hours") == 2 * (HOURS - 1) - 1
            later = [w for w in history() if w.source == "e1" and w.start == T0 + 60.0 * 179]
            s.write_windows([replace(w, start=w.start + BLOCK_S) for w in later])
            assert _count(db_url, "packed_hours") == 2 * HOURS - 1  # ... packed by the next hour
        else:
            assert s.pack_windows() == 0
        _same(s)


def test_migration_5_to_6_keeps_every_row_and_packs(db_url: str) -> None:
    with Store(db_url, batch_size=500) as s:
        s.migrate()
        s.write_windows(history())
        rows = s.read_windows()
    engine = sqlalchemy.create_engine(db_url)
    with engine.begin() as conn:  # the store as schema 5 left it
        conn.execute(sqlalchemy.text("DROP TABLE packed_hours"))
        conn.execute(sqlalchemy.text("DROP TABLE window_blocks"))
        conn.execute(sqlalchemy.text("UPDATE schema_version SET version = 5"))
    engine.dispose()
    with Store(db_url) as s:
        assert s.migrate() == 6
        assert s.migrate() == 6  # idempotent
        assert s.read_windows() == rows
        _same(s)
    packed = 2 * (HOURS - 1) if db_url.startswith("sqlite") else 0
    assert _count(db_url, "packed_hours") == packed
    assert _count(db_url, "windows") == len(rows)


def test_prune_drops_the_packs_it_cuts(db_url: str) -> None:
    with Store(db_url, batch_size=500) as s:
        s.migrate()
        s.write_windows(history())
        cutoff = T0 + BLOCK_S + 600.0  # inside the second hour
        s.prune(cutoff)
        frame = _same(s)
        assert frame["start"].min() == cutoff
        assert len(frame) == len([w for w in history() if w.start >= cutoff])
    assert _count(db_url, "packed_hours") == 0  # the first hour gone, the second cut
    if db_url.startswith("sqlite"):
        path = db_url.removeprefix("sqlite:///")
        with sqlite3.connect(path) as con:
            assert con.execute("SELECT count(*) FROM window_blocks").fetchone() == (0,)
