"""`kvscope plan` on 100 engines × 7 days of 1-minute windows: read paths and the whole plan.

Builds (once, cached under /tmp; ``--rebuild`` to redo) a SQLite store of a seeded synthetic
cluster (benchmarks.accuracy.fitsynth: 100 engines, none/native/lmcache in turn, ~12.7 M windows of
every
signal the plan reads, written in time order with Store.write_windows as the collector
would), then times in the same run:

* baseline: ``Store.read_windows`` (one Window object per row) on a subset of the engines,
  extrapolated to the whole store by its rows/s;
* ``Store.read_frame`` on the same subset (same rows, ratio against the baseline) and on the
  whole store with the plan's columns, from the packed hours and from the rows alone
  (``packed=False``); on SQLite also the driver alone on the same statement (rows fetched and
  dropped: the floor of any read through Python's sqlite3);
* ``build_plan`` on the whole store: wall and CPU time and the seconds of each stage
  (PlanDetails.seconds), against the baseline plan (read_windows extrapolated + the same
  later stages).

* the whole process, ``kvscope plan --since all --json`` (benchmarks/plan_whole.py), one
  variant after the other, ``--rounds`` times over: on SQLite with the packed hours
  (collector/store_blocks.py) and with every read through the rows (``read_frame(packed=False)``,
  the read path before schema 6; ``--no-rows`` skips it); with ``--postgres``, on PostgreSQL
  too (the client's CPU and the server's); with ``--baseline REV`` (or its older name
  ``--pg-baseline``) the same command of revision REV on each backend timed (a revision of an
  older schema is told to take the store's for its own: its plan reads ``windows``, the
  packed hours and the inventory, which schema 7 left as they were). Wall and CPU of each
  run, the best run's ratios to SQLite's, and whether each plan's JSON is SQLite's (but for
  its own timings and store URL).

A cached store of an older schema is migrated first (the time is printed; ``--db`` a copy of
the cache when other checkouts of an older schema read it). ``--postgres`` copies the store
into a throwaway PostgreSQL 15 (tests/services.py; ``--pg-url`` reuses one that already holds
the copy, packed), packs the copy as a store is packed (``--pg-pack windows``:
``Store.pack_windows``, the collectors' packer; ``--pg-pack migrate``: the migration from
schema 6; the time is printed) and also times read_frame and build_plan there. BLAS threads
are pinned to one before numpy loads (the whole processes inherit it).

    .venv/bin/python benchmarks/bench_plan.py [--engines 100] [--days 7] [--rebuild]
    .venv/bin/python benchmarks/bench_plan.py --whole-only --postgres --no-rows --rounds 3 \
        --baseline aaada7a [--pg-pack migrate] [--db /tmp/copy.db]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import sqlite3  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from contextlib import ExitStack  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, TypeVar, cast  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import plan_whole  # noqa: E402
from benchmarks.accuracy.fitsynth import frame_to_windows, synthetic_frame  # noqa: E402
from planner.frames.table import PLAN_COLUMNS  # noqa: E402
from planner.plan.build import build_plan  # noqa: E402
from planner.plan.observe import NEEDED_SIGNALS  # noqa: E402
from store.frame import CATEGORY_COLUMNS  # noqa: E402
from store.store import Store  # noqa: E402
from store.tables import SCHEMA_VERSION, WindowBlockRow  # noqa: E402
from tests.planner.synthstore import BLOCK_SIZE, BLOCKS, GPU, MODEL, TP, with_rates  # noqa: E402

CLUSTER = "bench"
T = TypeVar("T")


def build(path: Path, engines: int, days: float, seed: int) -> None:
    """Write the synthetic store to ``path`` (via a temporary file: no half-built cache)."""
    tmp = path.with_name(path.name + ".building")
    for p in (tmp, *(tmp.with_name(tmp.name + x) for x in ("-wal", "-shm"))):
        p.unlink(missing_ok=True)
    frame = synthetic_frame(engines, int(days * 1440), seed=seed)
    frame = frame.sort_values(["start", "source"], kind="stable", ignore_index=True)
    t0, written = time.perf_counter(), 0
    with Store(f"sqlite:///{tmp}", batch_size=50_000) as store:
        store.migrate()
        step = engines * 360  # six hours of the cluster per chunk
        for i in range(0, len(frame), step):
            written += store.write_windows(with_rates(frame_to_windows(frame.iloc[i : i + step])))
            rate = written / (time.perf_counter() - t0)
            print(f"\r  building: {written:,} windows ({rate:,.0f}/s)", end="", file=sys.stderr)
        for source, mode in frame.groupby("source")["offload_mode"].first().items():
            facts = {"num_gpu_blocks": BLOCKS, "block_size": BLOCK_SIZE}
            store.upsert_engine(CLUSTER, str(source), model=MODEL, gpu=GPU, tensor_parallel=TP,
                                offload=str(mode), facts=facts)  # fmt: skip
    with sqlite3.connect(tmp) as con:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    tmp.rename(path)
    print(f"\n  built {written:,} windows in {time.perf_counter() - t0:.0f} s", file=sys.stderr)


def timed(fn: Callable[[], T]) -> tuple[float, float, T]:
    """(wall s, CPU s of this process, result)."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - t0, time.process_time() - c0, out


def line(label: str, wall: float, cpu: float, extra: str = "") -> None:
    print(f"{label:<46s} {wall:8.2f} s wall {cpu:8.2f} s cpu  {extra}", flush=True)


def bench(url: str, sources: list[str], total_rows: int, forecast_seconds: float) -> None:
    """Every timing of the module docstring on one store."""
    with Store(url) as store:
        store.read_frame(signals=["warm-up"])
        wall, cpu, rows = timed(lambda: store.read_windows(sources=sources))
        base_rate = len(rows) / wall  # wall clock: on PostgreSQL the server does much work
        line(f"baseline read_windows ({len(sources)} engines)", wall, cpu,
             f"{len(rows):,} rows, {base_rate:,.0f} rows/s")  # fmt: skip
        del rows
        wall, cpu, sub = timed(lambda: store.read_frame(sources=sources))
        rate = len(sub) / wall
        line(f"read_frame ({len(sources)} engines, all columns)", wall, cpu,
             f"{rate:,.0f} rows/s = {rate / base_rate:.1f}× baseline")  # fmt: skip
        del sub
        base_all = total_rows / base_rate
        print(f"{'baseline read_windows, whole store (extrap.)':<46s} {base_all:8.1f} s wall")
        wall, cpu, table = timed(
            lambda: store.read_frame(signals=sorted(NEEDED_SIGNALS), columns=PLAN_COLUMNS)
        )
        line("read_frame (whole store, plan columns)", wall, cpu,
             f"{len(table):,} rows, {len(table) / wall:,.0f} rows/s = "
             f"{base_all / wall:.1f}× baseline")  # fmt: skip
        del table
        packed_wall = wall
        wall, cpu, table = timed(lambda: store.read_frame(
            signals=sorted(NEEDED_SIGNALS), columns=PLAN_COLUMNS, packed=False))  # fmt: skip
        line("read_frame (whole store, plan columns, rows)", wall, cpu,
             f"{len(table):,} rows; packed hours {wall / packed_wall:.1f}× faster")  # fmt: skip
        del table
        if url.startswith("sqlite:"):
            wall, cpu, n = timed(lambda: driver_floor(url.split(":///", 1)[1]))
            line("  of it SQLite's driver alone (no conversion)", wall, cpu,
                 f"{n:,} rows, {cpu / max(n, 1) * 1e6:.2f} µs cpu a row")  # fmt: skip
        wall, cpu, plan = timed(lambda: build_plan(store, forecast_seconds=forecast_seconds))
        stages = dict(plan.details.seconds)
        line("build_plan (whole store)", wall, cpu, f"{plan.window['windows']:,} windows")
        for stage, seconds in stages.items():
            print(f"  {stage:<44s} {seconds:8.2f} s wall")
        baseline_plan = wall - stages.get("read", 0.0) + base_all
        verdict = "met" if wall <= 30 else "NOT met"
        print(f"RESULT {url.split(':', 1)[0]}: build_plan {wall:.1f} s wall ({cpu:.1f} s cpu "
              f"in this process) = {baseline_plan / wall:.1f}× faster than with read_windows "
              f"(~{baseline_plan:.0f} s); target <= 30 s: {verdict}")  # fmt: skip


def driver_floor(path: str) -> int:
    """Rows of read_frame's SQLite statement for the plan (its row key and the plan's numeric
    columns, the table scanned), fetched and dropped: what the driver alone costs."""
    numeric = [c for c in PLAN_COLUMNS if c not in CATEGORY_COLUMNS]
    marks = ", ".join("?" * len(NEEDED_SIGNALS))
    sql = (f"SELECT series_key || char(31) || kind || char(31) || source, {', '.join(numeric)} "
           f"FROM windows NOT INDEXED WHERE signal IN ({marks})")  # fmt: skip
    n = 0
    with sqlite3.connect(path) as con:
        cursor = con.execute(sql, sorted(NEEDED_SIGNALS))
        while rows := cursor.fetchmany(65_536):
            n += len(rows)
    return n


def whole_process(path: Path, pg_url: str | None, args: argparse.Namespace) -> None:
    """The whole-process variants of the module docstring, alternated ``--rounds`` times."""
    lite = f"sqlite:///{path}"
    variants = []
    if not args.skip_sqlite:
        variants.append(plan_whole.Variant("sqlite, packed hours", plan_whole.cli(lite), lite))
        if not args.no_rows:
            rows = plan_whole.rows_cli(lite)
            variants.append(plan_whole.Variant("sqlite, rows (before schema 6)", rows, lite))
    with ExitStack() as stack:
        tree = None
        if args.baseline:
            tree = stack.enter_context(plan_whole.revision_tree(args.baseline))
        if tree is not None and not args.skip_sqlite:
            old = plan_whole.tree_cli(tree, lite, schema=SCHEMA_VERSION)
            variants.append(plan_whole.Variant(f"sqlite at {args.baseline}", old, lite))
        if pg_url is not None:
            cpu = plan_whole.postgres_cpu(pg_url)
            pg = plan_whole.cli(pg_url)
            variants.append(plan_whole.Variant("postgresql", pg, pg_url, cpu))
            if tree is not None:
                old = plan_whole.tree_cli(tree, pg_url, schema=SCHEMA_VERSION)
                name = f"postgresql at {args.baseline}"
                variants.append(plan_whole.Variant(name, old, pg_url, cpu))
        runs = plan_whole.run_rounds(variants, args.rounds)
    plan_whole.summary(variants, runs)


def copy_to_postgres(sqlite_path: Path, url: str, pack: str) -> None:
    """The SQLite store's windows and engines into a migrated PostgreSQL (COPY), then packed
    the way a store is: by ``Store.pack_windows`` (``pack="windows"``: the packer the
    collectors run, a transaction a source and 48 hours, under the hours' locks) or by the
    migration from schema 6 (``pack="migrate"``: the copy taken back to how schema 6 left a
    PostgreSQL store, then ``Store.migrate``)."""
    import psycopg
    import sqlalchemy

    from store import partitions
    from store.tables import WindowRow

    cols = [c.name for c in WindowRow.__table__.columns if c.name != "id"]
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    with Store(url) as store:
        store.migrate()
        with Store(f"sqlite:///{sqlite_path}") as src:
            for e in src.engines():
                store.upsert_engine(e.cluster, e.source, model=e.model, gpu=e.gpu,
                                    tensor_parallel=e.tensor_parallel, offload=e.offload,
                                    facts=dict(e.facts))  # fmt: skip
    t0 = time.perf_counter()
    with sqlite3.connect(sqlite_path) as lite:  # the day partitions the COPY needs
        lo, hi = lite.execute("SELECT min(start), max(start) FROM windows").fetchone()
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as conn:
        partitions.make_days(conn, range(partitions.day_of(lo), partitions.day_of(hi) + 1))
    engine.dispose()
    unique = "uq_windows_source_start_series"
    with psycopg.connect(dsn, autocommit=True) as pg:  # bulk load: indexes built after
        pg.execute("DROP INDEX ix_windows_signal_start")
        pg.execute(f"ALTER TABLE windows DROP CONSTRAINT {unique}")
    with (
        sqlite3.connect(sqlite_path) as lite,
        psycopg.connect(dsn) as pg,
        pg.cursor() as cur,
        cur.copy(f"COPY windows ({', '.join(cols)}) FROM STDIN") as copy,
    ):
        for row in _rows(lite, f"SELECT {', '.join(cols)} FROM windows ORDER BY id"):
            copy.write_row(row)
    with psycopg.connect(dsn, autocommit=True) as pg:
        key = "(source, start, series_key)"  # store/tables.py's unique constraint
        pg.execute(f"ALTER TABLE windows ADD CONSTRAINT {unique} UNIQUE {key}")
        pg.execute("CREATE INDEX ix_windows_signal_start ON windows (signal, start)")
        pg.execute("VACUUM ANALYZE windows")
        if pack == "migrate":  # schema 6 on PostgreSQL: window_blocks one empty table
            pg.execute("DROP TABLE window_blocks")
            pg.execute("DROP INDEX ix_packed_hours_hour")
            pg.execute("UPDATE schema_version SET version = 6")
    print(f"  copied into PostgreSQL in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    t0 = time.perf_counter()
    with Store(url) as store:
        if pack == "migrate":
            engine = sqlalchemy.create_engine(url)
            with engine.begin() as conn:
                cast(Any, WindowBlockRow.__table__).create(conn)
            engine.dispose()
            store.migrate()
        else:
            store.pack_windows()
    with psycopg.connect(dsn, autocommit=True) as pg:
        pg.execute("VACUUM ANALYZE window_blocks")
        pg.execute("VACUUM ANALYZE packed_hours")
        n, blocks = pg.execute("SELECT sum(n), count(*) FROM window_blocks").fetchone() or (0, 0)
    how = "migration 6 -> 7" if pack == "migrate" else "Store.pack_windows"
    print(f"  packed {int(n or 0):,} windows into {blocks:,} blocks on PostgreSQL by {how} in "
          f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)  # fmt: skip


def _rows(con: sqlite3.Connection, sql: str) -> Iterator[Any]:
    cursor = con.execute(sql)
    while rows := cursor.fetchmany(50_000):
        yield from rows


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--engines", type=int, default=100)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--subset", type=int, default=5, help="engines read by the baseline")
    ap.add_argument("--db", type=Path, help="store path (default: cached under /tmp)")
    ap.add_argument("--rebuild", action="store_true", help="rebuild the cached store")
    ap.add_argument("--postgres", action="store_true", help="also time a PostgreSQL copy")
    ap.add_argument("--skip-sqlite", action="store_true", help="time PostgreSQL only")
    ap.add_argument("--forecast-seconds", type=float, default=8.0)
    ap.add_argument("--whole-only", action="store_true", help="only the whole-process timing")
    ap.add_argument("--rounds", type=int, default=1, help="whole-process rounds (alternated)")
    ap.add_argument("--no-rows", action="store_true", help="no whole process reading rows")
    ap.add_argument("--baseline", "--pg-baseline", metavar="REV",
                    help="also REV's kvscope plan, on each backend timed")  # fmt: skip
    ap.add_argument("--pg-url", help="a PostgreSQL already holding the copy (implies --postgres)")
    ap.add_argument("--pg-pack", choices=("windows", "migrate"), default="windows",
                    help="pack the PostgreSQL copy by Store.pack_windows or by migrating it "
                    "from schema 6")  # fmt: skip
    args = ap.parse_args()
    path = args.db or Path(f"/tmp/kvscope-bench-plan-{args.engines}x{args.days:g}d-s{args.seed}.db")
    if args.rebuild or not path.exists():
        build(path, args.engines, args.days, args.seed)
    with Store(f"sqlite:///{path}") as store:
        old = store.schema_version()
        if old != SCHEMA_VERSION:
            t0 = time.perf_counter()
            store.migrate()
            print(f"  migrated the store {old} -> {SCHEMA_VERSION} in "
                  f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)  # fmt: skip
    with sqlite3.connect(path) as con:
        total = int(con.execute("SELECT count(*) FROM windows").fetchone()[0])
        names = [r[0] for r in con.execute("SELECT source FROM engines ORDER BY source")]
    print(f"store {path}: {total:,} windows of {len(names)} engines")
    with ExitStack() as stack:
        pg_url: str | None = args.pg_url
        if pg_url is None and (args.postgres or args.skip_sqlite):
            from tests.services import postgres

            pg_url = stack.enter_context(postgres())
            copy_to_postgres(path, pg_url, args.pg_pack)
        whole_process(path, pg_url, args)
        if args.whole_only:
            return
        subset = names[: args.subset]
        if not args.skip_sqlite:
            bench(f"sqlite:///{path}", subset, total, args.forecast_seconds)
        if pg_url is not None:
            bench(pg_url, subset, total, args.forecast_seconds)


if __name__ == "__main__":
    main()
