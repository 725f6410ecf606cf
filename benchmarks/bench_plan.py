"""`kvscope plan` on 100 engines × 7 days of 1-minute windows: this tree against a baseline.

The store: a seeded synthetic cluster (benchmarks.accuracy.fitsynth: 100 engines,
none/native/lmcache in turn, ~13.8 M windows of every signal the plan reads, written in
time order with Store.write_windows as the collector would), built once by the baseline
revision's code (``--baseline``, default :data:`BASELINE`, the last code before the store
kept each window once) and cached under /tmp, then copied and migrated by this tree (the
migration's time printed). In the same run:

* whole process, ``kvscope plan --since all --json`` (benchmarks/plan_whole.py): this tree on
  the migrated copy and the baseline on its own store (on the migrated copy too when its
  schema is this tree's, e.g. ``--baseline HEAD~1``), alternated ``--rounds`` times; wall,
  CPU and peak RSS of each run, the ratios, and whether the plans' JSON are the same (but
  for their own timings and store URL); with ``--postgres`` the same on PostgreSQL 15, each
  store copied into its own database (the baseline's by the baseline's own code);
* with ``--copies N``: instead, this tree alone on N copies of the store's engines
  (benchmarks/replicate_store.py), its wall, CPU and process-tree Pss against
  ``--memory-target`` (8 GB: 1,000 engines × 7 days);
* unless ``--whole-only``: this tree's read_frame of the plan's columns and build_plan's
  stages in this process.

BLAS threads are pinned to one before numpy loads (the whole processes inherit it).

    .venv/bin/python benchmarks/bench_plan.py [--engines 100] [--days 7] [--rebuild]
    .venv/bin/python benchmarks/bench_plan.py --whole-only --postgres --rounds 3
    .venv/bin/python benchmarks/bench_plan.py --whole-only --postgres --baseline db0f9df
    .venv/bin/python benchmarks/bench_plan.py --copies 10   # 1,000 engines, this tree only
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import sqlite3  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from contextlib import ExitStack  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, TypeVar  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import sqlalchemy  # noqa: E402

from benchmarks import gitrev, plan_whole, replicate_store  # noqa: E402
from benchmarks.accuracy.fitsynth import frame_to_windows, synthetic_frame  # noqa: E402
from planner.frames.table import PLAN_COLUMNS  # noqa: E402
from planner.plan.build import build_plan  # noqa: E402
from planner.plan.needed import NEEDED_SIGNALS  # noqa: E402
from store.store import Store  # noqa: E402
from store.tables import SCHEMA_VERSION  # noqa: E402
from tests.planner.synthstore import BLOCK_SIZE, BLOCKS, GPU, MODEL, TP, with_rates  # noqa: E402

CLUSTER = "bench"
BASELINE = "0c77cf9"  # schema 9: windows as rows plus a packed copy of every closed hour
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


def bench(url: str, forecast_seconds: float) -> None:
    """This tree's read of the plan's columns and build_plan's stages, in this process."""
    with Store(url) as store:
        wall, cpu, table = timed(
            lambda: store.read_frame(signals=sorted(NEEDED_SIGNALS), columns=PLAN_COLUMNS)
        )
        line("read_frame (whole store, plan columns)", wall, cpu,
             f"{len(table):,} rows, {len(table) / wall:,.0f} rows/s")  # fmt: skip
        del table
        wall, cpu, plan = timed(lambda: build_plan(store, forecast_seconds=forecast_seconds))
        line("build_plan (whole store)", wall, cpu, f"{plan.window['windows']:,} windows")
        for stage, seconds in dict(plan.details.seconds).items():
            print(f"  {stage:<44s} {seconds:8.2f} s wall")


def in_tree(tree: Path, code: str) -> None:
    """Run ``code`` with the packages of ``tree`` (a baseline revision) imported."""
    boot = f"import sys; sys.path.insert(0, {str(tree)!r}); "
    subprocess.run([sys.executable, "-c", boot + code], check=True, cwd=tree)


def migrated_copy(old: Path) -> Path:
    """A copy of the baseline's store migrated by this tree (cached beside it)."""
    new = old.with_name(old.stem + f"-schema{SCHEMA_VERSION}.db")
    if new.exists():
        return new
    tmp = new.with_name(new.name + ".building")
    with sqlite3.connect(old) as src, sqlite3.connect(tmp) as dst:
        src.backup(dst)
    t0 = time.perf_counter()
    with Store(f"sqlite:///{tmp}") as store:
        store.migrate()
    with sqlite3.connect(tmp) as con:
        con.execute("VACUUM")
    tmp.rename(new)
    print(f"  migrated a copy to schema {SCHEMA_VERSION} in {time.perf_counter() - t0:.0f} s",
          file=sys.stderr)  # fmt: skip
    return new


def same_schema(tree: Path) -> bool:
    """Whether the baseline's store code is this tree's schema (it then reads the same
    migrated copy as this tree, and the same PostgreSQL copy)."""
    tables = tree / "store" / "tables.py"
    pattern = rf"^SCHEMA_VERSION(: int)? = {SCHEMA_VERSION}\b"
    return tables.exists() and re.search(pattern, tables.read_text(), re.M) is not None


def whole_process(
    old: Path, new: Path, pg: tuple[str, str] | None, tree: Path, args: argparse.Namespace
) -> None:
    """The whole-process variants of the module docstring, alternated ``--rounds`` times."""
    variants = []
    if not args.skip_sqlite:
        lite, base = f"sqlite:///{new}", f"sqlite:///{new if same_schema(tree) else old}"
        variants.append(plan_whole.Variant("sqlite, this tree", plan_whole.cli(lite), lite))
        variants.append(plan_whole.Variant(f"sqlite, {args.baseline}",
                                           plan_whole.tree_cli(tree, base), base))  # fmt: skip
    if pg is not None:
        new_url, old_url = pg
        cpu = plan_whole.postgres_cpu(new_url)
        variants.append(plan_whole.Variant("postgresql, this tree", plan_whole.cli(new_url),
                                           new_url, cpu))  # fmt: skip
        old_cmd = plan_whole.tree_cli(tree, old_url)
        variants.append(plan_whole.Variant(f"postgresql, {args.baseline}", old_cmd, old_url, cpu))
    runs = plan_whole.run_rounds(variants, args.rounds)
    plan_whole.summary(variants, runs)


def copy_to_postgres(sqlite_path: Path, url: str) -> None:
    """This tree's SQLite store into a migrated PostgreSQL: the inventory through the
    Store, series, head and chunks by COPY (the chunks' day partitions made first)."""
    from store import partitions  # noqa: PLC0415 - baseline: this module also runs with a git revision's tree first on sys.path (bench --baseline); ours import there, after the path is set

    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    with Store(url) as store:
        store.migrate()
        with Store(f"sqlite:///{sqlite_path}") as src:
            for e in src.engines():
                store.upsert_engine(e.cluster, e.source, model=e.model, gpu=e.gpu,
                                    tensor_parallel=e.tensor_parallel, offload=e.offload,
                                    facts=dict(e.facts))  # fmt: skip
    t0 = time.perf_counter()
    with sqlite3.connect(sqlite_path) as lite:
        hours = [h for (h,) in lite.execute("SELECT DISTINCT hour FROM chunks")]
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as conn:
        partitions.make_days(conn, {partitions.day_of(h) for h in hours})
    engine.dispose()
    tables = {"series": "id, source, key, signal, labels, kind",
              "head": "series_id, start, length_s, samples, delta, rate, resets, mean, min, "
                      "max, last, p50, p90, p99, sum_delta, buckets",
              "chunks": "series_id, hour, n, data"}  # fmt: skip
    with sqlite3.connect(sqlite_path) as lite, psycopg.connect(dsn) as pg, pg.cursor() as cur:
        for table, cols in tables.items():
            with cur.copy(f"COPY {table} ({cols}) FROM STDIN") as copy:
                for row in _rows(lite, f"SELECT {cols} FROM {table}"):
                    copy.write_row(row)
        cur.execute("SELECT setval(pg_get_serial_sequence('series', 'id'), max(id)) FROM series")
    with psycopg.connect(dsn, autocommit=True) as pg:
        for table in tables:
            pg.execute(f"VACUUM ANALYZE {table}")
    print(f"  copied into PostgreSQL in {time.perf_counter() - t0:.0f} s", file=sys.stderr)


def _rows(con: sqlite3.Connection, sql: str) -> Iterator[Any]:
    cursor = con.execute(sql)
    while rows := cursor.fetchmany(50_000):
        yield from rows


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--engines", type=int, default=100)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--db", type=Path, help="the baseline's store (default: cached in /tmp)")
    ap.add_argument("--rebuild", action="store_true", help="rebuild the cached store")
    ap.add_argument("--postgres", action="store_true", help="also time PostgreSQL copies")
    ap.add_argument("--skip-sqlite", action="store_true", help="time PostgreSQL only")
    ap.add_argument("--forecast-seconds", type=float, default=8.0)
    ap.add_argument("--whole-only", action="store_true", help="only the whole-process timing")
    ap.add_argument("--rounds", type=int, default=1, help="whole-process rounds (alternated)")
    ap.add_argument(
        "--copies",
        type=int,
        default=1,
        help="plan on this many copies of the engines (this tree only)",
    )
    ap.add_argument(
        "--memory-target",
        type=float,
        default=8192.0,
        help="MB of process-tree Pss the --copies plan should stay within",
    )
    ap.add_argument(
        "--baseline",
        metavar="REV",
        default=BASELINE,
        help=f"the revision compared with (default {BASELINE})",
    )
    args = ap.parse_args()
    path = args.db or Path(f"/tmp/kvscope-bench-plan-{args.engines}x{args.days:g}d-s{args.seed}.db")
    with ExitStack() as stack:
        tree = stack.enter_context(
            gitrev.revision_tree(args.baseline, (*plan_whole.PACKAGES, "benchmarks", "tests"),
                                 who="bench_plan")
        )  # fmt: skip
        if args.rebuild or not path.exists():
            build_args = f"Path({str(path)!r}), {args.engines}, {args.days}, {args.seed}"
            in_tree(tree, "from pathlib import Path; from benchmarks.bench_plan import build; "
                          f"build({build_args})")  # fmt: skip
        new = migrated_copy(path)
        with sqlite3.connect(new) as con:
            total = int(con.execute("SELECT sum(n) FROM chunks").fetchone()[0] or 0)
            total += int(con.execute("SELECT count(*) FROM head").fetchone()[0])
            names = [r[0] for r in con.execute("SELECT source FROM engines ORDER BY source")]
        print(f"store {path}: {total:,} windows of {len(names)} engines")
        if args.copies > 1:
            scaled(new, args)
            return
        pg: tuple[str, str] | None = None
        if args.postgres or args.skip_sqlite:
            from tests.services import postgres  # noqa: PLC0415 - baseline: this module also runs with a git revision's tree first on sys.path (bench --baseline); ours import there, after the path is set

            server = stack.enter_context(postgres())
            new_url, old_url = _databases(server)
            copy_to_postgres(new, new_url)
            if same_schema(tree):
                copy_to_postgres(new, old_url)
            else:
                in_tree(tree, "from pathlib import Path; from benchmarks.bench_plan import "
                              f"copy_to_postgres; copy_to_postgres(Path({str(path)!r}), "
                              f"{old_url!r}, 'windows')")  # fmt: skip
            pg = (new_url, old_url)
        whole_process(path, new, pg, tree, args)
        if args.whole_only:
            return
        if not args.skip_sqlite:
            bench(f"sqlite:///{new}", args.forecast_seconds)
        if pg is not None:
            bench(pg[0], args.forecast_seconds)


def scaled(new: Path, args: argparse.Namespace) -> None:
    """This tree's whole plan on ``--copies`` × the engines (benchmarks/replicate_store.py;
    no baseline: the store before kept a plan's frame and windows ~3× larger), against
    ``--memory-target`` MB of process-tree Pss."""
    big = new.with_name(new.stem + f"-x{args.copies}.db")
    if not big.exists():
        t0 = time.perf_counter()
        engines = replicate_store.replicate(new, big, args.copies)
        print(f"  {engines:,} engines copied into {big} in {time.perf_counter() - t0:.0f} s")
    url = f"sqlite:///{big}"
    variants = [plan_whole.Variant(f"sqlite, this tree, x{args.copies}", plan_whole.cli(url), url)]
    runs = plan_whole.run_rounds(variants, args.rounds)
    plan_whole.summary(variants, runs, wall_target=math.inf, memory_target_mb=args.memory_target)


def _databases(server: str) -> tuple[str, str]:
    """Two fresh databases on the throwaway server: this tree's and the baseline's."""
    admin = server.replace("postgresql+psycopg://", "postgresql://")
    urls = []
    with psycopg.connect(admin, autocommit=True) as pg:
        for name in ("kvscope_bench_new", "kvscope_bench_old"):
            pg.execute(f"DROP DATABASE IF EXISTS {name}")
            pg.execute(f"CREATE DATABASE {name}")
            urls.append(server.rsplit("/", 1)[0] + "/" + name)
    return urls[0], urls[1]


if __name__ == "__main__":
    main()
