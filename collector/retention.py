"""Retention: windows and scrape outcomes older than a cutoff dropped or deleted in batches.

``kvscope db prune --older-than 30d`` runs it once; ``kvscope collect --retention 30d`` (or
KVSCOPE_RETENTION_S) runs it from the collector at its start and then every
:data:`PRUNE_EVERY_S`, in a worker thread, so scraping never waits for it.

Each batch of at most ``batch`` rows is its own short transaction (``DELETE … WHERE id IN
(SELECT id … WHERE start < cutoff LIMIT batch)``), so a collector writing at the same time
waits for one batch at most, never for the whole prune — the way PostgreSQL's documentation
advises deleting many rows from a live table. A window is pruned when it *started* before
the cutoff; so is a roll-up state left in the store (collector.handoff) before it, which no
collector can resume any more. Engines, targets, engine changes and plans are kept: they are
small, and plans are the history ``kvscope plans`` compares against.

On PostgreSQL ``windows`` is partitioned by day (collector.partitions): the partitions
wholly older than the cutoff are detached concurrently and dropped (a few statements a day, the
space back to the file system at once, no dead rows), and only the rows of the day at the
cutoff are deleted in batches. The collector's hourly prune (:class:`Pruner`) passes
``whole_partitions``: it drops whole days only, so a window is kept until its day is wholly
older than the retention (at most one day longer) and no row is ever deleted one by one;
``kvscope db prune`` deletes exactly what is older than the cutoff.

The packed hours of the columnar reads (collector.store_blocks) that start before the cutoff
(on PostgreSQL with ``whole_partitions``: before the day at the cutoff, whose rows stay) go
too: their promises (``packed_hours``) first, in batches, so that those hours are read from
their rows from then on; after the windows, the blocks: on PostgreSQL ``window_blocks`` is
partitioned by day like ``windows`` and its old days are dropped whole, after the windows'
(a day's packs always have their partition while its rows do); the rest in batches. The
promises are swept once more at the end, on PostgreSQL under an advisory lock that packers
hold in shared mode (collector.store_blocks_pg.PRUNE_KEY): a pack made meanwhile from rows
now deleted is dropped with them.

SQLite keeps the freed pages in the file and reuses them for new rows (the file does not
shrink; ``VACUUM`` returns them to the file system, at the cost of rewriting the file).
PostgreSQL's autovacuum makes the dead rows of the batched deletes reusable; a BRIN index on
``windows.start`` (collector.models) lets the prune and the plans' time-range reads find old
rows without reading the whole table.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import Connection, delete, func, select, text
from sqlalchemy.exc import SQLAlchemyError

from collector import partitions
from collector.models import (
    PackedHourRow,
    RollupStateRow,
    ScrapeOutcomeRow,
    WindowBlockRow,
    WindowRow,
)
from collector.store_blocks_pg import PRUNE_KEY
from core.errors import ConfigError, KvscopeError, StoreError

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from sqlalchemy import Engine
    from sqlalchemy.orm import InstrumentedAttribute

log = logging.getLogger(__name__)
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
    """Pruning old rows (mixed into Store)."""

    if TYPE_CHECKING:
        dialect: str
        url: str
        _engine: Engine
        _partitions: partitions.DayPartitions

        def _require_schema(self) -> None: ...
        def _tx(self, what: str, *, write: bool = False) -> AbstractContextManager[Connection]: ...

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
        dropped, the other rows deleted ``batch`` per transaction (module docstring).

        ``whole_partitions``: on PostgreSQL, keep the windows of the partition that holds the
        cutoff (dropped whole once it is wholly older); SQLite, without partitions, deletes
        the rows as always."""
        if not math.isfinite(cutoff):
            raise ConfigError(f"prune cutoff must be a finite time, got {cutoff}")
        if batch < 1:
            raise ConfigError(f"prune batch must be >= 1, got {batch}")
        self._require_schema()
        began = time.monotonic()
        # the packs of the hours whose rows go (whole days only, with whole_partitions)
        pg = self.dialect == "postgresql"
        day = float(math.floor(cutoff / partitions.DAY_S) * partitions.DAY_S)
        packs = day if pg and whole_partitions else cutoff
        if not dry_run:
            self._delete_before(PackedHourRow.hour, packs, batch)  # the promises first
        counts = []
        dropped, dropped_rows = self._drop_partitions(cutoff, dry_run)
        tables = ((WindowRow, WindowRow.start), (ScrapeOutcomeRow, ScrapeOutcomeRow.started))
        for table, column in tables:
            if table is WindowRow and dropped is not None and whole_partitions:
                counts.append(dropped_rows)
            elif dry_run:
                with self._tx(f"counting {table.__tablename__} before {cutoff:.0f}") as conn:
                    found = conn.execute(
                        select(func.count()).select_from(table).where(column < cutoff)
                    ).scalar_one()
                counts.append(int(found))
            else:
                done = self._delete_before(column, cutoff, batch)
                counts.append(done + (dropped_rows if table is WindowRow else 0))
        if not dry_run:
            self._drop_blocks(packs, batch)
            # again: a pack made meanwhile from rows now deleted (packers are waited for)
            self._delete_before(PackedHourRow.hour, packs, batch, exclusive=pg)
            self._drop_blocks(packs, batch)
            # states of targets no collector scrapes any more (collector.handoff)
            with self._tx(f"pruning rollup_states before {cutoff:.0f}", write=True) as conn:
                conn.execute(delete(RollupStateRow).where(RollupStateRow.written < cutoff))
        return Pruned(
            cutoff, counts[0], counts[1], time.monotonic() - began, dry_run, len(dropped or ())
        )

    def _delete_before(
        self, column: InstrumentedAttribute[float], cutoff: float, batch: int, *,
        exclusive: bool = False,
    ) -> int:  # fmt: skip
        """Delete the rows of ``column``'s table whose ``column`` is before ``cutoff``,
        ``batch`` per transaction; the rows deleted. ``exclusive``: each transaction first
        waits for the packers (collector.store_blocks_pg.PRUNE_KEY)."""
        table = column.class_
        what = f"pruning {table.__tablename__} before {cutoff:.0f}"
        # on PostgreSQL the outer condition keeps the delete to the partitions that can hold
        # such rows (the id alone is unique in no index of a partitioned table)
        outer = (column < cutoff,) if table.__tablename__ in partitions.PARENTS else ()
        done = 0
        while True:
            old = select(table.id).where(column < cutoff).limit(batch).scalar_subquery()
            with self._tx(what, write=True) as conn:
                if exclusive:
                    conn.execute(text(f"SELECT pg_advisory_xact_lock({PRUNE_KEY})"))
                n = int(conn.execute(delete(table).where(*outer, table.id.in_(old))).rowcount)
            done += n
            if n < batch:
                return done

    def _drop_blocks(self, cutoff: float, batch: int) -> None:
        """The packs' blocks of the hours before ``cutoff``, whose promises are gone: on
        PostgreSQL the days of ``window_blocks`` wholly before it dropped, then the rest in
        batches. Dropping a pack never loses a window (the rows are the record)."""
        if self.dialect == "postgresql":
            self._drop_partitions(cutoff, False, partitions.BLOCKS)
        self._delete_before(WindowBlockRow.hour, cutoff, batch)

    def _drop_partitions(
        self, cutoff: float, dry_run: bool, parent: str = partitions.PARENT
    ) -> tuple[list[partitions.Partition] | None, int]:
        """PostgreSQL: the partitions of ``parent`` wholly older than ``cutoff`` dropped (dry
        run: found) and their rows; (None, 0) on SQLite."""
        if self.dialect != "postgresql":
            return None, 0
        what = f"dropping the partitions of {parent} before {cutoff:.0f}"
        if dry_run:
            with self._tx(what) as conn:
                old = partitions.wholly_before(partitions.partitions(conn, parent), cutoff)
                return old, partitions.count_rows(conn, old)
        try:
            dropped, rows = partitions.drop_partitions_before(self._engine, cutoff, parent)
        except SQLAlchemyError as exc:
            reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
            raise StoreError(f"{what} failed on {self.url}: {reason}") from exc
        self._partitions.forget(p.day for p in dropped if p.day is not None)
        return dropped, rows


class Pruner:
    """Runs a store's prune every ``every_s`` from a collect loop, in a worker thread (on
    PostgreSQL whole day partitions only: module docstring)."""

    def __init__(
        self, store: RetentionStore, retention_s: float, *, every_s: float = PRUNE_EVERY_S
    ) -> None:
        if not (math.isfinite(retention_s) and retention_s > 0):
            raise ConfigError(f"retention must be > 0 seconds, got {retention_s}")
        self.store = store
        self.retention_s = retention_s
        self.every_s = every_s
        self.next_at = -math.inf
        self.task: asyncio.Task[Pruned] | None = None
        self.last: Pruned | None = None
        self.errors = 0
        self.windows = 0  # deleted so far
        self.outcomes = 0
        self.partitions = 0  # of windows, dropped whole (PostgreSQL)

    def tick(self, now: float) -> None:
        """Collect a finished prune; start one when it is due (call once per tick)."""
        if self.task is not None and self.task.done():
            try:
                self.last = self.task.result()
            except KvscopeError as exc:  # tried again at the next period
                self.errors += 1
                log.error("retention: %s", exc)
            else:
                self.windows += self.last.windows
                self.outcomes += self.last.outcomes
                self.partitions += self.last.partitions
                if self.last.windows or self.last.outcomes or self.last.partitions:
                    log.warning("retention: deleted %d windows (%d partitions dropped) and %d "
                                "outcomes older than %s in %.1f s", self.last.windows,
                                self.last.partitions, self.last.outcomes,
                                self.last.summary()["cutoff_utc"], self.last.seconds)  # fmt: skip
            self.task = None
        if self.task is None and now >= self.next_at:
            self.next_at = now + self.every_s
            cutoff = now - self.retention_s
            prune = self.store.prune
            self.task = asyncio.ensure_future(
                asyncio.to_thread(prune, cutoff, whole_partitions=True)  # module docstring
            )

    async def close(self) -> None:
        """Wait for a prune still running (its batches are short)."""
        if self.task is not None:
            await asyncio.wait([self.task])
            self.tick(math.nan)  # collect it; nan >= next_at is False: no new one

    def summary(self) -> dict[str, object]:
        return {
            "retention_s": self.retention_s,
            "deleted_windows": self.windows,
            "deleted_outcomes": self.outcomes,
            "dropped_partitions": self.partitions,
            "errors": self.errors,
            "last": None if self.last is None else self.last.summary(),
        }
