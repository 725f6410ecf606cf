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

The packed hours of SQLite's columnar reads (collector.store_blocks) that start before the
cutoff are dropped before the windows and again after them.

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

from sqlalchemy import Connection, delete, func, select
from sqlalchemy.exc import SQLAlchemyError

from collector import partitions
from collector.errors import ConfigError, KvscopeError, StoreError
from collector.models import (
    PackedHourRow,
    RollupStateRow,
    ScrapeOutcomeRow,
    WindowBlockRow,
    WindowRow,
)

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from sqlalchemy import Engine

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
        counts = []
        if not dry_run:
            self._drop_packs(cutoff)
        dropped, dropped_rows = self._drop_partitions(cutoff, dry_run)
        tables = ((WindowRow, WindowRow.start), (ScrapeOutcomeRow, ScrapeOutcomeRow.started))
        for table, column in tables:
            what = f"pruning {table.__tablename__} before {cutoff:.0f}"
            if table is WindowRow and dropped is not None and whole_partitions:
                counts.append(dropped_rows)
                continue
            if dry_run:
                with self._tx(what) as conn:
                    found = conn.execute(
                        select(func.count()).select_from(table).where(column < cutoff)
                    ).scalar_one()
                counts.append(int(found))
                continue
            # on PostgreSQL the outer `start < cutoff` keeps the delete to the partitions
            # that can hold such rows (the id alone is unique in no index there)
            windows = table is WindowRow
            outer = (column < cutoff,) if dropped is not None and windows else ()
            done = dropped_rows if windows else 0
            while True:
                old = select(table.id).where(column < cutoff).limit(batch).scalar_subquery()
                with self._tx(what, write=True) as conn:
                    n = int(conn.execute(delete(table).where(*outer, table.id.in_(old))).rowcount)
                done += n
                if n < batch:
                    break
            counts.append(done)
        if not dry_run:
            self._drop_packs(cutoff)  # again: a pack made meanwhile from rows now deleted
        if not dry_run:  # states of targets no collector scrapes any more (collector.handoff)
            with self._tx(f"pruning rollup_states before {cutoff:.0f}", write=True) as conn:
                conn.execute(delete(RollupStateRow).where(RollupStateRow.written < cutoff))
        return Pruned(
            cutoff, counts[0], counts[1], time.monotonic() - began, dry_run, len(dropped or ())
        )

    def _drop_packs(self, cutoff: float) -> None:
        """The packed hours that start before ``cutoff`` (collector.store_blocks): the hour
        at the cutoff too, whose rows are partly deleted; it is read from its rows until
        packed again. Dropping a pack never loses a window (the rows are the record)."""
        with self._tx(f"pruning the packed hours before {cutoff:.0f}", write=True) as conn:
            conn.execute(delete(PackedHourRow).where(PackedHourRow.hour < cutoff))
            conn.execute(delete(WindowBlockRow).where(WindowBlockRow.hour < cutoff))

    def _drop_partitions(
        self, cutoff: float, dry_run: bool
    ) -> tuple[list[partitions.Partition] | None, int]:
        """PostgreSQL: the windows' partitions wholly older than ``cutoff`` dropped (dry run:
        found) and their rows; (None, 0) on SQLite."""
        if self.dialect != "postgresql":
            return None, 0
        what = f"dropping the partitions of windows before {cutoff:.0f}"
        if dry_run:
            with self._tx(what) as conn:
                old = partitions.wholly_before(partitions.partitions(conn), cutoff)
                return old, partitions.count_rows(conn, old)
        try:
            dropped, rows = partitions.drop_partitions_before(self._engine, cutoff)
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
