"""store.retention: old windows and outcomes pruned in batches, the rest untouched, while
collectors write; `kvscope db prune` and `kvscope collect --retention`."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy

from core.errors import ConfigError, StoreError
from core.records import Saved, ScrapeOutcome, Window
from store.retention import Pruned, Pruner
from store.store import Store
from store.tables import SCHEMA_VERSION
from tests.clirun import run_kvscope

DAY = 86_400.0
NOW = 1_764_000_000.0


def _windows(days: int, per_day: int = 40, source: str = "e1") -> list[Window]:
    """``per_day`` one-minute windows on each of the ``days`` days before NOW."""
    return [
        Window(
            source,
            "kv_cache_usage_ratio",
            (("engine", str(i)),),
            NOW - d * DAY - 60.0 * (i + 1),
            60.0,
            "gauge",
            4,
            mean=0.5,
        )
        for d in range(days)
        for i in range(per_day)
    ]


def _outcomes(days: int) -> list[ScrapeOutcome]:
    return [ScrapeOutcome("e1", NOW - d * DAY - 30.0, 0.01, True, 100, 10) for d in range(days)]


@pytest.mark.parametrize("batch", [7, 20_000])
def test_prune_deletes_only_what_started_before_the_cutoff(db_url: str, batch: int) -> None:
    with Store(db_url) as s:
        s.migrate()
        windows = _windows(10)
        s.write_windows(windows)
        s.write_outcomes(_outcomes(10))
        s.upsert_engine("c", "e1", offload="native")
        cutoff = NOW - 3 * DAY
        s.leave_rollup_states([Saved("gone", "http://gone/metrics", cutoff - 1, {}),
                               Saved("e1", "http://e1/metrics", cutoff + 1, {})])  # fmt: skip
        keep = sorted((w for w in windows if w.start >= cutoff), key=lambda w: w.start)
        dry = s.prune(cutoff, batch=batch, dry_run=True)
        assert (dry.windows, dry.outcomes, dry.dry_run) == (len(windows) - len(keep), 7, True)
        assert s.stats()["windows"] == len(windows)  # a dry run deletes nothing
        done = s.prune(cutoff, batch=batch)
        assert (done.windows, done.outcomes) == (dry.windows, dry.outcomes)
        assert sorted(s.read_windows(), key=lambda w: w.start) == keep
        assert [o.started for o in s.outcomes()] == sorted(NOW - d * DAY - 30.0 for d in range(3))
        assert [e.source for e in s.engines()] == ["e1"]  # engines are kept
        assert s.prune(cutoff, batch=batch).windows == 0  # nothing left to prune
        assert set(s.take_rollup_states(["gone", "e1"])) == {"e1"}  # a state older: pruned


@pytest.mark.parametrize(
    ("cutoff", "batch", "says"),
    [(float("nan"), 10, "finite time"), (float("inf"), 10, "finite time"), (NOW, 0, ">= 1")],
)
def test_prune_bad_arguments_refused(tmp_path: Path, cutoff: float, batch: int, says: str) -> None:
    with Store(f"sqlite:///{tmp_path / 'k.db'}") as s:
        s.migrate()
        with pytest.raises(ConfigError, match=says):
            s.prune(cutoff, batch=batch)


def test_prune_in_batches_while_a_collector_writes(db_url: str) -> None:
    with Store(db_url) as s:
        s.migrate()
        s.write_windows(_windows(20, per_day=100))
    fresh = [Window("e2", "kv_cache_usage_ratio", (), NOW + 60.0 * i, 60.0, "gauge", 4, mean=1.0)
             for i in range(300)]  # fmt: skip
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            with Store(db_url, batch_size=10) as w:
                for i in range(0, len(fresh), 10):
                    w.write_windows(fresh[i : i + 10])
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=writer, daemon=True)
    with Store(db_url) as s:
        thread.start()
        pruned = s.prune(NOW - 5 * DAY, batch=50)
        thread.join(timeout=120)
        assert errors == [] and not thread.is_alive()
        assert pruned.windows == 15 * 100
        left = s.read_windows()
    assert len(left) == 5 * 100 + len(fresh)
    assert {w.start for w in left if w.source == "e2"} == {w.start for w in fresh}


def test_sqlite_windows_stay_one_table(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'k.db'}"
    with Store(db) as s:
        assert s.migrate() == SCHEMA_VERSION
        s.write_windows(_windows(3))
        pruned = s.prune(NOW - 1.5 * DAY, whole_partitions=True)  # no partitions: rows deleted
        assert (pruned.windows, pruned.partitions) == (40, 0)
        assert "partitions" not in s.stats()
    engine = sqlalchemy.create_engine(db)
    with engine.connect() as conn:
        tables = set(conn.execute(sqlalchemy.text(
            "SELECT name FROM sqlite_master WHERE type = 'table'")).scalars())  # fmt: skip
    engine.dispose()
    assert "chunks" in tables and not any(n.startswith("chunks_p") for n in tables)


# ---- Pruner (the collect loops' retention) ----------------------------------------------------


def test_pruner_runs_at_once_then_every_period_in_a_thread(tmp_path: Path) -> None:
    with Store(f"sqlite:///{tmp_path / 'k.db'}") as s:
        s.migrate()
        s.write_windows(_windows(10))
        pruner = Pruner(s, 3 * DAY, every_s=3_600.0)
        main = threading.get_ident()
        threads: list[int] = []
        prune = s.prune

        def spy(cutoff: float, *, whole_partitions: bool = False) -> Pruned:
            threads.append(threading.get_ident())
            assert whole_partitions  # the collector drops whole days only (PostgreSQL)
            return prune(cutoff, whole_partitions=whole_partitions)

        s.prune = spy  # type: ignore[method-assign,assignment]

        async def loop() -> None:
            pruner.tick(NOW)  # due at once
            await asyncio.sleep(0)
            pruner.tick(NOW + 60.0)  # a prune running or just done: not another one
            await pruner.close()
            pruner.tick(NOW + 3_599.0)  # not due yet
            await pruner.close()
            pruner.tick(NOW + 3_600.0 + DAY)  # due: a day later, another day's windows go
            await pruner.close()

        asyncio.run(loop())
        assert len(threads) == 2 and main not in threads
        assert pruner.windows == 7 * 40 + 40 and pruner.errors == 0
        assert pruner.summary()["deleted_windows"] == 320


def test_pruner_store_failure_counted_and_retried_next_period(tmp_path: Path) -> None:
    class Down:
        def prune(self, cutoff: float, *, whole_partitions: bool = False) -> Pruned:
            raise StoreError("pruning windows failed on sqlite:///k.db: disk I/O error")

    pruner = Pruner(Down(), DAY, every_s=10.0)  # type: ignore[arg-type]

    async def loop() -> None:
        pruner.tick(NOW)
        await pruner.close()
        pruner.tick(NOW + 10.0)
        await pruner.close()

    asyncio.run(loop())
    assert pruner.errors == 2 and pruner.windows == 0


@pytest.mark.parametrize("retention", [0.0, -1.0, float("nan")])
def test_pruner_bad_retention_refused(retention: float) -> None:
    with pytest.raises(ConfigError, match="retention must be > 0"):
        Pruner(None, retention)  # type: ignore[arg-type]


# ---- the CLI ----------------------------------------------------------------------------------


def _daily_store(tmp_path: Path) -> str:
    """A SQLite store with one window 1, 2, … 5 days before now."""
    db = f"sqlite:///{tmp_path / 'k.db'}"
    now = time.time()
    with Store(db) as s:
        s.migrate()
        s.write_windows([Window("e1", "kv_cache_usage_ratio", (), now - d * DAY, 60.0, "gauge",
                                4, mean=0.5) for d in range(1, 6)])  # fmt: skip
    return db


def test_db_prune_cli(tmp_path: Path) -> None:
    db = _daily_store(tmp_path)
    for bad, says in (("30", "must be at least 1h, got '30' (30 s)"), ("soon", "--older-than")):
        proc = run_kvscope("db", "prune", "--older-than", bad, "--db", db)
        assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    dry = run_kvscope("db", "prune", "--older-than", "60h", "--db", db, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["windows"] == 3 and json.loads(dry.stdout)["dry_run"]
    done = run_kvscope("db", "prune", "--older-than", "60h", "--db", db)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["windows"] == 3 and out["cutoff_utc"].endswith("Z")
    with Store(db) as s:
        assert s.stats()["windows"] == 2


def test_collect_retention_prunes_old_windows(tmp_path: Path) -> None:
    db = _daily_store(tmp_path)
    targets = tmp_path / "t.json"
    targets.write_text(json.dumps({"cluster": "c", "targets": [
        {"name": "gone", "url": "http://127.0.0.1:9/metrics"}]}))  # fmt: skip
    bad = run_kvscope("collect", "--targets", str(targets), "--db", db, "--once", "--retention",
                      "10m")  # fmt: skip
    assert bad.returncode == 2 and "--retention must be at least 1h" in bad.stderr
    proc = run_kvscope("collect", "--targets", str(targets), "--db", db, "--once", "-q",
                       "--retention", "3d", "--state-dir", str(tmp_path / "state"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["retention"]["deleted_windows"] == 3, summary
    with Store(db) as s:
        assert s.stats()["windows"] == 2
