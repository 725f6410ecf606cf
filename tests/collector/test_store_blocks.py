"""Packed hours (collector/store_blocks*.py: SQLite from schema 6, PostgreSQL from 7) on a real
SQLite file and a real PostgreSQL 15: read_frame gives the same frame from the packs as from
the rows (whole, partly packed, re-written, with NULL columns and every kind), a re-written
window is never counted twice, blocks without their promise are never read, both backends
pack the same blocks (but for the byte order), migrations keep every row, retention drops
packs. PostgreSQL's locks, partitions and migration: tests/collector/test_store_blocks_pg.py."""

from __future__ import annotations

import math
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import sqlalchemy

from collector import store_blocks_decode, store_blocks_pg, store_frame_pg
from collector.models import SCHEMA_VERSION
from collector.store import Store
from collector.store_blocks import BLOCK_S, Frame
from collector.store_blocks_decode import Packs, positions
from collector.store_frame import windows_frame
from core.errors import StoreError
from core.records import Labels, Window

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


def every_kind() -> list[Window]:
    """HOURS hours of every kind (one the row code has no number for: 'summary'), columns
    NULL in whole hours and in single rows, NaN, odd labels and starts off the minute."""
    odd: Labels = (("le", "+Inf"), ("path", 'a"b\\c'), ("z", "ü"))
    out: list[Window] = []
    for m in range(HOURS * 60):
        t, hour = T0 + 60.0 * m, m // 60
        gap = m % 13 == 0
        out += [
            Window("e1", "preemptions_total", (), t, 60.0, "counter", 4, delta=None if gap
                   else float(m), rate=m / 60, resets=m % 2),
            Window("e1", "kv_cache_usage_ratio", (("engine", "1"),), t, 60.0, "gauge", 4,
                   mean=0.1 * m, min=-0.0, max=math.nan if gap else 0.5,
                   last=0.3 if hour == 1 else None),  # last: only in the second hour
            Window("e0", "ttft_seconds", (), t, 60.0, "histogram", 4, delta=5.0, p50=0.1,
                   p90=None if gap else 0.2, p99=math.pi, sum_delta=t / 7),
            Window("e0", "prefix_cache_hit_ratio", (), t, 60.0, "ratio", 4,
                   mean=None if hour == 2 else 0.25, delta=100.0),
            Window("lm/ü", "rpc_latency", odd, t + 0.123456789, 60.0, "summary", 2,  # type: ignore[arg-type]
                   mean=1e-300, max=1e308, p50=float(hour)),
        ]  # fmt: skip
    return out


def _count(db_url: str, table: str) -> int:
    return int(_sql(db_url, f"SELECT count(*) FROM {table}")[0][0])


def _sql(db_url: str, sql: str) -> list[Any]:
    engine = sqlalchemy.create_engine(db_url)
    try:
        with engine.begin() as conn:
            result = conn.execute(sqlalchemy.text(sql))
            return list(result.all()) if result.returns_rows else []
    finally:
        engine.dispose()


def _same(store: Store, **filters: Any) -> pd.DataFrame:
    """read_frame from the packs equals it from the rows and read_windows' frame."""
    frame = store.read_frame(**filters)
    pd.testing.assert_frame_equal(frame, store.read_frame(packed=False, **filters))
    pd.testing.assert_frame_equal(frame, windows_frame(store.read_windows(**filters)))
    return frame


@pytest.fixture(params=["indexes", "scan"])
def row_path(request: pytest.FixtureRequest, db_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """PostgreSQL: the rows no pack covers read through the indexes (the ranges outside the
    packed hours) or by a scan of the table (the packed hours left out); SQLite: one path."""
    if db_url.startswith("sqlite"):
        if request.param == "scan":
            pytest.skip("SQLite reads what no pack covers by the unique index only")
        return str(request.param)
    guess = 0.0 if request.param == "indexes" else 1e12
    monkeypatch.setattr(store_frame_pg, "_estimate", lambda *_: guess)
    monkeypatch.setattr(store_frame_pg, "_BLOCK", 64)
    return str(request.param)


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
def test_packed_frame_equals_rows(db_url: str, row_path: str, filters: dict[str, Any]) -> None:
    with Store(db_url, batch_size=500) as s:
        s.migrate()
        s.upsert_engine("c", "e1")
        s.write_windows(history())
        frame = _same(s, **filters)
        if not filters:
            assert len(frame) == len(history())
    # the two complete hours of each source packed, the newest left as rows
    assert _count(db_url, "packed_hours") == 2 * (HOURS - 1)


def test_every_kind_null_columns_and_partly_packed_hours(
    db_url: str, row_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_blocks_decode, "BATCH", 3)  # blocks decoded 3 at a time
    rows = every_kind()
    with Store(db_url, batch_size=97) as s:
        s.migrate()
        s.write_windows(rows)
        assert _count(db_url, "packed_hours") == 3 * (HOURS - 1)  # 3 sources
        frame = _same(s)
        assert len(frame) == len(rows) and set(frame["kind"]) == {
            "counter", "gauge", "histogram", "ratio", "summary"}  # fmt: skip
        # a window of e0's first hour re-written (unpacked: read from its rows), e1's first
        # hour's promise withdrawn without its blocks (orphans: never read), e2 unpacked
        s.write_windows([replace(rows[2], p99=-1.0)])
        _sql(db_url, f"DELETE FROM packed_hours WHERE source = 'e1' AND hour = {T0}")
        assert _count(db_url, "packed_hours") == 3 * (HOURS - 1) - 2
        some = {"signals": ["ttft_seconds", "rpc_latency"], "until": T0 + 2 * BLOCK_S}
        for filters in ({}, {"since": T0 + 90.0, "until": T0 + BLOCK_S + 30.0}, some):
            _same(s, **filters)
        assert (s.read_frame()["p99"] == -1.0).sum() == 1


def test_rewritten_window_replaces_the_packed_one(db_url: str, row_path: str) -> None:
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
        assert _count(db_url, "packed_hours") == 2 * (HOURS - 1) - 1  # e1's first hour
        assert s.pack_windows() == len(changed) * 60  # that hour packed again, whole
        assert _count(db_url, "packed_hours") == 2 * (HOURS - 1)
        assert s.pack_windows() == 0
        s.write_windows(changed)  # unpacked again ...
        assert _count(db_url, "packed_hours") == 2 * (HOURS - 1) - 1
        later = [w for w in history() if w.source == "e1" and w.start == T0 + 60.0 * 179]
        s.write_windows([replace(w, start=w.start + BLOCK_S) for w in later])
        assert _count(db_url, "packed_hours") == 2 * HOURS - 1  # ... packed by the next hour
        _same(s)


def test_both_backends_pack_the_same_blocks_but_for_the_byte_order(
    tmp_path: Path, db_url: str
) -> None:
    if db_url.startswith("sqlite"):
        pytest.skip("compares a SQLite store with a PostgreSQL one")
    blocks = []
    for url in (f"sqlite:///{tmp_path / 'lite.db'}", db_url):
        with Store(url, batch_size=211) as s:
            s.migrate()
            s.write_windows(every_kind())
        found = _sql(url, "SELECT source, hour, series_key, signal, labels, kind, n, columns, "
                          "data FROM window_blocks ORDER BY source, hour, series_key")  # fmt: skip
        blocks.append([(*b[:8], bytes(b[8])) for b in found])
    lite, pg = blocks
    assert len(lite) == 5 * (HOURS - 1) and [b[:8] for b in pg] == [b[:8] for b in lite]
    for mine, theirs in zip(pg, lite, strict=True):  # (SQLite keeps no sign of a zero)
        big, little = np.frombuffer(mine[8], dtype=">f8"), np.frombuffer(theirs[8], dtype="<f8")
        assert len(big) == len(little) and np.array_equal(big, little, equal_nan=True), mine[:3]
    by_kind = {b[5]: b[7] for b in lite}  # a column NULL in a whole block is left out
    assert by_kind["histogram"] & (1 << 9) == 0 and by_kind["histogram"] & (1 << 12)


def test_migration_to_7_keeps_every_row_and_packs(db_url: str) -> None:
    """A store of schema 5 (no packs): SQLite packs at 5 -> 6, PostgreSQL at 6 -> 7."""
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
        assert s.migrate() == SCHEMA_VERSION == 9
        assert s.migrate() == 9  # idempotent
        assert s.read_windows() == rows
        _same(s)
    assert _count(db_url, "packed_hours") == 2 * (HOURS - 1)
    assert _count(db_url, "windows") == len(rows)


def test_prune_drops_the_packs_it_cuts(db_url: str) -> None:
    with Store(db_url, batch_size=500) as s:
        s.migrate()
        s.write_windows(history())
        cutoff = T0 + BLOCK_S + 600.0  # inside the second hour
        s.prune(cutoff, batch=1)  # the packs too, one row a batch
        frame = _same(s)
        assert frame["start"].min() == cutoff
        assert len(frame) == len([w for w in history() if w.start >= cutoff])
    assert _count(db_url, "packed_hours") == 0  # the first hour gone, the second cut
    assert _count(db_url, "window_blocks") == 0
    if db_url.startswith("sqlite"):
        path = db_url.removeprefix("sqlite:///")
        with sqlite3.connect(path) as con:
            assert con.execute("SELECT count(*) FROM window_blocks").fetchone() == (0,)


# ---- the decoding (collector/store_blocks_decode.py) ----------------------------------------


def test_positions_of_blocks_rows_in_order() -> None:
    firsts = np.array([10, 0, 4, 7], dtype=np.int64)
    sizes = np.array([2, 3, 0, 1], dtype=np.int64)
    assert positions(firsts, sizes).tolist() == [10, 11, 0, 1, 2, 7]
    assert positions(firsts[:0], sizes[:0]).tolist() == []


def test_blocks_whose_data_disagrees_with_their_counts_are_refused() -> None:
    tail: Frame = ([], np.zeros(0, dtype=np.int64), {"start": np.zeros(0)})
    good = np.array([[T0, 60.0, 4.0]], dtype="<f8").tobytes()
    block = ("e1", "g", "gauge", "{}", 1, 0b111, good)
    assert Packs(["start"], "<", 1, tail).add([block]).frame(None, None)[2]["start"].tolist() == [
        T0
    ]
    with pytest.raises(StoreError, match="24 bytes hold 2 rows of 3 float64"):
        Packs(["start"], "<", 2, tail).add([(*block[:4], 2, *block[5:])])
    with pytest.raises(StoreError, match="more than the 1 rows counted"):
        Packs(["start"], "<", 1, tail).add([block, block])
    with pytest.raises(StoreError, match="hold 1 rows, 2 counted"):
        Packs(["start"], "<", 2, tail).add([block]).frame(None, None)


# ---- PostgreSQL's writes split under its lock limit (collector/store_blocks_pg.py) --------


def test_split_keeps_every_row_and_each_hour_in_one_part(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [(f"e{s}", "sig", "{}", "k", T0 + 900.0 * q) for s in range(3) for q in range(9)]
    assert store_blocks_pg.split(rows) == [rows]  # fewer hours than the limit: as they are
    monkeypatch.setattr(store_blocks_pg, "WRITE_HOURS", 2)
    parts = store_blocks_pg.split(rows[::-1])
    assert sorted(r for p in parts for r in p) == sorted(rows)
    hours = [{(r[0], r[4] - r[4] % BLOCK_S) for r in p} for p in parts]
    assert all(len(h) <= 2 for h in hours) and sum(len(h) for h in hours) == 3 * 3
