"""The migration to schema 10 on real stores built by the code of schema 7 and of schema 9
(their revisions taken from git), SQLite and PostgreSQL: every window the old code reads
back, the new code reads back the same, and a write after the migration lands in place."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.gitrev import revision_tree
from core.records import Window
from store.store import Store
from store.tables import SCHEMA_VERSION

# the last revision of each schema before the store kept windows once
REVISIONS = {7: "4b1e81a~1", 9: "0c77cf9"}
T0 = 1_764_000_000.0  # 2025-11-24T16:00:00Z, an hour's start

# Run by the old code: write windows (three sources, four kinds, NaN and NULL values, four
# hours, a late re-write, bucket counts where the schema has them), pack what it packs, and
# print what read_windows gives back.
WRITER = """
import json, math, sys
from collector.records import Window
from collector.store import Store
T0 = %r
buckets = "bucket_counts" in Window.__slots__
out = []
for s in range(3):
    for m in range(0, 4 * 60, 7):
        t = T0 + 60.0 * m
        x = (s * 31 + m) %% 17 / 17
        out.append(Window(f"e{s}", "kv_cache_usage_ratio", (("engine", str(s)),), t, 60.0,
                          "gauge", 4, mean=x, min=x / 2, max=x, last=x))
        out.append(Window(f"e{s}", "preemptions_total", (("engine", str(s)),), t, 60.0,
                          "counter", 4, delta=float(m %% 5), rate=m %% 5 / 60, resets=m %% 2,
                          last=float(m)))
        out.append(Window(f"e{s}", "ttft_seconds", (("engine", str(s)), ("model_name", "m")),
                          t, 60.0, "histogram", 4, delta=3.0, rate=0.05, mean=x,
                          p50=x if m %% 3 else math.nan, p90=x * 2, p99=None,
                          sum_delta=x * 3))
        if buckets and s == 0:
            out.append(Window("e0", "kv_block_lifetime_seconds", (), t, 60.0, "histogram", 4,
                              delta=6.0, bucket_bounds=(1.0, 10.0),
                              bucket_counts=(1.0, 2.0, 3.0)))
with Store(sys.argv[1]) as store:
    store.migrate()
    store.write_windows(out)
    store.write_windows([Window("e1", "kv_cache_usage_ratio", (("engine", "1"),), T0 + 7 * 60,
                                60.0, "gauge", 9, mean=0.25)])  # a late re-write
    if hasattr(store, "pack_windows"):
        store.pack_windows()
    read = store.read_windows()
print(json.dumps([[getattr(w, k) for k in Window.__slots__] for w in read]))
"""


@pytest.fixture(scope="module", params=sorted(REVISIONS))
def old_tree(request: pytest.FixtureRequest) -> Iterator[tuple[int, Path]]:
    with revision_tree(REVISIONS[request.param], ("collector",), who="test") as tree:
        yield request.param, tree


def _old_store(tree: Path, url: str) -> list[list[Any]]:
    done = subprocess.run(
        [sys.executable, "-c", WRITER % T0, url],
        cwd=tree, capture_output=True, text=True, check=False, timeout=300,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows: list[list[Any]] = json.loads(done.stdout)
    return rows


def _same(old: list[Any], new: Window) -> bool:
    fields = [getattr(new, k) for k in Window.__slots__][: len(old)]
    for raw, b in zip(old, fields, strict=True):
        a = (
            tuple(tuple(x) if isinstance(x, list) else x for x in raw)
            if isinstance(b, tuple)
            else raw
        )
        if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
            continue
        if a != b:
            return False
    return True


def test_migration_keeps_every_window_of_an_old_store(
    old_tree: tuple[int, Path], db_url: str
) -> None:
    schema, tree = old_tree
    old = _old_store(tree, db_url)
    assert len(old) > 300
    with Store(db_url) as s:
        assert s.schema_version() == schema
        assert s.migrate() == SCHEMA_VERSION
        new = s.read_windows()
        assert len(new) == len(old)
        bad = [(o, n) for o, n in zip(old, new, strict=True) if not _same(o, n)]
        assert bad == []
        stats = s.stats()
        assert stats["windows"] == len(old)
        assert stats["rows"]["head"] < len(old) / 3  # the older hours are chunks
        # a write after the migration: into a chunk (a closed hour) and into the head
        s.write_windows([Window("e2", "kv_cache_usage_ratio", (("engine", "2"),), T0, 60.0,
                                "gauge", 9, mean=0.5),
                         Window("e2", "kv_cache_usage_ratio", (("engine", "2"),),
                                T0 + 4 * 3600.0, 60.0, "gauge", 9, mean=0.75)])  # fmt: skip
        got = s.read_windows(signals=["kv_cache_usage_ratio"], sources=["e2"])
        assert (got[0].start, got[0].mean, got[-1].mean) == (T0, 0.5, 0.75)
        assert len(got) == sum(1 for o in old if o[:2] == ["e2", "kv_cache_usage_ratio"]) + 1
        assert s.migrate() == SCHEMA_VERSION  # idempotent
