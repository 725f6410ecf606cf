"""A SQLite store of ``copies`` × the engines of a built one, for plans at scale.

Each copy's engines are the original ones under new source names (``<source>-c<k>``): their
series, head rows, chunks and 5-minute chunks are copied row by row in SQL (series ids
offset by ``k`` × the largest id), and their engine records likewise. The copies carry the
same windows as their originals, so a plan on the result is a test of time and memory at
scale, not of accuracy. (benchmarks/bench_plan.py ``--copies``.)

    .venv/bin/python benchmarks/replicate_store.py SRC.db DST.db --copies 10
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import time
from pathlib import Path

_DATA = {  # table -> its columns after series_id
    "head": "start, length_s, samples, delta, rate, resets, mean, min, max, last, p50, p90, "
    "p99, sum_delta, buckets",
    "chunks": "hour, n, data",
    "chunks_5m": "day, n, data",
}
_ENGINE = "cluster_id, model, gpu, hbm_gb, tensor_parallel, offload, facts, updated"


def replicate(src: Path, dst: Path, copies: int) -> int:
    """Write ``dst``: ``src`` with every engine ``copies`` times in all; the number of
    engines in ``dst``."""
    if copies < 1:
        raise ValueError(f"copies must be >= 1, got {copies}")
    tmp = dst.with_name(dst.name + ".building")
    tmp.unlink(missing_ok=True)
    shutil.copyfile(src, tmp)
    with sqlite3.connect(tmp) as con:
        con.execute("PRAGMA journal_mode=OFF")
        con.execute("PRAGMA synchronous=OFF")
        top = int(con.execute("SELECT coalesce(max(id), 0) FROM series").fetchone()[0])
        last_engine = int(con.execute("SELECT coalesce(max(id), 0) FROM engines").fetchone()[0])
        for k in range(1, copies):
            off, tag = k * top, f"-c{k}"
            con.execute(
                "INSERT INTO series (id, source, key, signal, labels, kind) "
                "SELECT id + ?, source || ?, key, signal, labels, kind FROM series WHERE id <= ?",
                (off, tag, top),
            )
            for table, cols in _DATA.items():
                con.execute(
                    f"INSERT INTO {table} (series_id, {cols}) "
                    f"SELECT series_id + ?, {cols} FROM {table} WHERE series_id <= ?",
                    (off, top),
                )
            con.execute(
                f"INSERT INTO engines (source, {_ENGINE}) SELECT source || ?, {_ENGINE} "
                "FROM engines WHERE id <= ?",
                (tag, last_engine),
            )
            con.commit()
        engines = int(con.execute("SELECT count(*) FROM engines").fetchone()[0])
    tmp.rename(dst)
    return engines


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--copies", type=int, default=10)
    args = ap.parse_args()
    t0 = time.perf_counter()
    n = replicate(args.src, args.dst, args.copies)
    print(f"{args.dst}: {n:,} engines in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
