"""store.partitions on a real PostgreSQL 15: chunks range-partitioned by UTC day on their
hour, the partitions made by the writers that seal hours (also when they race), dropped
whole by retention; SQLite's store is one table."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy

from core.errors import StoreError
from core.records import Window
from store import partitions
from store.retention import Pruner
from store.store import Store
from tests.clirun import run_kvscope

pytestmark = [pytest.mark.postgres, pytest.mark.parametrize("db_url", ["postgres"], indirect=True)]

DAY = 86_400
D0 = 20_420  # 2025-11-28
T0 = D0 * DAY


def _win(day: int, minute: int, source: str = "e1", *, mean: float = 0.5) -> Window:
    return Window(source, "kv_cache_usage_ratio", (("engine", "0"),), day * DAY + 60.0 * minute,
                  60.0, "gauge", 4, mean=mean)  # fmt: skip


def _days(days: range, per_day: int = 30, source: str = "e1") -> list[Window]:
    return [_win(d, m * 40, source) for d in days for m in range(per_day)]


def _sql(db_url: str, sql: str, **params: Any) -> list[Any]:
    engine = sqlalchemy.create_engine(db_url)
    try:
        with engine.begin() as conn:
            result = conn.execute(sqlalchemy.text(sql), params)
            return list(result.all()) if result.returns_rows else []
    finally:
        engine.dispose()


def _partition_rows(db_url: str) -> dict[str, int]:
    """Windows per partition of chunks, every attached partition listed (empty ones too)."""
    names = _sql(db_url, "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON "
                         "c.oid = i.inhrelid WHERE i.inhparent = 'chunks'::regclass")  # fmt: skip
    counts = dict(_sql(db_url, "SELECT tableoid::regclass::text, sum(n) FROM chunks GROUP BY 1"))
    return {str(n): int(counts.get(n, 0)) for (n,) in names}


def _name(day: int) -> str:
    return partitions.partition_name(day)


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    with Store(db_url) as s:
        s.migrate()
        yield s


def test_fresh_store_is_range_partitioned_on_hour(db_url: str, store: Store) -> None:
    (strategy, key), = _sql(db_url, (
        "SELECT p.partstrat, a.attname FROM pg_partitioned_table p JOIN pg_attribute a ON "
        "a.attrelid = p.partrelid AND a.attnum = p.partattrs[0] "
        "WHERE p.partrelid = 'chunks'::regclass"))  # fmt: skip
    assert (strategy, key) == ("r", "hour")
    assert _partition_rows(db_url) == {}  # no partition until an hour is sealed (no DEFAULT)
    store.write_windows([_win(D0, 1)])
    assert _partition_rows(db_url) == {}  # its hour is still written: a head row
    store.write_windows([_win(D0, 61)])  # the next hour: the first one sealed
    assert _partition_rows(db_url) == {_name(D0): 1}
    pk = _sql(db_url, "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                      "WHERE conrelid = 'chunks'::regclass AND contype = 'p'")  # fmt: skip
    assert pk == [("PRIMARY KEY (series_id, hour)",)]


def test_writes_across_three_days_make_their_partitions_and_stay_idempotent(
    db_url: str, store: Store
) -> None:
    rows = _days(range(D0, D0 + 3))
    assert store.write_windows(rows) == len(rows)
    made = _partition_rows(db_url)
    # the three days with their windows, but the newest hour's (19:20 of the third day)
    assert made == {_name(D0): 30, _name(D0 + 1): 30, _name(D0 + 2): 29}
    assert _name(D0) == "chunks_p20251128"
    assert store.stats()["partitions"] == {"count": 3, "oldest": _name(D0), "newest": _name(D0 + 2)}
    store.write_windows(rows)  # the same windows again: replaced in their chunks
    store.write_windows([_win(D0 + 1, 0, mean=9.0)])
    assert _partition_rows(db_url) == made
    assert store.stats()["windows"] == len(rows)
    assert [w.mean for w in store.read_windows(since=(D0 + 1) * DAY, until=(D0 + 1) * DAY + 1)] == [
        9.0
    ]
    assert store.read_windows() == sorted(
        [_win(D0 + 1, 0, mean=9.0) if w == rows[30] else w for w in rows],
        key=lambda w: (w.source, w.signal, w.start),
    )


def test_each_window_lands_in_its_utc_day_at_the_bounds(db_url: str, store: Store) -> None:
    midnight = float((D0 + 1) * DAY)
    before, after = math.nextafter(midnight, -math.inf), midnight
    store.write_windows([Window("e1", "g", (), t, 60.0, "gauge", 1, mean=1.0)
                         for t in (before, after, midnight + 3_600.0)])  # fmt: skip
    where = dict(_sql(db_url, "SELECT hour, tableoid::regclass::text FROM chunks"))
    assert where == {midnight - 3_600.0: _name(D0), midnight: _name(D0 + 1)}
    assert [w.start for w in store.read_windows()] == [before, after, midnight + 3_600.0]


def test_two_writers_racing_for_the_same_new_day_both_succeed(db_url: str, store: Store) -> None:
    barrier = threading.Barrier(4, timeout=60)
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        try:
            with Store(db_url) as s:  # its own (empty) cache of the days made
                s.schema_version()  # connected before the race
                barrier.wait()
                s.write_windows(_days(range(D0, D0 + 2), source=f"shard{i}"))
        except BaseException as exc:  # reported below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads) and errors == []
    # each writer's newest hour stays in the head
    assert _partition_rows(db_url) == {_name(D0): 120, _name(D0 + 1): 4 * 29}
    assert store.stats()["windows"] == 4 * 60


def test_a_day_dropped_by_another_process_is_made_again_by_a_writer_that_cached_it(
    db_url: str, store: Store
) -> None:
    store.write_windows([*_days(range(D0, D0 + 1)), _win(D0 + 1, 0)])
    with Store(db_url) as other:
        assert other.prune((D0 + 1) * DAY).partitions == 1
    assert _name(D0) not in _partition_rows(db_url)
    store.write_windows([_win(D0, 5)])  # this Store still believes the day is there
    store.write_windows([_win(D0 + 1, 70)])  # a new hour: (D0, 5)'s hour sealed again
    assert _partition_rows(db_url)[_name(D0)] == 1
    assert store.read_windows() == [_win(D0, 5), _win(D0 + 1, 0), _win(D0 + 1, 70)]


def test_a_detached_leftover_of_a_prune_is_attached_again_with_its_chunks(
    db_url: str, store: Store
) -> None:
    store.write_windows([*_days(range(D0, D0 + 1)), _win(D0 + 1, 0)])
    _sql(db_url, f"ALTER TABLE chunks DETACH PARTITION {_name(D0)}")  # a prune stopped here
    assert store.stats()["windows"] == 1
    with Store(db_url) as fresh:
        fresh.write_windows([_win(D0, 1), _win(D0 + 2, 0)])  # (D0, 1) sealed into D0
    assert _partition_rows(db_url)[_name(D0)] == 30 + 1
    assert len(store.read_windows()) == 30 + 3


@pytest.mark.parametrize("start", [2.0**53, -(2.0**53), 1e300])
def test_a_start_no_day_partition_holds_is_refused_naming_the_window(
    store: Store, start: float
) -> None:
    with pytest.raises(StoreError, match=r"window e1 g starts at .*\|start\| < 2\*\*53 s"):
        store.write_windows([Window("e1", "g", (), start, 60.0, "gauge", 1)])


# ---- retention -----------------------------------------------------------------------------


def test_prune_drops_whole_old_days_and_deletes_the_rest_of_the_cutoff_day(
    db_url: str, store: Store
) -> None:
    rows = _days(range(D0, D0 + 8))  # 8 days x 30 windows, 40 minutes apart
    store.write_windows(rows)
    store.write_windows([_win(D0 + 9, 0, source="e2"), _win(D0 + 9, 70, source="e2")])
    cutoff = (D0 + 3) * DAY + 6 * 3_600.0  # 06:00 of the fourth day
    keep = sorted((w for w in rows if w.start >= cutoff), key=lambda w: (w.start, w.source))
    dry = store.prune(cutoff, dry_run=True)
    assert (dry.windows, dry.partitions, dry.dry_run) == (3 * 30 + 9, 3, True)
    assert store.stats()["windows"] == len(rows) + 2
    done = store.prune(cutoff, batch=4)
    assert (done.windows, done.partitions) == (3 * 30 + 9, 3)
    assert done.summary()["partitions_dropped"] == 3
    left = _partition_rows(db_url)
    assert sorted(left) == sorted(_name(d) for d in (*range(D0 + 3, D0 + 8), D0 + 9))
    assert left[_name(D0 + 3)] == 30 - 9 and left[_name(D0 + 9)] == 1
    assert [w for w in store.read_windows(sources=["e1"])] == keep
    again = store.prune(cutoff)
    assert (again.windows, again.partitions) == (0, 0)


def test_whole_partitions_keeps_the_day_at_the_cutoff_until_it_is_wholly_older(
    db_url: str, store: Store
) -> None:
    store.write_windows(_days(range(D0, D0 + 4)))
    cutoff = (D0 + 2) * DAY + 12 * 3_600.0
    dry = store.prune(cutoff, dry_run=True, whole_partitions=True)
    done = store.prune(cutoff, whole_partitions=True)
    assert (dry.windows, dry.partitions) == (done.windows, done.partitions) == (60, 2)
    assert _partition_rows(db_url) == {_name(D0 + 2): 30, _name(D0 + 3): 29}


def test_pruner_on_postgresql_drops_whole_days_and_reports_them(db_url: str, store: Store) -> None:
    store.write_windows(_days(range(D0, D0 + 4)))
    pruner = Pruner(store, 1.5 * DAY)
    now = (D0 + 4) * DAY  # cutoff: 12:00 of the third day

    async def loop() -> None:
        pruner.tick(now)
        await pruner.close()

    asyncio.run(loop())
    assert pruner.errors == 0
    assert (pruner.windows, pruner.partitions) == (60, 2)
    assert pruner.summary()["dropped_partitions"] == 2
    assert store.stats()["windows"] == 60  # the third day kept whole, the fourth


def test_prune_finishes_a_detach_an_interrupted_prune_left_pending(
    db_url: str, store: Store
) -> None:
    store.write_windows(_days(range(D0, D0 + 2)))
    engine = sqlalchemy.create_engine(db_url)
    reader = engine.connect()  # a snapshot that sees the partition: the detach waits for it
    reader.execute(sqlalchemy.text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
    reader.execute(sqlalchemy.text("SELECT count(*) FROM chunks")).scalar()
    failed: list[BaseException] = []

    def detach() -> None:
        with engine.connect() as raw:
            c = raw.execution_options(isolation_level="AUTOCOMMIT")
            c.execute(sqlalchemy.text("SET application_name = 'kvscope-test-detach'"))
            try:
                c.execute(sqlalchemy.text(
                    f"ALTER TABLE chunks DETACH PARTITION {_name(D0)} CONCURRENTLY"))  # fmt: skip
            except sqlalchemy.exc.DBAPIError as exc:
                failed.append(exc)

    thread = threading.Thread(target=detach, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not _sql(db_url, "SELECT 1 FROM pg_inherits WHERE inhdetachpending "
                           "AND inhparent = 'chunks'::regclass"):  # fmt: skip
        assert time.monotonic() < deadline, "the detach never started"
        time.sleep(0.05)
    _sql(db_url, "SELECT pg_cancel_backend(pid) FROM pg_stat_activity "
                 "WHERE application_name = 'kvscope-test-detach'")  # fmt: skip
    thread.join(timeout=30)
    reader.rollback()
    reader.close()
    engine.dispose()
    assert len(failed) == 1 and "canceling statement" in str(failed[0])
    pending = _sql(db_url, "SELECT inhdetachpending FROM pg_inherits i JOIN pg_class c ON "
                           f"c.oid = i.inhrelid WHERE c.relname = '{_name(D0)}' "
                           "AND i.inhparent = 'chunks'::regclass")  # fmt: skip
    assert pending == [(True,)]
    done = store.prune((D0 + 1) * DAY)
    assert (done.windows, done.partitions) == (30, 1)
    assert _name(D0) not in _partition_rows(db_url)
    assert _sql(db_url, f"SELECT to_regclass('{_name(D0)}') IS NULL") == [(True,)]


def test_db_prune_cli_drops_the_old_days_on_postgresql(db_url: str, store: Store) -> None:
    today = partitions.day_of(time.time())
    store.write_windows(_days(range(today - 5, today)))  # 5 days before today, 30 a day
    dry = run_kvscope("db", "prune", "--older-than", "3d", "--db", db_url, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    done = run_kvscope("db", "prune", "--older-than", "3d", "--db", db_url)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    # the cutoff falls in day today - 3: days -5 and -4 dropped whole, the rest of -3 deleted
    assert out["partitions_dropped"] == json.loads(dry.stdout)["partitions_dropped"] == 2
    assert out["windows"] == json.loads(dry.stdout)["windows"] >= 60
    assert out["windows"] + store.stats()["windows"] == 150
    assert sorted(_partition_rows(db_url))[0] == _name(today - 3)
