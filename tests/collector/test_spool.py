"""collector.spool: what the store refused waits on disk, is written back oldest first, once.

The store is a real SQLite file; its outage is real too: the pool is let go of and the
database's directory renamed away, so every connection fails with SQLite's own
"unable to open database file" until it is renamed back.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from collector.spool import Spool, _decode, _encode, is_transient
from core.errors import StoreError
from core.records import ScrapeOutcome, Window
from store.store import Store

ENGINE = (("engine", "0"), ("model_name", "m"))


def _windows(start: float, n: int, *, samples: int = 4, source: str = "e0") -> list[Window]:
    return [
        Window(source, "preemptions_total", ENGINE, start + 60.0 * i, 60.0, "counter",
               samples, delta=5.0 * samples, rate=5.0 * samples / 60, last=100.0 + i)
        for i in range(n)
    ]  # fmt: skip


def _outcomes(start: float, n: int) -> list[ScrapeOutcome]:
    return [ScrapeOutcome("e0", start + 15.0 * i, 0.01, True, 1000, 40) for i in range(n)]


class Outage:
    """A real SQLite store whose database can be made unreachable and reachable again."""

    def __init__(self, tmp: Path) -> None:
        self.home = tmp / "db"
        self.away = tmp / "db-away"
        self.url = f"sqlite:///{self.home / 'k.db'}"
        self.store = Store(self.url)
        self.store.migrate()

    @contextmanager
    def down(self) -> Iterator[None]:
        self.store.close()  # no pooled connection survives: each write must open the file
        self.home.rename(self.away)
        try:
            yield
        finally:
            self.away.rename(self.home)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Outage]:
    outage = Outage(tmp_path)
    yield outage
    outage.store.close()


def _segments(directory: Path, suffix: str = ".seg") -> list[Path]:
    return sorted(directory.glob(f"*{suffix}"))


def test_spool_store_down_on_disk_then_replayed_oldest_first_once(
    db: Outage, tmp_path: Path
) -> None:
    spool = Spool(tmp_path / "spool", store_id=db.store.url)
    first = _windows(0.0, 3, samples=3)
    newer = _windows(0.0, 1, samples=4)  # a fuller version of the first window, spooled later
    with db.down():
        a = spool.write(db.store, first, _outcomes(0.0, 2))
        b = spool.write(db.store, newer)
    assert a.error is not None and is_transient(a.error) and b.error is not None
    assert (a.windows, b.windows) == (0, 0)
    assert len(_segments(tmp_path / "spool")) == 2  # on disk at once: a kill -9 loses nothing
    counts = spool.counts
    assert (counts.spooled_windows, counts.pending_windows, counts.pending_outcomes) == (4, 4, 2)
    after = _windows(600.0, 2)
    done = spool.write(db.store, after)
    assert done.error is None and done.windows == 6 and done.replayed_windows == 4
    assert done.outcomes == 2 and spool.empty and not _segments(tmp_path / "spool")
    stored = db.store.read_windows()
    assert [(w.start, w.samples) for w in stored] == [(0.0, 4), (60.0, 3), (120.0, 3),
                                                      (600.0, 4), (660.0, 4)]  # fmt: skip
    assert len(db.store.outcomes()) == 2
    assert (counts.replayed_windows, counts.pending_windows, counts.dropped_windows) == (4, 0, 0)


def test_spool_new_batch_waits_behind_spooled_ones_when_budget_runs_out(
    db: Outage, tmp_path: Path
) -> None:
    spool = Spool(tmp_path / "spool", store_id=db.store.url)
    with db.down():
        spool.write(db.store, _windows(0.0, 2))
    done = spool.write(db.store, _windows(0.0, 1, samples=9), budget_s=-1.0)  # no time at all
    assert done.error is None and done.windows == 0 and spool.counts.pending_windows == 3
    assert db.store.read_windows() == []
    done = spool.write(db.store)
    assert done.windows == 3 and [w.samples for w in db.store.read_windows()] == [9, 4]


def test_spool_leftover_of_crashed_collector_replayed_first_by_next(
    db: Outage, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    crashed = Spool(tmp_path / "spool", store_id=db.store.url)
    with db.down():
        crashed.write(db.store, _windows(0.0, 5), _outcomes(0.0, 3))
    del crashed  # as a kill -9 would: nothing of it but its files
    (tmp_path / "spool" / "00000000000000000001-1-000000-abc.tmp").write_bytes(b'{"torn')
    with caplog.at_level(logging.WARNING, logger="collector.spool"):
        spool = Spool(tmp_path / "spool", store_id=db.store.url)
    assert spool.counts.recovered_windows == 5 and spool.counts.pending_outcomes == 3
    assert "5 windows and 3 outcomes of an earlier run found" in caplog.text
    done = spool.write(db.store, _windows(600.0, 1))
    assert done.windows == 6 and done.outcomes == 3 and spool.empty
    assert len(db.store.read_windows()) == 6
    assert (tmp_path / "spool" / "00000000000000000001-1-000000-abc.tmp").exists()  # young
    old = time.time() - 3600
    os.utime(tmp_path / "spool" / "00000000000000000001-1-000000-abc.tmp", (old, old))
    spool.write(db.store)
    assert list((tmp_path / "spool").iterdir()) == []  # a crash's half-written file, removed


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[: len(b) // 2],  # torn: half of it
        lambda b: b[:-1] + b"x",  # the trailer altered
        lambda b: b.replace(b'"w"', b'"q"', 1),  # a record altered
        lambda b: b"",  # empty
    ],
    ids=["torn", "trailer", "record", "empty"],
)
def test_spool_damaged_segment_set_aside_counted_others_written(
    db: Outage, tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: object
) -> None:
    spool = Spool(tmp_path / "spool", store_id=db.store.url)
    with db.down():
        spool.write(db.store, _windows(0.0, 2))
        spool.write(db.store, _windows(600.0, 3))
    oldest = _segments(tmp_path / "spool")[0]
    oldest.write_bytes(damage(oldest.read_bytes()))  # type: ignore[operator]
    with caplog.at_level(logging.ERROR, logger="collector.spool"):
        done = spool.write(db.store)
    assert done.error is None and done.windows == 3
    assert [w.start for w in db.store.read_windows()] == [600.0, 660.0, 720.0]
    assert spool.counts.dropped_windows == 2 and spool.empty
    assert _segments(tmp_path / "spool", ".bad") == [oldest.with_suffix(".bad")]
    assert "DROPPED 2 windows" in caplog.text


def test_spool_over_disk_bound_oldest_dropped_counted_logged(
    db: Outage, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    one = len(_encode(db.store.url, _windows(0.0, 10), []))
    spool = Spool(tmp_path / "spool", store_id=db.store.url, max_bytes=int(2.5 * one))
    with db.down(), caplog.at_level(logging.ERROR, logger="collector.spool"):
        for i in range(4):
            spool.write(db.store, _windows(6000.0 * i, 10))
    assert spool.counts.dropped_windows == 20 and spool.counts.pending_windows == 20
    assert spool.counts.pending_bytes <= 2.5 * one
    assert caplog.text.count("over its bound") == 2
    spool.write(db.store)
    assert sorted({w.start // 6000 for w in db.store.read_windows()}) == [2.0, 3.0]


def test_spool_disk_refuses_kept_in_memory_bounded(
    db: Outage, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(tmp_path / "spool", store_id=db.store.url, memory_records=15)
    (tmp_path / "spool").rmdir()
    (tmp_path / "spool").write_text("not a directory")  # every segment write now fails
    with db.down(), caplog.at_level(logging.ERROR, logger="collector.spool"):
        for i in range(3):
            spool.write(db.store, _windows(6000.0 * i, 10))
    assert "keeping 10 records in memory" in caplog.text
    assert spool.counts.dropped_windows == 20 and spool.counts.pending_windows == 10
    assert spool.write(db.store).windows == 10
    assert {w.start // 6000 for w in db.store.read_windows()} == {2.0}


def test_spool_memory_only_store_back_written(db: Outage) -> None:
    spool = Spool(None, store_id=db.store.url)
    with db.down():
        spool.write(db.store, _windows(0.0, 3))
    assert spool.counts.pending_windows == 3
    assert spool.write(db.store).windows == 3 and len(db.store.read_windows()) == 3


def test_spool_other_stores_segments_left_alone(db: Outage, tmp_path: Path) -> None:
    other = Spool(tmp_path / "spool", store_id="postgresql+psycopg://kv:***@elsewhere/kv")
    other.add(_windows(0.0, 4))
    spool = Spool(tmp_path / "spool", store_id=db.store.url)
    assert spool.counts.recovered_windows == 0 and spool.empty
    assert spool.write(db.store, _windows(600.0, 1)).windows == 1
    assert len(_segments(tmp_path / "spool")) == 1 and other.counts.pending_windows == 4


def test_spool_content_the_store_refuses_set_aside_after_three_tries(
    db: Outage, tmp_path: Path
) -> None:
    spool = Spool(tmp_path / "spool", store_id=db.store.url)
    bad = Window("e0", "preemptions_total", ENGINE, math.nan, 60.0, "counter", 1)
    spool.add([bad])
    errors = [spool.write(db.store, _windows(60.0 * i, 1)).error for i in range(3)]
    assert all(isinstance(e, StoreError) and not is_transient(e) for e in errors)
    assert spool.counts.dropped_windows == 1 and spool.counts.pending_windows == 0
    assert len(db.store.read_windows()) == 3  # the ones behind it, written on the third tick
    assert len(_segments(tmp_path / "spool", ".bad")) == 1


def test_spool_store_refusing_every_window_sets_nothing_aside(db: Outage, tmp_path: Path) -> None:
    """A store that refuses all windows for their content (here a trigger; a dropped table,
    a read-only role) keeps them all spooled, none dropped, until it takes them again."""
    spool = Spool(tmp_path / "spool", store_id=db.store.url)
    with sqlite3.connect(db.home / "k.db") as con:
        con.execute("CREATE TRIGGER ro BEFORE INSERT ON head BEGIN "
                    "SELECT RAISE(ABORT, 'read-only'); END")  # fmt: skip
    errors = [spool.write(db.store, _windows(600.0 * i, 2)).error for i in range(5)]
    assert all(e is not None and not is_transient(e) and "read-only" in str(e) for e in errors)
    assert spool.counts.dropped_windows == 0 and spool.counts.pending_windows == 10
    with sqlite3.connect(db.home / "k.db") as con:
        con.execute("DROP TRIGGER ro")
    assert spool.write(db.store).windows == 10 and len(db.store.read_windows()) == 10


def test_spool_segment_round_trip_keeps_every_value() -> None:
    windows = [
        Window("e/0", "ttft_seconds", (("le", "+Inf"), ("é", "x\ny")), 60.0, 60.0, "histogram",
               3, delta=2.0, rate=None, resets=1, mean=math.inf, min=-0.0, max=1e308,
               last=7.0, p50=0.1, p90=None, p99=math.nan, sum_delta=1.5),
        Window("e0", "kv_cache_usage_ratio", (), 0.0, 60.0, "gauge", 1, mean=0.25),
    ]  # fmt: skip
    outcomes = [ScrapeOutcome("e0", 1.5, 0.2, False, 0, 0, "timeout", 'took "long"')]
    store, ws, os_ = _decode(_encode("sqlite:///k.db", windows, outcomes))
    assert store == "sqlite:///k.db" and os_ == outcomes
    assert ws[1] == windows[1] and math.isnan(ws[0].p99 or 0.0)
    assert ws[0] == dataclasses.replace(windows[0], p99=ws[0].p99)  # NaN != NaN
