"""Sealing the head into chunks (store/sealing.py, chunks.encode_many): every chunk a seal
writes is byte for byte chunks.encode of its windows' rows, on both backends, with NaN and
NULL values, bucket BLOBs, several layouts and a chunk another writer made meanwhile."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

import pytest
from sqlalchemy import select

from core.records import Labels, Window
from store import chunks
from store.buckets import encode_buckets
from store.store import Store
from store.tables import ChunkRow
from store.writes import merge

ENGINE: Labels = (("engine", "0"),)
GAP = "kv_block_reuse_gap_seconds"  # a keep_buckets histogram
HOUR = 3_600.0
T0 = 1_800_000_000.0  # on the hour


def _windows(source: str, start: float, rng: random.Random) -> list[Window]:
    """One minute of a source: a gauge with NaN and None, a counter, a bucket histogram."""
    nan_or_none = rng.choice([math.nan, None, rng.random()])
    counts = (float(rng.randint(0, 300)), 0.0, rng.choice([1.0, 70_000.0, 0.5]))
    return [
        Window(source, "kv_cache_usage_ratio", ENGINE, start, 60.0, "gauge", 4,
               mean=rng.random(), min=nan_or_none, max=1.0, last=rng.random()),
        Window(source, "prompt_tokens_total", ENGINE, start, 60.0, "counter", 4,
               delta=float(rng.randint(0, 9)), rate=rng.random(), resets=rng.randint(0, 1)),
        Window(source, GAP, ENGINE, start, 60.0, "histogram", 4, delta=sum(counts),
               sum_delta=rng.random(), p50=math.nan, bucket_bounds=(0.1, 1.0),
               bucket_counts=counts if rng.random() < 0.8 else ()),
    ]  # fmt: skip


def _chunk_row(w: Window) -> chunks.Row:
    blob = encode_buckets(w.bucket_bounds, w.bucket_counts) if w.bucket_counts else None
    return (w.start, w.length_s, w.samples, w.delta, w.rate, w.resets, w.mean, w.min, w.max,
            w.last, w.p50, w.p90, w.p99, w.sum_delta, blob)  # fmt: skip


def _stored(store: Store) -> dict[tuple[int, float], bytes]:
    with store.db.tx("reading chunks") as conn:
        found = conn.execute(select(ChunkRow.series_id, ChunkRow.hour, ChunkRow.data)).all()
    return {(int(s), float(h)): bytes(d) for s, h, d in found}


def _expected(store: Store, windows: list[Window]) -> dict[tuple[int, float], bytes]:
    """chunks.encode of each series-hour's rows (the last window of a start kept)."""
    into: dict[tuple[int, float], dict[float, chunks.Row]] = {}
    for w in windows:
        sid = store.writer.ids.get(w.source, w.signal, w.labels)
        assert sid is not None
        into.setdefault((sid, chunks.hour_of(w.start)), {})[w.start] = _chunk_row(w)
    return {k: chunks.encode([rows[s] for s in sorted(rows)]) for k, rows in into.items()}


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    with Store(db_url) as s:
        s.migrate()
        yield s


def test_sealed_chunks_are_encode_of_their_windows(store: Store) -> None:
    rng = random.Random(7)
    written: list[Window] = []
    for minute in range(3 * 60):  # three hours of three sources, a minute a write
        batch = [w for s in ("e0", "e1", "e2") for w in _windows(s, T0 + 60.0 * minute, rng)]
        store.write_windows(batch)
        written += batch
    assert store.seal_hours() == 0  # the writes sealed hours 0 and 1; hour 2 stays
    sealed = [w for w in written if w.start < T0 + 2 * HOUR]
    assert _stored(store) == _expected(store, sealed)
    back = store.read_windows()
    assert len(back) == len(written)
    for w in back:
        assert w.min is None or not math.isnan(w.min)  # NaN and NULL read back as unknown
        assert w.p50 is None


def test_seal_merges_a_chunk_another_writer_made(db_url: str) -> None:
    rng = random.Random(8)
    first = [w for m in range(120) for w in _windows("e0", T0 + 60.0 * m, rng)]
    with Store(db_url) as a:
        a.migrate()
        a.write_windows(first)  # hour 0 sealed by the write reaching hour 1
        before = _stored(a)
    late = _windows("e0", T0 + 30.0, rng) + _windows("e0", T0 + 60.0, rng)
    newer = _windows("e0", T0 + HOUR + 3_540.0, rng)
    with Store(db_url) as b:
        b.writer.sealed_below["e0"] = T0  # as if another writer sealed hour 0 since b looked
        b.write_windows(late + newer)  # into the head; sealing hour 0 finds a's chunk there
        stored = _stored(b)
        for w in late:
            sid = b.writer.ids.get(w.source, w.signal, w.labels)
            assert sid is not None
            key = (sid, T0)
            old = chunks.decode(before[key])
            new = [_chunk_row(v) for v in late if v.signal == w.signal]
            assert stored[key] == chunks.encode(merge(old, new, keep_fuller=False))
        assert len(b.read_windows(until=T0 + HOUR)) == 3 * (60 + 1)  # one start new


def test_encode_many_is_encode_of_each_chunk() -> None:
    rng = random.Random(3)
    width = len(chunks.COLUMNS)
    for _ in range(200):
        groups: list[list[chunks.Row]] = []
        for _ in range(rng.randint(1, 6)):
            n = rng.choice([1, 2, 60, rng.randint(1, 90)])
            fixed = rng.random() < 0.4  # many chunks of one layout
            rows = []
            for i in range(n):
                values = [rng.choice([None, math.nan, rng.random() * 1e6, float(i)])
                          for _ in range(width - 1)]  # fmt: skip
                if fixed:
                    values = [60.0, 4.0] + [None] * (width - 3)
                blob = rng.choice([None, None, b"", bytes(rng.randrange(256) for _ in range(9))])
                rows.append((T0 + 60.0 * i, *values, blob))
            groups.append(rows)
        flat = [r for g in groups for r in g]
        offsets = [0]
        for g in groups:
            offsets.append(offsets[-1] + len(g))
        blobs = {i: r[width] for i, r in enumerate(flat) if r[width]}
        many = chunks.encode_many([r[:width] for r in flat], offsets, blobs)
        assert many == [chunks.encode(g) for g in groups]
    with pytest.raises(ValueError, match="1 to 65535 windows, got 0"):
        chunks.encode([])
    with pytest.raises(ValueError, match="got 65536"):
        chunks.encode_many([[T0] + [0.0] * (width - 1)] * 65_536, [0, 65_536], {})
