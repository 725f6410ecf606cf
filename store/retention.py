"""Retention: windows and scrape outcomes older than a cutoff dropped or deleted in batches.

``kvscope db prune`` runs it once; ``kvscope collect --retention`` every PRUNE_EVERY_S in a
worker thread. A window goes when it started before the cutoff: whole chunks in short
batches, straddling chunks rewritten, whole PostgreSQL days dropped (:class:`Pruner` drops
whole days only). Series, engines, targets, engine changes and plans are kept.

Rules: store/DESIGN.md#retention
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import delete, func, select, tuple_, update
from sqlalchemy.exc import SQLAlchemyError

from core.errors import ConfigError, KvscopeError, StoreError
from store import chunks, partitions
from store.db import Database
from store.tables import Chunk5mRow, ChunkRow, HeadRow, RollupStateRow, ScrapeOutcomeRow

if TYPE_CHECKING:
    from store.downsample import Downsampled

log = logging.getLogger(__name__)
# each tier of chunks: its table, its time column and the seconds one chunk spans
TIERS: tuple[tuple[Any, Any, float], ...] = (
    (ChunkRow, ChunkRow.hour, chunks.HOUR_S),
    (Chunk5mRow, Chunk5mRow.day, float(partitions.DAY_S)),
)
PRUNE_EVERY_S = 3_600.0
BATCH = 20_000


@dataclass(frozen=True, slots=True)
class Pruned:
    """What a prune deleted (``dry_run``: would delete); ``partitions``: the windows'
    partitions dropped whole (PostgreSQL), whose rows ``windows`` counts."""

    cutoff: float
    windows: int
    outcomes: int
    seconds: float
    dry_run: bool = False
    partitions: int = 0

    def summary(self) -> dict[str, object]:
        return {
            "cutoff": self.cutoff,
            "cutoff_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.cutoff)),
            "windows": self.windows,
            "outcomes": self.outcomes,
            "seconds": round(self.seconds, 3),
            "dry_run": self.dry_run,
            "partitions_dropped": self.partitions,
        }


class RetentionStore:
    """Pruning old rows (Store's)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def prune(
        self,
        cutoff: float,
        *,
        batch: int = BATCH,
        dry_run: bool = False,
        whole_partitions: bool = False,
    ) -> Pruned:
        """Delete windows that started, and outcomes of scrapes that started, before
        ``cutoff`` (epoch seconds): on PostgreSQL the windows' partitions wholly older are
        dropped, the other rows deleted ``batch`` per transaction (DESIGN.md#retention).

        ``whole_partitions``: on PostgreSQL, keep the windows of the partition that holds the
        cutoff (dropped whole once it is wholly older); SQLite, without partitions, deletes
        the rows as always."""
        if not math.isfinite(cutoff):
            raise ConfigError(f"prune cutoff must be a finite time, got {cutoff}")
        if batch < 1:
            raise ConfigError(f"prune batch must be >= 1, got {batch}")
        self.db.require_schema()
        began = time.monotonic()
        pg = self.db.dialect == "postgresql"
        dropped, dropped_windows = self._drop_partitions(cutoff, dry_run)
        day = float(math.floor(cutoff / partitions.DAY_S) * partitions.DAY_S)
        # with whole_partitions on PostgreSQL, the day at the cutoff stays whole
        edge = day if pg and whole_partitions else cutoff
        if dry_run:
            after = max((p.hi for p in dropped or ()), default=-math.inf)
            windows, outcomes = self._count_before(edge, cutoff, after)
            return Pruned(cutoff, windows + dropped_windows, outcomes,
                          time.monotonic() - began, True, len(dropped or ()))  # fmt: skip
        windows = dropped_windows + self._delete_chunks(edge, batch)
        windows += self._delete_rows(HeadRow.__table__, HeadRow.start, edge, batch)
        outcomes = self._delete_rows(
            ScrapeOutcomeRow.__table__, ScrapeOutcomeRow.started, cutoff, batch
        )
        with self.db.tx(f"pruning rollup_states before {cutoff:.0f}", write=True) as conn:
            conn.execute(delete(RollupStateRow).where(RollupStateRow.written < cutoff))
        return Pruned(cutoff, windows, outcomes, time.monotonic() - began, False,
                      len(dropped or ()))  # fmt: skip

    def _count_before(self, edge: float, cutoff: float, after: float) -> tuple[int, int]:
        """What a prune would delete, but for the partitions it would drop (the chunks
        before ``after``)."""
        windows = 0
        with self.db.tx(f"counting what is before {cutoff:.0f}") as conn:
            for table, at, span in TIERS:
                windows += int(conn.execute(
                    select(func.coalesce(func.sum(table.n), 0)).where(at + span <= edge,
                                                                       at >= after)
                ).scalar_one())  # fmt: skip
                for (data,) in conn.execute(select(table.data).where(at < edge, at + span > edge)):
                    windows += sum(1 for r in chunks.decode(bytes(data)) if r[0] < edge)
            windows += int(conn.execute(
                select(func.count()).select_from(HeadRow).where(HeadRow.start < edge)
            ).scalar_one())  # fmt: skip
            outcomes = conn.execute(
                select(func.count()).select_from(ScrapeOutcomeRow)
                .where(ScrapeOutcomeRow.started < cutoff)
            ).scalar_one()  # fmt: skip
        return windows, int(outcomes)

    def _delete_chunks(self, edge: float, batch: int) -> int:
        """Each tier's chunks wholly before ``edge`` deleted ``batch`` per transaction, those
        that straddle it rewritten without their windows before it; the windows deleted."""
        done = 0
        for table, at, span in TIERS:
            name = table.__tablename__
            while True:
                with self.db.tx(f"pruning {name} before {edge:.0f}", write=True) as conn:
                    old = conn.execute(
                        select(table.series_id, at, table.n).where(at + span <= edge).limit(batch)
                    ).all()
                    if old:
                        keys = [(r[0], r[1]) for r in old]
                        conn.execute(delete(table).where(tuple_(table.series_id, at).in_(keys)))
                done += sum(int(r[2]) for r in old)
                if len(old) < batch:
                    break
            with self.db.tx(f"pruning the {name} chunk at {edge:.0f}", write=True) as conn:
                split = conn.execute(
                    select(table.series_id, at, table.data).where(at < edge, at + span > edge)
                ).all()
                for sid, when, data in split:
                    rows = chunks.decode(bytes(data))
                    kept = [r for r in rows if r[0] >= edge]
                    done += len(rows) - len(kept)
                    which = delete(table) if not kept else update(table).values(
                        n=len(kept), data=chunks.encode(kept))  # fmt: skip
                    conn.execute(which.where(table.series_id == sid, at == when))
        return done

    def _delete_rows(self, table: Any, column: Any, cutoff: float, batch: int) -> int:
        """The rows of ``table`` whose ``column`` is before ``cutoff``, ``batch`` per
        transaction; how many."""
        key = list(table.primary_key.columns)
        done = 0
        while True:
            old = select(*key).where(column < cutoff).limit(batch)
            match = key[0].in_(old) if len(key) == 1 else tuple_(*key).in_(old)
            with self.db.tx(f"pruning {table.name} before {cutoff:.0f}", write=True) as conn:
                n = int(conn.execute(delete(table).where(match)).rowcount)
            done += n
            if n < batch:
                return done

    def _drop_partitions(
        self, cutoff: float, dry_run: bool
    ) -> tuple[list[partitions.Partition] | None, int]:
        """PostgreSQL: each tier's partitions wholly older than ``cutoff`` dropped (dry
        run: found) and their windows; (None, 0) on SQLite. The partitions counted are the
        1-minute tier's (a day of each tier goes at once)."""
        if self.db.dialect != "postgresql":
            return None, 0
        found: list[partitions.Partition] = []
        windows = 0
        for parent in partitions.PARENTS:
            what = f"dropping the partitions of {parent} before {cutoff:.0f}"
            if dry_run:
                with self.db.tx(what) as conn:
                    old = partitions.wholly_before(partitions.partitions(conn, parent), cutoff)
                    n = partitions.count_windows(conn, old)
            else:
                try:
                    old, n = partitions.drop_partitions_before(self.db.engine, cutoff, parent)
                except SQLAlchemyError as exc:
                    reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
                    raise StoreError(f"{what} failed on {self.db.url}: {reason}") from exc
                self.db.days.forget(p.day for p in old if p.day is not None)
            windows += n
            if parent == partitions.PARENT:
                found = old
        return found, windows


class Maintained(Protocol):
    """What a Pruner runs (store.store.Store)."""

    def prune(self, cutoff: float, *, whole_partitions: bool = ...) -> Pruned: ...

    def downsample(self, before: float) -> Downsampled: ...


class Pruner:
    """Runs a store's prune and downsampling every ``every_s`` from a collect loop, in a
    worker thread (on PostgreSQL whole day partitions only: DESIGN.md#retention).
    ``retention_s`` / ``downsample_s``: the ages past which windows are deleted / moved to
    the 5-minute tier (None: never; at least one is set)."""

    def __init__(
        self,
        store: Maintained,
        retention_s: float | None,
        *,
        downsample_s: float | None = None,
        every_s: float = PRUNE_EVERY_S,
    ) -> None:
        for name, age in (("retention", retention_s), ("downsampling age", downsample_s)):
            if age is not None and not (math.isfinite(age) and age > 0):
                raise ConfigError(f"{name} must be > 0 seconds, got {age}")
        if retention_s is None and downsample_s is None:
            raise ConfigError("a pruner needs a retention or a downsampling age")
        self.store = store
        self.retention_s = retention_s
        self.downsample_s = downsample_s
        self.every_s = every_s
        self.next_at = -math.inf
        self.task: asyncio.Task[tuple[Pruned | None, Downsampled | None]] | None = None
        self.last: Pruned | None = None
        self.last_downsample: Downsampled | None = None
        self.errors = 0
        self.windows = 0  # deleted so far
        self.outcomes = 0
        self.partitions = 0  # of chunks, dropped whole (PostgreSQL)
        self.downsampled = 0  # 1-minute windows moved into the 5-minute tier so far

    def _run(self, now: float) -> tuple[Pruned | None, Downsampled | None]:
        pruned = downsampled = None
        if self.retention_s is not None:
            pruned = self.store.prune(now - self.retention_s, whole_partitions=True)
        if self.downsample_s is not None:
            downsampled = self.store.downsample(now - self.downsample_s)
        return pruned, downsampled

    def tick(self, now: float) -> None:
        """Collect a finished run; start one when it is due (call once per tick)."""
        if self.task is not None and self.task.done():
            try:
                self.last, self.last_downsample = self.task.result()
            except KvscopeError as exc:  # tried again at the next period
                self.errors += 1
                log.error("retention: %s", exc)
            else:
                self._count()
            self.task = None
        if self.task is None and now >= self.next_at:
            self.next_at = now + self.every_s
            self.task = asyncio.ensure_future(asyncio.to_thread(self._run, now))

    def _count(self) -> None:
        if self.last is not None:
            last = self.last
            self.windows += last.windows
            self.outcomes += last.outcomes
            self.partitions += last.partitions
            if last.windows or last.outcomes or last.partitions:
                log.warning("retention: deleted %d windows (%d partitions dropped) and %d "
                            "outcomes older than %s in %.1f s", last.windows, last.partitions,
                            last.outcomes, last.summary()["cutoff_utc"], last.seconds)  # fmt: skip
        if self.last_downsample is not None:
            self.downsampled += self.last_downsample.windows_in

    async def close(self) -> None:
        """Wait for a run still going (its batches are short)."""
        if self.task is not None:
            await asyncio.wait([self.task])
            self.tick(math.nan)  # collect it; nan >= next_at is False: no new one

    def summary(self) -> dict[str, object]:
        return {
            "retention_s": self.retention_s,
            "downsample_s": self.downsample_s,
            "deleted_windows": self.windows,
            "deleted_outcomes": self.outcomes,
            "dropped_partitions": self.partitions,
            "downsampled_windows": self.downsampled,
            "errors": self.errors,
            "last": None if self.last is None else self.last.summary(),
            "last_downsample": None
            if self.last_downsample is None
            else self.last_downsample.summary(),
        }
