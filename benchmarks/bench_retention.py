"""Retention on PostgreSQL 15: pruning one day of windows by dropping its partition against
the batched deletes of an unpartitioned table (schema 4), on the same rows, in the same run.

Run: .venv/bin/python benchmarks/bench_retention.py [--days 8] [--rows-per-day 100000]

One throwaway PostgreSQL (tests/services.postgres()), two schemas holding the same windows:
``part`` is a migrated store (windows partitioned by day), written by Store.write_windows;
``flat`` has the schema-4 table (one unpartitioned windows, BRIN on start), written by the
same Store code (its partition cache filled in advance, so that it never tries to make one),
a day at a time, interleaved — the write rates of both are printed. Then ``Store.prune``
with the cutoff at the end of the oldest day, on each: ``flat`` deletes 20,000 rows a
transaction (what retention did before), ``part`` detaches and drops one partition. For
each: wall time, SQL statements the prune sent, WAL written, and the table's size after; for
``flat`` also the VACUUM the dead rows need before their space is reused (``part`` has none).
Before the prunes, the plan's read (Store.read_frame: the whole table, and the newest two
days) on each, best of two, interleaved. Last, the schema 4 -> 5 migration of ``flat``
(what `kvscope db migrate` does to an existing store): rows/s.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
import sqlalchemy

from core.records import Window
from store import partitions
from store.store import Store
from store.tables import WindowRow
from tests import services

DAY = partitions.DAY_S
D0 = 20_420  # 2025-11-28


def make_windows(days: int, per_day: int) -> list[Window]:
    """``per_day`` windows a day: ceil(per_day / 1440) series of 10 sources every minute."""
    series = -(-per_day // 1440)
    out: list[Window] = []
    for d in range(days):
        n = 0
        for m in range(1440):
            start = float((D0 + d) * DAY + 60 * m)
            for k in range(series):
                if n == per_day:
                    break
                x = (k * 7 + m) % 100 / 100
                out.append(Window(f"engine-{k % 10:02d}", "kv_cache_usage_ratio",
                                  (("engine", str(k)),), start, 60.0, "gauge", 4, mean=x,
                                  min=x / 2, max=x, last=x))  # fmt: skip
                n += 1
    return out


def _admin(server: str, sql: str) -> Any:
    with psycopg.connect(
        server.replace("postgresql+psycopg://", "postgresql://"), autocommit=True
    ) as c:
        cur = c.execute(sql)
        return cur.fetchall() if cur.description else None


def _counted(store: Store) -> list[str]:
    """Every statement the store's connections send from now on."""
    sent: list[str] = []
    sqlalchemy.event.listen(
        store._engine, "before_cursor_execute", lambda _c, _cur, sql, *_a: sent.append(sql)
    )
    return sent


def _wal(server: str) -> int:
    return int(_admin(server, "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")[0][0])


def _size(server: str, schema: str) -> int:
    return int(_admin(server, (
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c WHERE "
        f"c.relnamespace = '{schema}'::regnamespace AND c.relkind = 'r' "
        "AND (c.relname = 'windows' OR c.relname LIKE 'windows_p%')"))[0][0])  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--days", type=int, default=8)
    ap.add_argument("--rows-per-day", type=int, default=100_000)
    args = ap.parse_args()
    windows = make_windows(args.days, args.rows_per_day)
    cutoff = float((D0 + 1) * DAY)
    pruned_rows = sum(1 for w in windows if w.start < cutoff)
    print(f"{len(windows):,} windows over {args.days} days; prune {pruned_rows:,} (one day)")
    with services.postgres() as server:
        urls = {}
        for schema in ("part", "flat"):
            _admin(server, f"CREATE SCHEMA {schema}")
            urls[schema] = f"{server}?options=-csearch_path%3D{schema}"
            with Store(urls[schema]) as s:
                s.migrate()
        engine = sqlalchemy.create_engine(urls["flat"])
        with engine.begin() as conn:  # schema 4's table
            conn.execute(sqlalchemy.text("DROP TABLE windows"))
            cast(sqlalchemy.Table, WindowRow.__table__).create(conn)
        engine.dispose()
        stores = {schema: Store(url) for schema, url in urls.items()}
        stores["flat"]._partitions.add(range(D0 - 1, D0 + args.days + 2))  # none to make there
        wrote = dict.fromkeys(urls, 0.0)
        per_day = args.rows_per_day
        for d in range(args.days):  # a day at a time, each schema first every other day
            for schema in ("part", "flat") if d % 2 == 0 else ("flat", "part"):
                t0 = time.perf_counter()
                stores[schema].write_windows(windows[d * per_day : (d + 1) * per_day])
                wrote[schema] += time.perf_counter() - t0
        for schema, store in stores.items():
            store.close()
            took = wrote[schema]
            print(f"  write {schema}: {took:6.1f} s, {len(windows) / took:8,.0f} rows/s")
            _admin(server, f"VACUUM ANALYZE {schema}.windows")
        reads: dict[tuple[str, str], float] = {}
        since = float((D0 + args.days - 2) * DAY)
        for _ in range(2):
            for schema in ("flat", "part"):
                for what, filters in (("all", {}), ("2 days", {"since": since})):
                    with Store(urls[schema]) as s:
                        t0 = time.perf_counter()
                        s.read_frame(**filters)  # type: ignore[arg-type]
                        took = time.perf_counter() - t0
                    reads[schema, what] = min(reads.get((schema, what), math.inf), took)
        for what in ("all", "2 days"):
            flat, part = reads["flat", what], reads["part", what]
            print(f"  read_frame ({what}): flat {flat:.2f} s, part {part:.2f} s = "
                  f"{part / flat:.2f}x the unpartitioned time")  # fmt: skip
        results = {}
        for schema in ("flat", "part"):
            size = _size(server, schema)
            with Store(urls[schema]) as s:
                s.schema_version()  # connected
                sent = _counted(s)
                wal = _wal(server)
                t0 = time.perf_counter()
                pruned = s.prune(cutoff)
                took = time.perf_counter() - t0
                wal = _wal(server) - wal
            assert pruned.windows == pruned_rows, (schema, pruned.windows, pruned_rows)
            after = _size(server, schema)
            results[schema] = took
            print(f"  prune {schema}: {took:7.3f} s, {len(sent):3d} statements, WAL "
                  f"{wal / 1e6:6.1f} MB, {pruned.windows:,} windows ({pruned.partitions} "
                  f"partitions dropped); tables {size / 1e6:.0f} -> {after / 1e6:.0f} MB"
                  )  # fmt: skip
        t0 = time.perf_counter()
        _admin(server, "VACUUM flat.windows")
        vacuum = time.perf_counter() - t0
        print(f"  VACUUM flat.windows after its deletes: {vacuum:.3f} s (partitions: none needed)")
        _admin(server, "UPDATE flat.schema_version SET version = 4")
        with Store(urls["flat"]) as s:
            t0 = time.perf_counter()
            s.migrate()
            took = time.perf_counter() - t0
            left = s.stats()["windows"]
        print(f"  migrate flat 4 -> 5: {left:,} rows in {took:.1f} s = {left / took:,.0f} rows/s")
    ratio = results["flat"] / results["part"]
    print(f"RESULT prune of 1 day of {args.days} x {args.rows_per_day:,} rows: partition drop "
          f"{results['part']:.3f} s vs batched deletes {results['flat']:.3f} s = {ratio:.1f}x "
          "faster")  # fmt: skip


if __name__ == "__main__":
    main()
