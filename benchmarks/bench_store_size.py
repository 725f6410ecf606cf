"""The store's cost per window, this tree against ``--baseline`` (old) in the same run.

Workloads (seeded, built once by this tree, written in time order a minute of the cluster per
write_windows, as the collector writes them): ``plan``, the plan's signals (accuracy/fitsynth.py);
``full``, vLLM 0.33's full exposition per engine + an LMCache server per 5 engines
(tests/fixtures/metrics) scraped every 15 s through collector.rollup. Each tree and workload
runs in a fresh process on a fresh store, alternated ``--rounds`` times, best kept: CPU and wall
s per million windows of write_windows + pack_windows (if any). Bytes a window (data + indexes):
SQLite, dbstat after VACUUM (else page_count * page_size); PostgreSQL 15 (``--postgres``,
throwaway), pg_total_relation_size over every table and partition after VACUUM ANALYZE.
Targets: <= 40 B a window; write CPU within +-10 % of the old code's.

    .venv/bin/python benchmarks/bench_store_size.py [--engines 10 --days 1] [--postgres]
        [--baseline 0c77cf9 | --baseline WORKTREE | --baseline-path DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import math
import os
import pickle
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np
import psycopg

if TYPE_CHECKING:
    import numpy.typing as npt

    from core.records import SignalSample, Window

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "0c77cf9"  # the last schema-9 code before the store/ rewrite
WORKTREE = "WORKTREE"  # --baseline WORKTREE: the old side is this tree too (a smoke run)
MIXES = ("plan", "full")
EPOCH = 1_800_000_000.0  # fitsynth's first window; on the hour
WINDOW_S = 60.0
SCRAPE_S = 15.0  # the demo's scrape interval
CHUNK_SCRAPES = 240  # scrapes of a source drawn at once (an hour)
FIXTURES = ROOT / "tests" / "fixtures" / "metrics"
ENGINE_EXPOSITION = "vllm-0.33.0-metrics-full.txt"  # two engines' series: engine 0's kept
LMCACHE_EXPOSITION = "lmcache-0.5.6-legacy-metrics.txt"
LMCACHE_PER_ENGINES = 5
SIZE_TARGET_B = 40.0
COST_TOLERANCE = 0.10


# -- the workloads (this tree's code; a file of batches every tree's process reads) -----------


@dataclass(frozen=True)
class Workload:
    """A pickle stream of batches (lists of Window field tuples, ``fields`` order)."""

    mix: str
    path: Path
    fields: tuple[str, ...]
    windows: int
    batches: int
    seconds: float  # to build it


def build_workload(mix: str, engines: int, days: float, seed: int, out: Path) -> Workload:
    """The ``mix`` workload in ``out``: batches of one minute of the whole cluster."""
    from core.records import Window  # noqa: PLC0415 - baseline: this module also runs with a git revision's tree first on sys.path (bench --baseline); ours import there, after the path is set

    fields = tuple(f.name for f in dataclasses.fields(Window))
    t0 = time.perf_counter()
    windows = batches = 0
    batch_iter = _plan_batches(engines, days, seed) if mix == "plan" else _full_batches(
        engines, days, seed
    )  # fmt: skip
    with out.open("wb") as fh:
        for batch in batch_iter:
            rows = [tuple(getattr(w, f) for f in fields) for w in batch]
            pickle.dump(rows, fh, protocol=pickle.HIGHEST_PROTOCOL)
            windows += len(rows)
            batches += 1
    return Workload(mix, out, fields, windows, batches, time.perf_counter() - t0)


def read_batches(path: Path) -> Iterator[list[tuple[Any, ...]]]:
    with path.open("rb") as fh:
        while True:
            try:
                yield pickle.load(fh)
            except EOFError:
                return


def _plan_batches(engines: int, days: float, seed: int) -> Iterator[list[Window]]:
    """fitsynth's windows (the signals the plan reads), a minute of every engine a batch;
    counter windows with rate = delta / length, as the rollup writes them."""
    from benchmarks.accuracy.fitsynth import frame_to_windows, synthetic_frame  # noqa: PLC0415 - baseline: this module also runs with a git revision's tree first on sys.path (bench --baseline); ours import there, after the path is set

    frame = synthetic_frame(engines, max(1, round(days * 1440)), seed=seed)
    frame = frame.sort_values(["start", "source"], kind="stable", ignore_index=True)
    step = engines * 60  # an hour of the cluster converted at a time
    for i in range(0, len(frame), step):
        batch: list[Window] = []
        for w in frame_to_windows(frame.iloc[i : i + step]):
            if batch and batch[-1].start != w.start:
                yield batch
                batch = []
            if w.kind == "counter" and w.rate is None and w.delta is not None:
                batch.append(dataclasses.replace(w, rate=w.delta / w.length_s))
            else:
                batch.append(w)
        if batch:
            yield batch


@dataclass
class _Series:
    """One series of a simulated target: its template sample and how its value moves."""

    sample: SignalSample
    rate: float = 0.0  # counter increments / histogram observations per second at full load
    level: float = 1.0  # a gauge's value at full load
    fraction: bool = False  # a gauge in [0, 1]
    p: npt.NDArray[np.float64] | None = None  # a histogram's bucket probabilities
    typical: float = 1.0  # a histogram observation's typical value
    value: float = 0.0
    total: float = 0.0  # a histogram's sum
    cum: npt.NDArray[np.float64] | None = None  # a histogram's per-bucket counts so far


class _Target:
    """One scraped target (a vLLM engine or an LMCache server) with moving values."""

    def __init__(self, name: str, template: list[SignalSample], rng: np.random.Generator) -> None:
        self.name, self.rng = name, rng
        self.phase = rng.uniform(0, 2 * math.pi)
        self.ar = 0.0
        self.series: list[_Series] = []
        for s in template:
            x = _Series(s)
            if s.kind == "counter":
                x.rate = 10 ** rng.uniform(-1.5, 2.5)
                x.value = float(rng.integers(0, 10**6))
            elif s.kind == "gauge":
                x.fraction = "ratio" in s.signal
                x.level = 1.0 if x.fraction else 10 ** rng.uniform(0, 2 if "bytes" not in
                                                                  s.signal else 10)  # fmt: skip
            else:
                n = len(s.bounds)
                centre, width = rng.uniform(0.2, 0.8) * (n - 1), rng.uniform(0.7, 2.5)
                p = np.exp(-0.5 * ((np.arange(n) - centre) / width) ** 2) + 1e-4
                x.p = p / p.sum()
                finite = [b for b in s.bounds if math.isfinite(b)] or [1.0]
                x.typical = finite[min(round(centre), len(finite) - 1)]
                x.rate = 10 ** rng.uniform(-0.5, 1.5)
                x.cum = np.zeros(n)
            self.series.append(x)

    def chunk(self, stamps: list[float]) -> list[list[SignalSample]]:
        """The samples of each scrape at ``stamps``: load follows a day's cycle and an AR(1)."""
        from core.records import SignalSample  # noqa: PLC0415 - baseline: this module also runs with a git revision's tree first on sys.path (bench --baseline); ours import there, after the path is set

        rng, k = self.rng, len(stamps)
        ts = np.asarray(stamps)
        noise = np.empty(k)
        for i, e in enumerate(rng.normal(0.0, 0.05, k)):
            self.ar = 0.98 * self.ar + e
            noise[i] = self.ar
        load = np.clip(0.55 + 0.35 * np.sin(2 * np.pi * ts / 86_400 + self.phase) + noise,
                       0.02, 1.0)  # fmt: skip
        out: list[list[SignalSample]] = [[] for _ in range(k)]
        for x in self.series:
            s = x.sample
            if s.kind == "counter":
                vals = (x.value + np.cumsum(rng.poisson(x.rate * load * SCRAPE_S))).tolist()
                x.value = vals[-1]
                for i in range(k):
                    out[i].append(SignalSample(s.signal, "counter", s.labels, vals[i]))
            elif s.kind == "gauge":
                if x.fraction:
                    g = np.clip(load + rng.normal(0, 0.03, k), 0.0, 1.0)
                else:
                    g = rng.poisson(x.level * load).astype(float)
                for i, v in enumerate(g.tolist()):
                    out[i].append(SignalSample(s.signal, "gauge", s.labels, v))
            else:
                assert x.p is not None and x.cum is not None
                n = rng.poisson(x.rate * load * SCRAPE_S)
                per = x.cum + np.cumsum(rng.multinomial(n, x.p), axis=0)
                x.cum = per[-1]
                sums = x.total + np.cumsum(n * x.typical * rng.uniform(0.8, 1.2, k))
                x.total = float(sums[-1])
                cumulative = np.cumsum(per, axis=1).tolist()
                for i, (counts, total) in enumerate(zip(cumulative, sums.tolist(), strict=True)):
                    out[i].append(SignalSample(s.signal, "histogram", s.labels, counts[-1],
                                               s.bounds, tuple(counts), total))  # fmt: skip
        return out


def _template(name: str, keep: dict[str, str] | None = None) -> list[SignalSample]:
    """The canonical samples of a fixture exposition (only those whose labels include ``keep``)."""
    from collector.parse import read_exposition  # noqa: PLC0415 - baseline: this module also runs with a git revision's tree first on sys.path (bench --baseline); ours import there, after the path is set

    text = (FIXTURES / name).read_text()
    samples = read_exposition(text, name, 0.0).samples
    want = set((keep or {}).items())
    return [s for s in samples if want <= set(s.labels)]


def _full_batches(engines: int, days: float, seed: int) -> Iterator[list[Window]]:
    """Every window a tick of the collector closes across all targets, one batch a tick."""
    from collector.rollup import Rollup  # noqa: PLC0415 - baseline: this module also runs with a git revision's tree first on sys.path (bench --baseline); ours import there, after the path is set
    from core.records import Snapshot  # noqa: PLC0415 - baseline: this module also runs with a git revision's tree first on sys.path (bench --baseline); ours import there, after the path is set

    rng = np.random.default_rng(seed)
    engine = _template(ENGINE_EXPOSITION, {"engine": "0"})
    lmcache = _template(LMCACHE_EXPOSITION)
    targets = [_Target(f"vllm-{i:03d}", engine, rng) for i in range(engines)]
    n_lm = math.ceil(engines / LMCACHE_PER_ENGINES)
    targets += [_Target(f"lmcache-{i:02d}", lmcache, rng) for i in range(n_lm)]
    rollups = [Rollup(t.name, WINDOW_S) for t in targets]
    scrapes = max(1, round(days * 86_400 / SCRAPE_S))
    for lo in range(0, scrapes, CHUNK_SCRAPES):
        stamps = [EPOCH + SCRAPE_S * k for k in range(lo, min(lo + CHUNK_SCRAPES, scrapes))]
        drawn = [t.chunk(stamps) for t in targets]
        for k, ts in enumerate(stamps):
            batch: list[Window] = []
            for t, r, samples in zip(targets, rollups, drawn, strict=True):
                batch += r.add(Snapshot(t.name, ts, tuple(samples[k])))
            if batch:
                yield batch
    last = [w for r in rollups for w in r.flush()]
    if last:
        yield last


# -- one side's run: a fresh process with PYTHONPATH at the tree (stdlib and the tree only) ---


def _cpu_ticks(pid: int) -> tuple[int, int, int]:
    """(parent pid, own CPU ticks, reaped children's ticks) of a process, from /proc."""
    with open(f"/proc/{pid}/stat") as fh:
        f = fh.read().rsplit(")", 1)[1].split()
    return int(f[1]), int(f[11]) + int(f[12]), int(f[13]) + int(f[14])


def server_cpu(postmaster: int) -> float:
    """CPU seconds of a PostgreSQL so far: the postmaster, its reaped and living children."""
    _, own, reaped = _cpu_ticks(postmaster)
    ticks = own + reaped
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid, child, _ = _cpu_ticks(int(entry))
            except (OSError, IndexError):  # gone meanwhile
                continue
            if ppid == postmaster:
                ticks += child
    return ticks / os.sysconf("SC_CLK_TCK")


def _import_from(tree: str) -> tuple[Any, Any, str]:
    """(Window, Store, where Store was found) of the packages in ``tree``."""
    under = tree.rstrip(os.sep) + os.sep

    def ours(name: str) -> bool:
        try:
            spec = importlib.util.find_spec(name)
        except ModuleNotFoundError:
            return False
        return spec is not None and (spec.origin or "").startswith(under)

    records = "core.records" if ours("core.records") else "collector.records"
    store = "store.store" if ours("store.store") else "collector.store"
    window_cls = importlib.import_module(records).Window
    module = importlib.import_module(store)
    for m in (sys.modules[records], module):
        assert (m.__file__ or "").startswith(under), (m.__name__, m.__file__, tree)
    return window_cls, module.Store, f"{store}.Store"


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Write the workload into a fresh store with the tree's code; the timings as a dict."""
    tree = spec["tree"]
    window_cls, store_cls, where = _import_from(tree)
    names = tuple(f.name for f in dataclasses.fields(window_cls))
    fields = tuple(spec["fields"])
    if missing := set(fields) - set(names):
        raise SystemExit(f"{tree}: its Window has no field(s) {sorted(missing)}")
    positional = names[: len(fields)] == fields
    store = store_cls(spec["url"])
    store.migrate()
    postmaster = int(spec.get("postmaster") or 0)
    s0 = server_cpu(postmaster) if postmaster else 0.0
    cpu = wall = 0.0
    windows = 0
    for rows in read_batches(Path(spec["workload"])):
        if positional:
            batch = [window_cls(*r) for r in rows]
        else:
            batch = [window_cls(**dict(zip(fields, r, strict=True))) for r in rows]
        c0, t0 = time.process_time(), time.perf_counter()
        store.write_windows(batch)
        cpu += time.process_time() - c0
        wall += time.perf_counter() - t0
        windows += len(batch)
    pack_cpu = pack_wall = 0.0
    pack = getattr(store, "pack_windows", None) or getattr(store, "seal_hours", None)
    if pack is not None:  # the old code's packer; the new code's sealer (its writes seal)
        c0, t0 = time.process_time(), time.perf_counter()
        pack()
        pack_cpu, pack_wall = time.process_time() - c0, time.perf_counter() - t0
    server = server_cpu(postmaster) - s0 if postmaster else None
    if hasattr(store, "close"):
        store.close()
    return {"store": where, "windows": windows, "write_cpu": cpu, "write_wall": wall,
            "pack_cpu": pack_cpu, "pack_wall": pack_wall, "server_cpu": server}  # fmt: skip


# -- sizes (the parent, after the writing process ended) --------------------------------------


def sqlite_sizes(path: Path) -> dict[str, Any]:
    """Bytes of every table with its indexes after VACUUM (dbstat, else the pages in use:
    page_count * page_size, no per-table split), and the file as written (all its pages)."""
    con = sqlite3.connect(path, isolation_level=None)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        written = _pragma(con, "page_count") * _pragma(con, "page_size")
        try:
            con.execute("SELECT count(*) FROM dbstat").fetchone()
            method = "dbstat after VACUUM"
        except sqlite3.OperationalError:
            method = "page_count * page_size after VACUUM"
        con.execute("VACUUM")
        tables: dict[str, int] = {}
        if method.startswith("dbstat"):
            sql = ("SELECT coalesce(m.tbl_name, s.name), sum(s.pgsize) FROM dbstat s "
                   "LEFT JOIN sqlite_schema m ON m.name = s.name GROUP BY 1")  # fmt: skip
            tables = {str(name): int(size) for name, size in con.execute(sql)}
            total = sum(tables.values())
        else:
            total = _pragma(con, "page_count") * _pragma(con, "page_size")
    finally:
        con.close()
    return {"method": method, "total": total, "tables": tables, "file_as_written": written}


def _pragma(con: sqlite3.Connection, name: str) -> int:
    row = con.execute(f"PRAGMA {name}").fetchone()
    return int(row[0])


PG_SIZES = """
SELECT CASE WHEN n.nspname = 'public' THEN c.relname ELSE n.nspname || '.' || c.relname END,
       CASE WHEN c.relkind = 'p' THEN (SELECT coalesce(sum(pg_total_relation_size(t.relid)), 0)
                                         FROM pg_partition_tree(c.oid) t WHERE t.isleaf)
            ELSE pg_total_relation_size(c.oid) END
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind IN ('r', 'p', 'm') AND NOT c.relispartition
   AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'
"""


def pg_sizes(dsn: str) -> dict[str, Any]:
    """pg_total_relation_size (heap, TOAST, indexes, FSM/VM) of every table of the database,
    a partitioned one summed over its leaf partitions, after VACUUM ANALYZE."""
    with psycopg.connect(dsn, autocommit=True) as pg:
        pg.execute("VACUUM ANALYZE")
        tables = {str(name): int(size) for name, size in pg.execute(PG_SIZES).fetchall()}
    method = "pg_total_relation_size over pg_partition_tree after VACUUM ANALYZE"
    return {"method": method, "total": sum(tables.values()), "tables": tables}


# -- the parent: rounds, alternated sides, the report ---------------------------------------


@dataclass
class Side:
    """One side (old or new) of one backend and workload: its runs and its store's size."""

    runs: list[dict[str, Any]] = field(default_factory=list)
    size: dict[str, Any] = field(default_factory=dict)
    store: str = ""

    def best(self, key: str) -> float:
        return min(float(r[key]) for r in self.runs)

    def cost(self, windows: int) -> dict[str, float | None]:
        """Seconds per million windows, each the best of the rounds."""
        per = 1e6 / windows
        total = min(r["write_cpu"] + r["pack_cpu"] for r in self.runs)
        out: dict[str, float | None] = {
            "write_cpu": self.best("write_cpu") * per,
            "write_wall": self.best("write_wall") * per,
            "pack_cpu": self.best("pack_cpu") * per,
            "write_pack_cpu": total * per,
            "write_pack_wall": min(r["write_wall"] + r["pack_wall"] for r in self.runs) * per,
        }
        servers = [r["write_cpu"] + r["pack_cpu"] + r["server_cpu"] for r in self.runs
                   if r["server_cpu"] is not None]  # fmt: skip
        out["with_server_cpu"] = min(servers) * per if servers else None
        return out


def run_side(tree: Path, url: str, work: Workload, postmaster: int, label: str) -> dict[str, Any]:
    spec = {"tree": str(tree), "url": url, "workload": str(work.path), "fields": work.fields,
            "postmaster": postmaster}  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = "1"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bench_store_size: {label} failed:\n{proc.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    if out["windows"] != work.windows:
        raise SystemExit(f"bench_store_size: {label} wrote {out['windows']} of {work.windows}")
    return out


def bench_backend(
    backend: str, trees: dict[str, Path], works: list[Workload], rounds: int, tmp: Path
) -> dict[str, dict[str, Side]]:
    """Every workload on ``backend`` with each tree, alternated ``rounds`` times."""
    with ExitStack() as stack:
        server, postmaster = "", 0
        if backend == "postgresql":
            from tests import services  # noqa: PLC0415 - baseline: this module also runs with a git revision's tree first on sys.path (bench --baseline); ours import there, after the path is set

            server = stack.enter_context(services.postgres())
            postmaster = _postmaster(server)
        sides = {w.mix: {name: Side() for name in trees} for w in works}
        n = 0
        for i in range(rounds):
            for work in works:
                for name in list(trees) if i % 2 == 0 else list(reversed(trees)):
                    n += 1
                    label = f"{backend} {work.mix} {name} round {i + 1}"
                    load = os.getloadavg()[0]
                    if backend == "sqlite":
                        path = tmp / f"store-{n}.db"
                        run = run_side(trees[name], f"sqlite:///{path}", work, 0, label)
                        size = sqlite_sizes(path)
                        for p in tmp.glob(f"store-{n}.db*"):
                            p.unlink()
                    else:
                        url, dsn = _pg_database(server, f"kvsize_{n}")
                        run = run_side(trees[name], url, work, postmaster, label)
                        size = pg_sizes(dsn)
                        _pg_drop(server, f"kvsize_{n}")
                    side = sides[work.mix][name]
                    side.runs.append(run)
                    side.size, side.store = size, run["store"]
                    print(f"  {label:<32s} {_run_line(run, size, work.windows)} (load {load:.2f})",
                          flush=True)  # fmt: skip
        return sides


def _run_line(run: dict[str, Any], size: dict[str, Any], windows: int) -> str:
    per = 1e6 / windows
    server = "" if run["server_cpu"] is None else f" + server {run['server_cpu'] * per:.1f}"
    return (f"write {run['write_cpu'] * per:6.1f} s cpu {run['write_wall'] * per:6.1f} s wall, "
            f"pack {run['pack_cpu'] * per:5.1f} s cpu{server} a M windows; "
            f"{size['total'] / windows:6.1f} B a window ({run['store']})")  # fmt: skip


def _postmaster(url: str) -> int:
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as pg:
        row = pg.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return _cpu_ticks(int(row[0]))[0]


def _pg_database(server: str, name: str) -> tuple[str, str]:
    """A new empty database on the server: (its SQLAlchemy URL, its libpq DSN)."""
    admin = server.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin, autocommit=True) as pg:
        pg.execute(f"CREATE DATABASE {name} TEMPLATE template0")  # no one is connected to it
    url = server.rsplit("/", 1)[0] + f"/{name}"
    return url, url.replace("postgresql+psycopg://", "postgresql://")


def _pg_drop(server: str, name: str) -> None:
    with psycopg.connect(server.replace("postgresql+psycopg://", "postgresql://"),
                         autocommit=True) as pg:  # fmt: skip
        pg.execute(f"DROP DATABASE {name} WITH (FORCE)")


def report(
    backend: str, works: list[Workload], sides: dict[str, dict[str, Side]], out: IO[str]
) -> dict[str, Any]:
    """The backend's table (old, new, new/old, targets) printed; its figures as a dict."""
    figures: dict[str, Any] = {}
    print(f"\n{backend}: bytes a window (data + indexes), seconds a million windows (best of "
          f"{len(next(iter(next(iter(sides.values())).values())).runs)})", file=out)  # fmt: skip
    head = f"  {'workload':<6s} {'figure':<36s} {'old':>10s} {'new':>10s} {'new/old':>8s}  target"
    print(head, file=out)
    for work in works:
        old, new = sides[work.mix]["old"], sides[work.mix]["new"]
        n = work.windows
        rows: list[tuple[str, float | None, float | None, str]] = []
        small: list[str] = []  # under 1 % of both sides' totals: one row
        for table in sorted(set(old.size["tables"]) | set(new.size["tables"])):
            a, b = old.size["tables"].get(table), new.size["tables"].get(table)
            if (a or 0) < old.size["total"] / 100 and (b or 0) < new.size["total"] / 100:
                small.append(table)
                continue
            rows.append((f"B/window: {table}", _per(a, n), _per(b, n), ""))
        if small:
            a = sum(old.size["tables"].get(t, 0) for t in small)
            b = sum(new.size["tables"].get(t, 0) for t in small)
            rows.append((f"B/window: {len(small)} other tables", a / n, b / n, ""))
        size_new = new.size["total"] / n
        ok = "met" if size_new <= SIZE_TARGET_B else "NOT met"
        rows.append(("B/window: TOTAL", old.size["total"] / n, size_new,
                     f"<= {SIZE_TARGET_B:g} B: {ok}"))  # fmt: skip
        if "file_as_written" in old.size:
            rows.append(("B/window: file as written", old.size["file_as_written"] / n,
                         new.size["file_as_written"] / n, ""))  # fmt: skip
        c_old, c_new = old.cost(n), new.cost(n)
        labels = {"write_cpu": "s/M: write_windows cpu", "write_wall": "s/M: write_windows wall",
                  "pack_cpu": "s/M: pack_windows cpu", "write_pack_cpu": "s/M: write + pack cpu",
                  "write_pack_wall": "s/M: write + pack wall",
                  "with_server_cpu": "s/M: write + pack + server cpu"}  # fmt: skip
        ratio = (c_new["write_pack_cpu"] or 0.0) / (c_old["write_pack_cpu"] or math.nan)
        cost_ok = _cost_verdict(ratio)
        for key, label in labels.items():
            if c_old[key] is None and c_new[key] is None:
                continue
            target = f"within ±{COST_TOLERANCE:.0%}: {cost_ok}" if key == "write_pack_cpu" else ""
            rows.append((label, c_old[key], c_new[key], target))
        for label, a, b, target in rows:
            r = f"{b / a:8.2f}" if a and b is not None else f"{'—':>8s}"
            print(f"  {work.mix:<6s} {label:<36s} {_fmt(a)} {_fmt(b)} {r}  {target}", file=out)
        print(f"  {work.mix:<6s} {n:,} windows; old {old.store}, new {new.store}; sizes by "
              f"{new.size['method']}", file=out)  # fmt: skip
        figures[work.mix] = {
            "windows": n,
            "old": {"store": old.store, "size": old.size, "cost_s_per_million": c_old,
                    "runs": old.runs},
            "new": {"store": new.store, "size": new.size, "cost_s_per_million": c_new,
                    "runs": new.runs},
            "ratio": {"bytes_per_window": size_new / (old.size["total"] / n),
                      "write_pack_cpu": ratio},
            "targets": {"bytes_per_window_le_40": size_new <= SIZE_TARGET_B,
                        "write_cost_within_10pct": abs(ratio - 1) <= COST_TOLERANCE},
        }  # fmt: skip
    return figures


def _cost_verdict(ratio: float) -> str:
    if abs(ratio - 1) <= COST_TOLERANCE:
        return "met"
    return f"NOT met ({'slower' if ratio > 1 else 'faster'})"


def _per(size: int | None, n: int) -> float | None:
    return None if size is None else size / n


def _fmt(x: float | None) -> str:
    return f"{'—':>10s}" if x is None else f"{x:10.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--baseline", default=BASELINE, metavar="REV",
                    help=f"the old code's git revision (default {BASELINE}); "
                    f"{WORKTREE}: this tree")  # fmt: skip
    ap.add_argument("--baseline-path", type=Path, help="the old code's packages in a directory")
    ap.add_argument("--engines", type=int, default=10)
    ap.add_argument("--days", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mix", choices=MIXES, nargs="+", default=list(MIXES))
    ap.add_argument("--rounds", type=int, default=2, help="alternated runs (best kept)")
    ap.add_argument("--postgres", action="store_true", help="PostgreSQL 15 too")
    ap.add_argument("--no-sqlite", action="store_true", help="PostgreSQL only")
    ap.add_argument("--json", type=Path, help="write the figures to this file")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    backends = ([] if args.no_sqlite else ["sqlite"]) + (["postgresql"] if args.postgres else [])
    if not backends:
        raise SystemExit("bench_store_size: no backend (--no-sqlite without --postgres)")
    with ExitStack() as stack:
        if args.baseline_path is not None:
            old, old_name = args.baseline_path.resolve(), str(args.baseline_path)
        elif args.baseline == WORKTREE:
            old, old_name = ROOT, "the working tree"
        else:
            from benchmarks import plan_whole  # noqa: PLC0415 - baseline: this module also runs with a git revision's tree first on sys.path (bench --baseline); ours import there, after the path is set

            old = stack.enter_context(plan_whole.revision_tree(args.baseline))
            old_name = args.baseline
        trees = {"old": old, "new": ROOT}
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvscope-size-")))
        works = []
        for mix in args.mix:
            w = build_workload(mix, args.engines, args.days, args.seed, tmp / f"{mix}.pkl")
            print(f"workload {mix}: {w.windows:,} windows in {w.batches:,} batches "
                  f"({args.engines} engines x {args.days:g} d; built in {w.seconds:.0f} s)",
                  flush=True)  # fmt: skip
            works.append(w)
        print(f"old: {old_name} ({old}); new: the working tree ({ROOT})", flush=True)
        figures: dict[str, Any] = {
            "baseline": old_name, "engines": args.engines, "days": args.days,
            "seed": args.seed, "rounds": args.rounds, "backends": {},
        }  # fmt: skip
        results = {b: bench_backend(b, trees, works, args.rounds, tmp) for b in backends}
    for backend, sides in results.items():
        figures["backends"][backend] = report(backend, works, sides, sys.stdout)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
        print(f"\nfigures written to {args.json}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
            del sys.path[0]  # benchmarks/: the tree under test (PYTHONPATH) is the only code
        print(json.dumps(child(json.loads(sys.argv[2]))))
    else:
        main()
