"""Window writes into the store: rows/s into SQLite and PostgreSQL 15 against raw drivers.

Run: .venv/bin/python benchmarks/bench_store.py [--rows 200000] [--no-postgres]

Each backend gets a fresh database migrated by Store (same schema, same upsert statement, same
batch size, one transaction per batch). The baselines write the same rows, prepared in advance
as driver tuples, with the bare drivers: sqlite3 ``executemany`` and psycopg ``executemany``
(pipeline) and ``COPY`` (COPY cannot upsert: an upper bound, not a fair competitor). Store's
figure includes turning Window records into rows. The issue's target: >= 50 k rows/s to SQLite.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collector.models import WindowRow, labels_json, series_key  # noqa: E402
from collector.records import Window  # noqa: E402
from collector.store import Store  # noqa: E402

COLUMNS = [c.name for c in WindowRow.__table__.columns if c.name != "id"]
KEY = ("source", "series_key", "start")
SIGNALS = (
    ("kv_cache_usage_ratio", "gauge"),
    ("requests_running", "gauge"),
    ("preemptions_total", "counter"),
    ("prompt_tokens_total", "counter"),
    ("ttft_seconds", "histogram"),
)


def make_windows(rows: int, sources: int = 20, series_per_source: int = 250) -> list[Window]:
    """Windows as the collector writes them: per minute, per source, every series."""
    rng = random.Random(42)
    out: list[Window] = []
    minute = 0
    while len(out) < rows:
        start = 1_764_000_000.0 + 60.0 * minute
        for s in range(sources):
            for k in range(series_per_source):
                signal, kind = SIGNALS[k % len(SIGNALS)]
                labels = (("engine", str(k // len(SIGNALS))), ("model_name", "llama-3-70b"))
                x = rng.random()
                out.append(
                    Window(f"engine-{s:03d}", signal, labels, start, 60.0, kind, 4,
                           delta=x * 100, rate=x * 100 / 60, mean=x, min=x / 2, max=x * 2,
                           last=x, p50=x, p90=x * 1.5, p99=x * 3, sum_delta=x * 50)
                )  # fmt: skip
                if len(out) == rows:
                    return out
        minute += 1
    return out


def as_tuples(windows: Sequence[Window]) -> list[tuple[Any, ...]]:
    rows = []
    for w in windows:
        row = {c: getattr(w, c, None) for c in COLUMNS}
        row["labels"] = labels_json(w.labels)
        row["series_key"] = series_key(w.signal, w.labels)
        rows.append(tuple(row[c] for c in COLUMNS))
    return rows


def upsert_sql(placeholder: str) -> str:
    sets = ", ".join(f"{c} = excluded.{c}" for c in COLUMNS if c not in KEY)
    return (
        f"INSERT INTO windows ({', '.join(COLUMNS)}) VALUES "
        f"({', '.join([placeholder] * len(COLUMNS))}) "
        f"ON CONFLICT ({', '.join(KEY)}) DO UPDATE SET {sets}"
    )


def timed(fn: Callable[[], object], rows: int) -> float:
    t0 = time.perf_counter()
    fn()
    return rows / (time.perf_counter() - t0)


def bench_sqlite(windows: list[Window], tuples: list[tuple[Any, ...]], batch: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="kvscope-bench-"))

    def fresh(name: str) -> str:
        url = f"sqlite:///{tmp / name}"
        with Store(url) as store:
            store.migrate()
        return url

    def raw() -> None:
        con = sqlite3.connect(tmp / "raw.db", isolation_level=None)
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=NORMAL")
        sql = upsert_sql("?")
        for i in range(0, len(tuples), batch):
            con.execute("BEGIN IMMEDIATE")
            con.executemany(sql, tuples[i : i + batch])
            con.execute("COMMIT")
        con.close()

    fresh("raw.db")
    store = Store(fresh("store.db"), batch_size=batch)
    base = timed(raw, len(tuples))
    ours = timed(lambda: store.write_windows(windows), len(windows))
    again = timed(lambda: store.write_windows(windows), len(windows))
    store.close()
    report("sqlite", ours, base, "sqlite3.executemany", again)


def bench_postgres(windows: list[Window], tuples: list[tuple[Any, ...]], batch: int) -> None:
    import psycopg

    from tests import services

    with services.postgres() as url:
        with Store(url) as store:
            store.migrate()
        dsn = url.replace("postgresql+psycopg://", "postgresql://")

        def raw_executemany() -> None:
            with psycopg.connect(dsn) as con:
                sql = upsert_sql("%s")
                for i in range(0, len(tuples), batch):
                    with con.transaction(), con.cursor() as cur:
                        cur.executemany(sql, tuples[i : i + batch])

        def raw_copy() -> None:
            with psycopg.connect(dsn) as con:
                for i in range(0, len(tuples), batch):
                    with con.transaction(), con.cursor() as cur:
                        with cur.copy(f"COPY windows ({', '.join(COLUMNS)}) FROM STDIN") as copy:
                            for row in tuples[i : i + batch]:
                                copy.write_row(row)

        def truncate() -> None:
            with psycopg.connect(dsn, autocommit=True) as con:
                con.execute("TRUNCATE windows")

        base = timed(raw_executemany, len(tuples))
        truncate()
        copy = timed(raw_copy, len(tuples))
        truncate()
        store = Store(url, batch_size=batch)
        ours = timed(lambda: store.write_windows(windows), len(windows))
        again = timed(lambda: store.write_windows(windows), len(windows))
        store.close()
        report("postgresql", ours, base, "psycopg.executemany", again)
        print(f"  postgresql COPY (no upsert, upper bound): {copy:,.0f} rows/s "
              f"(Store = {ours / copy:.2f}x)")  # fmt: skip


def report(backend: str, ours: float, base: float, base_name: str, again: float) -> None:
    print(
        f"{backend}: Store.write_windows {ours:,.0f} rows/s (re-write, all updates: "
        f"{again:,.0f} rows/s) | baseline {base_name} {base:,.0f} rows/s | "
        f"ratio {ours / base:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=5_000)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    windows = make_windows(args.rows)
    tuples = as_tuples(windows)
    print(f"{len(windows):,} windows, batch {args.batch}")
    bench_sqlite(windows, tuples, args.batch)
    if not args.no_postgres:
        bench_postgres(windows, tuples, args.batch)


if __name__ == "__main__":
    main()
