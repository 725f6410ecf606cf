"""What keeping the KV residency histograms' bucket counts costs the store (schema 9).

Run: .venv/bin/python benchmarks/bench_bucket_storage.py [--engines 10] [--per-minute 200]
     [--no-postgres]

A synthetic store of ``--engines`` engines × 1 day of 60 s windows of the four keep_buckets
families (core.catalog BUCKET_SIGNALS): per engine vLLM's three KV residency histograms
(KV_RESIDENCY_BUCKETS, 21 bounds) and the L1 chunk reuse gap of its LMCache server (one server
per engine, LMCACHE_L1_LIFECYCLE_BUCKETS, 13 bounds): 5,760 windows per engine-day. Each
window's observations are Poisson with mean ``--per-minute``, spread over the buckets by a
log-normal gap (median 5 s, σ = 2.5 in ln s): the counts a direct collector's rollup writes.
The same windows are written three times by Store.write_windows into fresh stores: with their
bucket counts, with Prometheus mode's (the same counts × a non-integer extrapolation factor:
float64), and without any (the fields empty, as schema 8 stored them): the differences are what
keeping them adds. SQLite: the database file after VACUUM; PostgreSQL 15: the sum of
``pg_total_relation_size`` over the partitions of ``windows`` and ``window_blocks``
(identical in all three: the packs hold no buckets). It also measures what the NULL column
costs the rows that keep no buckets (every other signal's): 100,000 gauge windows written
into a store with the column and into one whose column was dropped (schema 8's table), and
the write rate with counts against without (interleaved, best of ``--reps``).
"""

from __future__ import annotations

import argparse
import math
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import sqlalchemy

from core.catalog import BUCKET_SIGNALS, SIGNALS
from core.records import Labels, Window
from planner.frames.residency import residency_histograms
from store.buckets import encode_buckets
from store.store import Store

DAY0 = 1_764_028_800.0  # a UTC midnight
WINDOWS_A_DAY = 1_440
GAP_MEDIAN_S, GAP_SIGMA = 5.0, 2.5


def _probabilities(bounds: tuple[float, ...]) -> np.ndarray:
    """P(gap in each bucket) of the log-normal gap (the +Inf bucket last)."""
    from math import erf, log, sqrt

    cdf = [0.5 * (1 + erf((log(b) - log(GAP_MEDIAN_S)) / (GAP_SIGMA * sqrt(2)))) for b in bounds]
    edges = np.array([0.0, *cdf, 1.0])
    return np.diff(edges)


def make_windows(engines: int, per_minute: float, seed: int = 1) -> list[Window]:
    """Every engine's and its LMCache server's windows of the four families for one day."""
    rng = np.random.default_rng(seed)
    out: list[Window] = []
    families = sorted(BUCKET_SIGNALS)
    probs = {s: _probabilities(SIGNALS[s].buckets) for s in families}
    for e in range(engines):
        for signal in families:
            lmcache = SIGNALS[signal].source == "lmcache"
            source = f"lmcache-{e:03d}" if lmcache else f"engine-{e:03d}"
            labels: Labels = (
                (("l1_tag", "_default"),) if lmcache else (("engine", "0"), ("model_name", "m"))
            )
            bounds = SIGNALS[signal].buckets
            n = rng.poisson(per_minute, WINDOWS_A_DAY)
            counts = [rng.multinomial(k, probs[signal]).astype(float) for k in n]
            for i in range(WINDOWS_A_DAY):
                c = tuple(counts[i].tolist())
                total = float(sum(c))
                out.append(Window(source, signal, labels, DAY0 + 60.0 * i, 60.0, "histogram",
                                  4, delta=total, rate=total / 45.0, mean=2.0, last=total * i,
                                  p50=1.0, p90=2.0, p99=3.0, sum_delta=2.0 * total,
                                  bucket_bounds=bounds, bucket_counts=c))  # fmt: skip
    return out


def variants(windows: list[Window]) -> dict[str, list[Window]]:
    """kept (as the rollup writes them), prometheus (fractional: float64), none."""
    factor = 1.0 + 1.0 / 37.0
    return {
        "kept": windows,
        "prometheus": [
            replace(w, bucket_counts=tuple(c * factor for c in w.bucket_counts)) for w in windows
        ],
        "none": [replace(w, bucket_bounds=(), bucket_counts=()) for w in windows],
    }


def sqlite_bytes(path: Path) -> int:
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.execute("VACUUM")
    con.close()
    return path.stat().st_size


def pg_bytes(url: str) -> int:
    engine = sqlalchemy.create_engine(url, isolation_level="AUTOCOMMIT")  # VACUUM: no transaction
    with engine.connect() as conn:
        conn.execute(sqlalchemy.text("VACUUM ANALYZE"))
        total = conn.execute(
            sqlalchemy.text(
                "SELECT sum(pg_total_relation_size(relid)) FROM (SELECT relid FROM "
                "pg_partition_tree('windows') UNION ALL SELECT relid FROM "
                "pg_partition_tree('window_blocks')) AS t"
            )
        ).scalar_one()
    engine.dispose()
    return int(total)


def fill(url: str, windows: list[Window]) -> float:
    with Store(url) as store:
        store.migrate()
        t0 = time.perf_counter()
        store.write_windows(windows)
        store.pack_windows()
        return time.perf_counter() - t0


def report(backend: str, sizes: dict[str, int], engines: int, blobs: dict[str, float]) -> None:
    none = sizes["none"]
    print(f"{backend}: store of the four families, {engines} engine(s) × 1 day: "
          f"{none / 1e6:.2f} MB without counts")  # fmt: skip
    for name in ("kept", "prometheus"):
        added = sizes[name] - none
        print(f"  {name:10s} +{added / 1e6:.3f} MB = {added / engines / 1e3:,.0f} kB per "
              f"engine-day = {added / (engines * 4 * WINDOWS_A_DAY):.1f} B a window with counts "
              f"(mean BLOB {blobs[name]:.1f} B)")  # fmt: skip


_GAUGE_COLUMNS = ("source, signal, labels, series_key, start, length_s, kind, samples, delta, "
                  "rate, resets, mean, min, max, last, p50, p90, p99, sum_delta")  # fmt: skip


def _gauge_rows(rows: int) -> list[tuple[object, ...]]:
    from store.tables import labels_json, series_key

    labels: Labels = (("engine", "0"),)
    text, key = labels_json(labels), series_key("kv_cache_usage_ratio", labels)
    return [(f"engine-{i % 50:03d}", "kv_cache_usage_ratio", text, key, DAY0 + 60.0 * (i // 50),
             60.0, "gauge", 4, None, None, 0, 0.5, 0.1, 0.9, 0.5, None, None, None, None)
            for i in range(rows)]  # fmt: skip


def null_column_cost(rows: int) -> float:
    """Bytes a row without counts pays for the NULL column on SQLite: the same gauge rows
    inserted into the windows table of schema 9 and into schema 8's (the column dropped)."""
    tmp = Path(tempfile.mkdtemp(prefix="kvscope-bucketcost-"))
    gauges = _gauge_rows(rows)
    sizes = []
    for drop in (False, True):
        path = tmp / f"g{int(drop)}.db"
        with Store(f"sqlite:///{path}") as store:
            store.migrate()
        con = sqlite3.connect(path)
        if drop:
            con.execute("ALTER TABLE windows DROP COLUMN buckets")  # schema 8's table
        con.executemany(
            f"INSERT INTO windows ({_GAUGE_COLUMNS}) VALUES ({', '.join('?' * 19)})", gauges
        )
        con.commit()
        con.close()
        sizes.append(sqlite_bytes(path))
    return (sizes[0] - sizes[1]) / rows


def null_column_cost_pg(base: str, rows: int) -> float:
    """The same on PostgreSQL (the windows partitions' total size)."""
    from store import partitions

    gauges = _gauge_rows(rows)
    days = {int(float(str(g[4])) // partitions.DAY_S) for g in gauges}
    sizes = []
    for drop in (False, True):
        url = f"{base}/b_null{int(drop)}"
        with Store(url) as store:
            store.migrate()
        engine = sqlalchemy.create_engine(url)
        with engine.begin() as conn:
            if drop:
                conn.execute(sqlalchemy.text("ALTER TABLE windows DROP COLUMN buckets"))
            partitions.make_days(conn, days)
            conn.exec_driver_sql(
                f"INSERT INTO windows ({_GAUGE_COLUMNS}) VALUES ({', '.join(['%s'] * 19)})",
                gauges,
            )
        engine.dispose()
        sizes.append(pg_bytes(url))
    return (sizes[0] - sizes[1]) / rows


def write_ratio(windows: list[Window], reps: int, url_of: Callable[[str], str]) -> float:
    """Write time with counts ÷ without (the same windows), best of ``reps`` each."""
    plain = [replace(w, bucket_bounds=(), bucket_counts=()) for w in windows]
    best = {"kept": math.inf, "none": math.inf}
    for r in range(reps):
        for name, ws in (("kept", windows), ("none", plain)):
            with Store(url_of(f"w{r}{name}")) as store:
                store.migrate()
                t0 = time.perf_counter()
                store.write_windows(ws)
                best[name] = min(best[name], time.perf_counter() - t0)
    return best["kept"] / best["none"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=10)
    parser.add_argument("--per-minute", type=float, default=200.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    windows = make_windows(args.engines, args.per_minute)
    sets = variants(windows)
    blobs = {
        name: float(np.mean([len(encode_buckets(w.bucket_bounds, w.bucket_counts)) for w in ws]))
        for name, ws in sets.items()
        if name != "none"
    }
    print(f"{len(windows):,} windows ({args.engines} engines × 4 families × 1 day), "
          f"{args.per_minute:g} observations a window on average")  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="kvscope-bucketcost-"))
    sizes = {}
    for name, ws in sets.items():
        path = tmp / f"{name}.db"
        took = fill(f"sqlite:///{path}", ws)
        sizes[name] = sqlite_bytes(path)
        print(f"  sqlite {name:10s} written and packed in {took:.1f} s")
    report("SQLite", sizes, args.engines, blobs)
    with Store(f"sqlite:///{tmp / 'kept.db'}") as store:
        t0 = time.perf_counter()
        sums = residency_histograms(store)
        took = time.perf_counter() - t0
    print(f"  residency_histograms over the whole day: {took:.2f} s for {len(windows):,} windows "
          f"({took / len(windows) * 1e6:.1f} µs a window), {len(sums)} keys")  # fmt: skip
    print(f"  NULL column on a row without counts (SQLite): {null_column_cost(100_000):+.2f} B")
    ratio = write_ratio(windows[:50_000], args.reps, lambda n: f"sqlite:///{tmp / n}.db")
    print(f"  write time with counts ÷ without, 50,000 windows: {ratio:.2f}")
    if args.no_postgres:
        return
    from tests import services

    with services.postgres() as server:
        engine = sqlalchemy.create_engine(server, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            reps = (f"w{r}{n}" for r in range(args.reps) for n in ("kept", "none"))
            for name in (*sets, *reps, "null0", "null1"):
                conn.execute(sqlalchemy.text(f"CREATE DATABASE b_{name}"))
        engine.dispose()
        base = server.rsplit("/", 1)[0]
        pg = {}
        for name, ws in sets.items():
            url = f"{base}/b_{name}"
            took = fill(url, ws)
            pg[name] = pg_bytes(url)
            print(f"  postgresql {name:10s} written and packed in {took:.1f} s")
        report("PostgreSQL 15", pg, args.engines, blobs)
        print(f"  NULL column on a row without counts (PostgreSQL): "
              f"{null_column_cost_pg(base, 100_000):+.2f} B")  # fmt: skip
        ratio = write_ratio(windows[:50_000], args.reps, lambda n: f"{base}/b_{n}")
        print(f"  write time with counts ÷ without, 50,000 windows: {ratio:.2f}")


if __name__ == "__main__":
    main()
