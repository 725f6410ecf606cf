"""The downsampled tier: closed days of 1-minute chunks turned into 5-minute windows.

``Store.downsample(before)`` takes the chunks of every UTC day wholly before ``before``, a
batch of series at a time (one transaction each), sums each series' windows into STEP_S
windows (store/downsample_math.py), writes them as one chunk per series and day in
``chunks_5m`` (the chunk format, store/chunks.py) and deletes the 1-minute chunks. Reads
return both tiers (a 5-minute window has ``length_s`` up to 300). A window written into a
day after it was downsampled is sealed into a 1-minute chunk as any late window and moved at
the next run, where its 5-minute window replaces the one that was there. Bucket counts
(keep_buckets histograms) are summed when the windows of a 5-minute window share a layout.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, delete, select, tuple_
from sqlalchemy.dialects import postgresql, sqlite

from core.errors import ConfigError, StoreError
from store import chunks, partitions
from store.buckets import decode_buckets, encode_buckets
from store.db import Database
from store.downsample_math import DELTA_MEAN_KINDS, STEP_S, downsample
from store.tables import Chunk5mRow, ChunkRow, SeriesRow

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

DAY_S = float(partitions.DAY_S)
BATCH = 500  # series per transaction


@dataclass(frozen=True, slots=True)
class Downsampled:
    """What a run moved: 1-minute windows read, 5-minute windows written, days, seconds."""

    before: float
    windows_in: int
    windows_out: int
    days: int
    seconds: float

    def summary(self) -> dict[str, object]:
        return {"before": self.before, "windows_in": self.windows_in,
                "windows_out": self.windows_out, "days": self.days,
                "seconds": round(self.seconds, 3)}  # fmt: skip


class Downsampler:
    """Store.downsample (module docstring)."""

    def __init__(self, db: Database, seal_before: Callable[[float], int]) -> None:
        self.db = db
        self.seal_before = seal_before  # the writer's: head rows of old days into chunks

    def run(self, before: float, *, batch: int = BATCH) -> Downsampled:
        if not math.isfinite(before):
            raise ConfigError(f"downsample cutoff must be a finite time, got {before}")
        if batch < 1:
            raise ConfigError(f"downsample batch must be >= 1, got {batch}")
        self.db.require_schema()
        began = time.monotonic()
        end = math.floor(before / DAY_S) * DAY_S
        self.seal_before(end)
        with self.db.tx("listing the days to downsample") as conn:
            hours = conn.execute(select(ChunkRow.hour).distinct().where(ChunkRow.hour < end))
            days = sorted({math.floor(float(h) / DAY_S) * DAY_S for (h,) in hours})
        w_in = w_out = 0
        for day in days:
            with self.db.tx(f"listing the series of day {day:.0f}") as conn:
                ids = sorted(int(i) for (i,) in conn.execute(
                    select(ChunkRow.series_id).distinct().where(
                        ChunkRow.hour >= day, ChunkRow.hour < day + DAY_S)))  # fmt: skip
            for i in range(0, len(ids), batch):
                a, b = self._day(day, ids[i : i + batch])
                w_in, w_out = w_in + a, w_out + b
        return Downsampled(end, w_in, w_out, len(days), time.monotonic() - began)

    def _day(self, day: float, ids: list[int]) -> tuple[int, int]:
        """One day of these series moved; (windows read, windows written)."""
        if self.db.dialect == "postgresql":
            self.db.make_days({int(day // DAY_S)})
        with self.db.tx(f"downsampling day {day:.0f}", write=True) as conn:
            c = ChunkRow
            rows = conn.execute(
                select(c.series_id, c.data, SeriesRow.kind)
                .join(SeriesRow, SeriesRow.id == c.series_id)
                .where(c.series_id.in_(ids), c.hour >= day, c.hour < day + DAY_S)
                .order_by(c.series_id, c.hour)
            ).all()
            if not rows:
                return 0, 0
            out = _five_minutes(rows)
            conn.execute(delete(c).where(c.series_id.in_(ids), c.hour >= day,
                                         c.hour < day + DAY_S))  # fmt: skip
            _put(conn, day, out)
        return sum(int(chunks.layout(bytes(r[1]))[0]) for r in rows), sum(
            len(v) for v in out.values()
        )


def _five_minutes(rows: Any) -> dict[int, list[chunks.Row]]:
    """The 5-minute chunk rows of each series from its 1-minute chunks (rows in order)."""
    import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)

    datas = [bytes(r[1]) for r in rows]
    chunk_of, cols = chunks.decode_many(datas, chunks.COLUMNS)
    sid = np.asarray([int(r[0]) for r in rows], dtype=np.int64)[chunk_of]
    by_delta = np.asarray([r[2] in DELTA_MEAN_KINDS for r in rows], dtype=bool)[chunk_of]
    out_sid, out = downsample(sid, cols, by_delta)
    blobs = _bucket_sums(datas, chunk_of, sid, cols["start"])
    per: dict[int, list[chunks.Row]] = {}
    values = np.column_stack([out[c] for c in chunks.COLUMNS]).tolist()
    for s, row in zip(out_sid.tolist(), values, strict=True):
        key = (s, math.floor(row[0] / STEP_S))
        per.setdefault(s, []).append((*row, blobs.get(key)))
    return per


def _bucket_sums(
    datas: list[bytes],
    chunk_of: npt.NDArray[np.int64],
    sid: npt.NDArray[np.int64],
    start: npt.NDArray[np.float64],
) -> dict[tuple[int, int], bytes | None]:
    """The summed bucket counts of each (series, 5-minute bucket) whose windows kept some,
    None where their layouts differ."""
    blob_rows = [b for d in datas for b in chunks.blobs_of(d)]
    sums: dict[tuple[int, int], tuple[tuple[float, ...], list[float]] | None] = {}
    for i, blob in enumerate(blob_rows):
        if blob is None:
            continue
        key = (int(sid[i]), math.floor(float(start[i]) / STEP_S))
        try:
            bounds, counts = decode_buckets(blob)
        except ValueError as exc:
            raise StoreError(f"series {key[0]}: unreadable buckets: {exc}") from exc
        if key not in sums:
            sums[key] = (bounds, list(counts))
            continue
        have = sums[key]
        if have is not None and have[0] == bounds:
            have[1][:] = [a + b for a, b in zip(have[1], counts, strict=True)]
        else:
            sums[key] = None
    del chunk_of
    return {k: None if v is None else encode_buckets(v[0], v[1]) for k, v in sums.items()}


def _put(conn: Connection, day: float, per: dict[int, list[chunks.Row]]) -> None:
    """The series' 5-minute windows into their day's chunk: a window replaces one of the
    same 5-minute bucket already there."""
    t = Chunk5mRow
    have = {int(s): bytes(d) for s, d in conn.execute(
        select(t.series_id, t.data).where(tuple_(t.series_id, t.day).in_(
            [(s, day) for s in per])))}  # fmt: skip
    values = []
    for s, new in sorted(per.items()):
        by_bucket = (
            {math.floor(r[0] / STEP_S): r for r in chunks.decode(have[s])} if s in have else {}
        )
        by_bucket.update((math.floor(r[0] / STEP_S), r) for r in new)
        rows = [by_bucket[k] for k in sorted(by_bucket)]
        values.append({"series_id": s, "day": day, "n": len(rows), "data": chunks.encode(rows)})
    insert = sqlite.insert if conn.dialect.name == "sqlite" else postgresql.insert
    stmt = insert(t)
    stmt = stmt.on_conflict_do_update(
        index_elements=["series_id", "day"], set_={"n": stmt.excluded.n, "data": stmt.excluded.data}
    )
    conn.execute(stmt, values)
