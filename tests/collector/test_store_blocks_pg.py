"""Packed hours on a real PostgreSQL 15 (collector/store_blocks_pg.py): the promise holds when
a writer and a packer, or a prune and a packer, run at once (two connections interleaved
step by step with threads and events: each test fails without the lock it is about), large
writes split under the lock limit, ``window_blocks`` partitioned by day and dropped with the
windows' days, and the migration of a schema 6 store."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, cast

import pandas as pd
import pytest
import sqlalchemy

from collector import partitions, store_blocks_pg
from collector.models import WindowBlockRow
from collector.store import Store
from collector.store_blocks import BLOCK_S
from core.records import Window
from tests.collector.test_store_blocks import HOURS, T0, _count, _same, _sql, history

pytestmark = [pytest.mark.postgres, pytest.mark.parametrize("db_url", ["postgres"], indirect=True)]
DAY = partitions.DAY_S


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    with Store(db_url, batch_size=500) as s:
        s.migrate()
        s.write_windows(history())
        yield s


def _waiting_for_a_lock(db_url: str) -> bool:
    """Whether a backend waits for an advisory lock (on this server: tests run one by one)."""
    return bool(_sql(db_url, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                             "AND NOT granted")[0][0])  # fmt: skip


def _until_waiting_or_done(db_url: str, thread: threading.Thread) -> bool:
    """Whether ``thread`` came to wait for an advisory lock (False: it ended first)."""
    deadline = time.monotonic() + 20
    while thread.is_alive() and time.monotonic() < deadline:
        if _waiting_for_a_lock(db_url):
            return True
        time.sleep(0.02)
    return False


def _in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def _while_packing(
    db_url: str, action: Callable[[Store], object]
) -> tuple[bool, list[BaseException]]:
    """``action`` on a Store of its own, in a thread, while a transaction that packed e1's
    first hour is open; whether it came to wait for a lock before the pack's commit, and
    its errors (once it ended)."""
    engine = sqlalchemy.create_engine(db_url)
    try:
        with engine.connect() as conn, Store(db_url) as other:
            pack = conn.begin()
            assert store_blocks_pg.hours_to_pack(conn, "e1", None, T0 + BLOCK_S) == [T0]
            assert store_blocks_pg.pack_hours(conn, "e1", [T0]) == 3 * 60
            thread, errors = _in_thread(lambda: action(other))
            waited = _until_waiting_or_done(db_url, thread)
            pack.commit()
            thread.join(timeout=30)
    finally:
        engine.dispose()
    return waited, errors


def _changed(minute: int = 5, mean: float = -7.0) -> list[Window]:
    """The windows of e1 at ``minute`` (of its first hour) with a new mean."""
    return [replace(w, mean=mean) for w in history()
            if w.source == "e1" and w.start == T0 + 60.0 * minute]  # fmt: skip


def test_a_write_during_a_pack_waits_and_drops_the_pack(db_url: str, store: Store) -> None:
    """The packer locks first: the writer waits for its commit, then drops the new pack
    (without the lock the pack, lacking the write, would be the one read)."""
    store.write_windows(_changed(6, -3.0))  # e1's first hour unpacked
    waited, errors = _while_packing(db_url, lambda writer: writer.write_windows(_changed()))
    assert errors == [] and waited
    frame = _same(store)
    assert (frame["mean"] == -7.0).sum() == 3
    assert _count(db_url, f"packed_hours WHERE source = 'e1' AND hour = {T0}") == 0


def test_a_pack_during_a_write_waits_and_reads_the_written_rows(
    db_url: str, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer locks first (its transaction held open after it dropped the packs): the
    packer waits for its commit, then packs the hour with the rows written (without the lock
    it would pack the rows as they were, and the write would find no pack to drop)."""
    store.write_windows(_changed(6, -3.0))  # e1's first hour unpacked
    dropped, release = threading.Event(), threading.Event()
    real = store_blocks_pg.unpack

    def held_open(conn: sqlalchemy.Connection, pairs: Any) -> None:
        real(conn, pairs)
        dropped.set()
        assert release.wait(30)

    monkeypatch.setattr(store_blocks_pg, "unpack", held_open)
    with Store(db_url) as writer, Store(db_url) as packer:
        write, write_errors = _in_thread(lambda: writer.write_windows(_changed()))
        assert dropped.wait(30)
        pack, pack_errors = _in_thread(packer.pack_windows)
        waited = _until_waiting_or_done(db_url, pack)
        release.set()
        write.join(timeout=30)
        pack.join(timeout=30)
    assert write_errors == pack_errors == [] and waited
    frame = _same(store)
    assert (frame["mean"] == -7.0).sum() == 3
    assert _count(db_url, f"packed_hours WHERE source = 'e1' AND hour = {T0}") == 1


def test_a_prune_waits_for_a_pack_then_drops_it(db_url: str, store: Store) -> None:
    """A pack made from rows a prune then deletes, committed only after the prune's deletes:
    the prune's last sweep waits for it and drops it (store_blocks_pg.PRUNE_KEY)."""
    store.write_windows(_changed(6, -3.0))  # e1's first hour unpacked
    cutoff = T0 + BLOCK_S + 600.0  # exact: the day at the cutoff is kept, no detach
    waited, errors = _while_packing(db_url, lambda pruner: pruner.prune(cutoff))
    assert errors == [] and waited
    assert _count(db_url, f"packed_hours WHERE hour < {cutoff}") == 0
    frame = _same(store)
    assert frame["start"].min() == cutoff


def test_a_write_of_many_hours_locks_a_few_at_a_time(
    db_url: str, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_blocks_pg, "WRITE_HOURS", 3)
    parts: list[set[tuple[str, float]]] = []
    real = store_blocks_pg.unpack

    def spy(conn: sqlalchemy.Connection, pairs: Any) -> None:
        parts.append(set(pairs))
        real(conn, pairs)

    monkeypatch.setattr(store_blocks_pg, "unpack", spy)
    again = history(lambda _src, _sig, m, v: -1.0 if m % 30 == 0 else v)
    store.write_windows([w for w in again if (w.start - T0) % 1800 == 0])  # 2 x 3 hours
    assert [len(p) for p in parts] == [3, 3] and len(set().union(*parts)) == 6
    frame = _same(store)
    assert (frame["mean"] == -1.0).sum() == 2 * HOURS * 2 * 3


def test_locks_are_taken_after_the_sort_of_their_keys(db_url: str, store: Store) -> None:
    """The lock function runs above the sort (PostgreSQL evaluates a volatile function of
    the select list after ORDER BY): every transaction takes its locks in one order."""
    for sql in (store_blocks_pg._LOCK_SHARED, store_blocks_pg._LOCK_EXCLUSIVE):
        plan = _sql(db_url, "EXPLAIN (VERBOSE) " + sql.replace("%(s)s", "ARRAY['b', 'a']")
                    .replace("%(h)s", "ARRAY[0.0, 3600.0]"))  # fmt: skip
        lines = [str(r[0]) for r in plan]
        sort = next(i for i, line in enumerate(lines) if "Sort" in line and "->" in line)
        locking = [i for i, line in enumerate(lines) if "Output: pg_advisory_xact_lock" in line]
        assert locking and all(i < sort for i in locking), lines


# ---- partitions and retention -------------------------------------------------------------


def _day_windows(days: range) -> list[Window]:
    """Three windows an hour of e1, every hour of ``days``."""
    return [
        Window("e1", "kv_usage", (), d * DAY + 3600.0 * h + 1200.0 * k, 60.0, "gauge", 4,
               mean=float(h + k))
        for d in days for h in range(24) for k in range(3)
    ]  # fmt: skip


def _block_days(db_url: str) -> dict[str, int]:
    names = _sql(db_url, "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = "
                         "i.inhrelid WHERE i.inhparent = 'window_blocks'::regclass")  # fmt: skip
    counts = dict(_sql(db_url, "SELECT tableoid::regclass::text, count(*) FROM window_blocks "
                               "GROUP BY 1"))  # fmt: skip
    return {str(n): int(counts.get(n, 0)) for (n,) in names}


def test_window_blocks_partitioned_by_day_with_the_windows(db_url: str) -> None:
    d0 = 20_420
    with Store(db_url) as s:
        s.migrate()
        s.write_windows(_day_windows(range(d0, d0 + 3)))  # packs the 48 hours before the newest
        assert s.pack_windows() == 23 * 3  # the other hours but the newest
        assert _count(db_url, "packed_hours") == 3 * 24 - 1
        name = partitions.partition_name
        assert _block_days(db_url) == {name(d0, "window_blocks"): 24,
                                       name(d0 + 1, "window_blocks"): 24,
                                       name(d0 + 2, "window_blocks"): 23,
                                       name(d0 + 3, "window_blocks"): 0}  # fmt: skip
        _same(s)
        # the collector's prune: whole days only; the packs of the day at the cutoff stay
        done = s.prune((d0 + 1) * DAY + 6 * 3600.0, whole_partitions=True)
        assert (done.windows, done.partitions) == (72, 1)
        assert name(d0, "window_blocks") not in _block_days(db_url)
        assert _count(db_url, "packed_hours") == 24 + 23
        _same(s)
        # an exact prune: the packs of the hours it cuts go, one promise a batch
        s.prune((d0 + 1) * DAY + 6 * 3600.0 + 60.0, batch=1)
        assert _count(db_url, "packed_hours") == 24 + 23 - 7
        assert _count(db_url, f"window_blocks WHERE hour < {(d0 + 1) * DAY + 7 * 3600.0}") == 0
        _same(s)


def test_migration_6_to_7_partitions_the_blocks_and_packs(db_url: str, store: Store) -> None:
    """A PostgreSQL store as schema 6 left it: window_blocks one empty table (the model's),
    no index on packed_hours.hour."""
    rows = store.read_windows()
    engine = sqlalchemy.create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text("DROP TABLE window_blocks"))
        conn.execute(sqlalchemy.text("DELETE FROM packed_hours"))
        conn.execute(sqlalchemy.text("DROP INDEX ix_packed_hours_hour"))
        cast(sqlalchemy.Table, WindowBlockRow.__table__).create(conn)  # as create_all made it
        conn.execute(sqlalchemy.text("UPDATE schema_version SET version = 6"))
    engine.dispose()
    assert not _blocks_partitioned(db_url)
    with Store(db_url) as s:
        assert s.migrate() == 9
        assert s.read_windows() == rows
        pd.testing.assert_frame_equal(s.read_frame(), s.read_frame(packed=False))
    assert _blocks_partitioned(db_url)
    assert _block_days(db_url)  # the days of the windows made
    assert _count(db_url, "packed_hours") == 2 * (HOURS - 1)
    assert _sql(db_url, "SELECT indexname FROM pg_indexes WHERE tablename = 'packed_hours' "
                        "AND indexname = 'ix_packed_hours_hour'")  # fmt: skip


def _blocks_partitioned(db_url: str) -> bool:
    return bool(_sql(db_url, "SELECT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE "
                             "partrelid = to_regclass('window_blocks'))")[0][0])  # fmt: skip
