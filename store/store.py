"""The SQL store: windows, scrape outcomes, clusters, engines, targets, plans (SQLite or
PostgreSQL), composed of one part per concern.

``Store(url)`` connects at once (store/db.py); ``migrate()`` creates or upgrades the schema
(store/migrate.py); every other operation refuses a database whose schema version differs
from the code's. Windows are written idempotently on (source, series, start)
(store/writes.py) and read as columns or records (store/reads.py); each is kept once, in the
head while its hour is written, then in its hour's chunk, and past a configurable age in the
5-minute tier (store/downsample.py; store/tables.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from sqlalchemy import Connection
from sqlalchemy.dialects import postgresql, sqlite

from core.errors import StoreError
from core.records import BucketSum, Window
from store import migrate as migrations
from store.db import Database, redact
from store.downsample import BATCH as DOWNSAMPLE_BATCH
from store.downsample import Downsampled, Downsampler
from store.handoff import HandoffStore
from store.inventory import Inventory
from store.plans import PlanStore
from store.reads import WindowReader
from store.retention import RetentionStore
from store.series import SeriesIds
from store.tables import EngineRecord, PlanRecord, TargetRecord
from store.writes import WindowWriter

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["EngineRecord", "PlanRecord", "Store", "TargetRecord", "redact"]


class Store(Inventory, PlanStore, HandoffStore, RetentionStore):
    """kvscope's SQL store; see the module docstring. Use as a context manager or call close()."""

    def __init__(self, url: str, *, batch_size: int = 5_000) -> None:
        self.url = redact(url)
        if batch_size < 1:
            raise StoreError(f"{self.url}: batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.db = Database(url)
        self.dialect = self.db.dialect
        self._engine = self.db.engine
        self._partitions = self.db.days
        self._insert = sqlite.insert if self.dialect == "sqlite" else postgresql.insert
        self.writer = WindowWriter(self.db, SeriesIds(), batch_size)
        self.reader = WindowReader(self.db)
        self.downsampler = Downsampler(self.db, self.writer.seal_before)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release every pooled connection."""
        self.db.close()

    @contextmanager
    def _tx(self, action: str, *, write: bool = False) -> Iterator[Connection]:
        with self.db.tx(action, write=write) as conn:
            yield conn

    def _require_schema(self) -> None:
        self.db.require_schema()

    def migrate(self) -> int:
        """Create or upgrade the schema (idempotent, safe to race); return the version."""
        return migrations.migrate(self.db)

    def schema_version(self) -> int | None:
        """The version the database is at (None: no kvscope schema)."""
        with self.db.tx("schema check") as conn:
            return self.db.read_version(conn)

    def write_windows(self, windows: Iterable[Window], *, keep_fuller: bool = False) -> int:
        """Upsert windows on (source, series, start); return how many were written.

        Idempotent: writing the same windows again replaces them; a key repeated within one
        call keeps its last window; NaN values are stored as NULL (unknown). One transaction
        per batch of ``batch_size``. ``keep_fuller``: a stored window built from more
        samples than the one written is kept (the direct collector's rule after a restart).
        """
        return self.writer.write(windows, keep_fuller=keep_fuller)

    def seal_hours(self) -> int:
        """Seal every source's hours older than its newest hour into chunks (writes do it
        as they reach a new hour); return the windows moved."""
        return self.writer.seal_all()

    def downsample(self, before: float, *, batch: int = DOWNSAMPLE_BATCH) -> Downsampled:
        """Move the 1-minute windows of every UTC day wholly before ``before`` into the
        5-minute tier (store/downsample.py); ``batch`` series a transaction."""
        return self.downsampler.run(before, batch=batch)

    def read_windows(
        self,
        *,
        signals: Sequence[str] | None = None,
        sources: Sequence[str] | None = None,
        cluster: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> list[Window]:
        """Windows with ``since <= start < until``, ordered by source, signal, start, labels.

        ``cluster`` keeps the sources registered in that cluster as a target or an engine.
        One Window object per window: for millions of windows use :meth:`read_frame`.
        """
        return self.reader.windows(signals=signals, sources=sources, cluster=cluster,
                                   since=since, until=until)  # fmt: skip

    def read_buckets(
        self,
        *,
        signals: Sequence[str] | None = None,
        sources: Sequence[str] | None = None,
        cluster: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> list[Window]:
        """The windows that kept their bucket counts (the catalogue's keep_buckets
        histograms, the default ``signals``), filtered and ordered as read_windows."""
        if signals is None:
            from core.catalog import BUCKET_SIGNALS

            signals = sorted(BUCKET_SIGNALS)
        return self.reader.windows(signals=signals, sources=sources, cluster=cluster,
                                   since=since, until=until, only_buckets=True)  # fmt: skip

    def sum_buckets(
        self,
        *,
        signals: Sequence[str] | None = None,
        sources: Sequence[str] | None = None,
        cluster: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> list[BucketSum]:
        """The bucket counts of the windows read_buckets would return, summed per series
        and bucket layout, sorted by source, signal, labels and last window."""
        return self.reader.sum_buckets(signals=signals, sources=sources, cluster=cluster,
                                       since=since, until=until)  # fmt: skip

    def read_frame(
        self,
        *,
        signals: Sequence[str] | None = None,
        sources: Sequence[str] | None = None,
        cluster: str | None = None,
        since: float | None = None,
        until: float | None = None,
        columns: Iterable[str] | None = None,
        ordered: bool = True,
    ) -> pd.DataFrame:
        """Windows with ``since <= start < until`` as one DataFrame (store/frame.py);
        ``columns`` picks frame columns, ``ordered=False`` skips the sort."""
        return self.reader.frame(signals=signals, sources=sources, cluster=cluster,
                                 since=since, until=until, columns=columns,
                                 ordered=ordered)  # fmt: skip
