"""The SQL store (SQLite or PostgreSQL): ``Store`` builds one part per concern over one
Database (writer, reader, downsampler, inventory, plan_store, handoff, retention) and each
of its public methods delegates to one of them.

``Store(url)`` connects at once (store/db.py); ``migrate()`` creates or upgrades the schema
(store/migrate.py); every other operation refuses a database whose schema version differs
from the code's. Windows are written idempotently on (source, series, start)
(store/writes.py) and read (store/reads.py); each is kept once, in the head while its hour
is written, then in its hour's chunk, and past a configurable age in the 5-minute tier
(store/downsample.py; store/tables.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from core.catalog import BUCKET_SIGNALS
from core.errors import StoreError
from core.records import BucketSum, Saved, ScrapeOutcome, Window
from store import migrate as migrations
from store.db import Database, redact
from store.downsample import BATCH as DOWNSAMPLE_BATCH
from store.downsample import Downsampled, Downsampler
from store.handoff import HandoffStore
from store.inventory import Inventory
from store.plans import PlanStore
from store.reads import WindowReader
from store.retention import BATCH as PRUNE_BATCH
from store.retention import Pruned, RetentionStore
from store.series import SeriesIds
from store.tables import EngineChange, EngineRecord, PlanRecord, TargetRecord
from store.writes import WindowWriter

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["EngineRecord", "PlanRecord", "Store", "TargetRecord", "redact"]


class Store:
    """kvscope's SQL store; see the module docstring. Use as a context manager or call close()."""

    def __init__(self, url: str, *, batch_size: int = 5_000) -> None:
        self.url = redact(url)
        if batch_size < 1:
            raise StoreError(f"{self.url}: batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.db = Database(url)
        self.dialect = self.db.dialect
        self.writer = WindowWriter(self.db, SeriesIds(), batch_size)
        self.reader = WindowReader(self.db)
        self.downsampler = Downsampler(self.db, self.writer.seal_before)
        self.inventory = Inventory(self.db, batch_size)
        self.plan_store = PlanStore(self.db, self.inventory)
        self.handoff = HandoffStore(self.db)
        self.retention = RetentionStore(self.db)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release every pooled connection."""
        self.db.close()

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
        call keeps its last window; a NaN value is read back as unknown (None). One transaction
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

    # ---- store/inventory.py: clusters, targets, scrape outcomes, engines, statistics ----

    def write_outcomes(self, outcomes: Iterable[ScrapeOutcome]) -> int:
        """Record scrape outcomes (Inventory.write_outcomes)."""
        return self.inventory.write_outcomes(outcomes)

    def outcomes(
        self,
        *,
        targets: Sequence[str] | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> list[ScrapeOutcome]:
        """Scrape outcomes by target and start (Inventory.outcomes)."""
        return self.inventory.outcomes(targets=targets, since=since, until=until)

    def upsert_cluster(self, name: str) -> int:
        """Register a cluster; its id (Inventory.upsert_cluster)."""
        return self.inventory.upsert_cluster(name)

    def upsert_target(
        self, name: str, url: str, kind: str = "vllm", cluster: str = "default"
    ) -> TargetRecord:
        """Register or update a scrape target (Inventory.upsert_target)."""
        return self.inventory.upsert_target(name, url, kind, cluster)

    def delete_target(self, name: str) -> bool:
        """Forget a scrape target; False when there was none (Inventory.delete_target)."""
        return self.inventory.delete_target(name)

    def upsert_engine(  # noqa: PLR0913 - one parameter per engine fact stored
        self,
        cluster: str,
        source: str,
        *,
        model: str | None = None,
        gpu: str | None = None,
        hbm_gb: float | None = None,
        tensor_parallel: int | None = None,
        offload: str | None = None,
        facts: Mapping[str, Any] | None = None,
        observed_at: float | None = None,
    ) -> EngineRecord:
        """Register or update an engine, recording a regime change (Inventory.upsert_engine)."""
        return self.inventory.upsert_engine(
            cluster, source, model=model, gpu=gpu, hbm_gb=hbm_gb,
            tensor_parallel=tensor_parallel, offload=offload, facts=facts,
            observed_at=observed_at,
        )  # fmt: skip

    def engine_changes(self, sources: Sequence[str] | None = None) -> dict[str, list[EngineChange]]:
        """source -> its recorded regimes, oldest first (Inventory.engine_changes)."""
        return self.inventory.engine_changes(sources)

    def engines(self, cluster: str | None = None, source: str | None = None) -> list[EngineRecord]:
        """Registered engines by cluster, source (Inventory.engines)."""
        return self.inventory.engines(cluster, source)

    def targets(self, cluster: str | None = None) -> list[TargetRecord]:
        """Registered scrape targets by cluster, name (Inventory.targets)."""
        return self.inventory.targets(cluster)

    def stats(self) -> dict[str, Any]:
        """Row, window and series counts and the windows' time range (Inventory.stats)."""
        return self.inventory.stats()

    # ---- store/plans.py ----

    def save_plan(self, plan: PlanRecord) -> int:
        """Insert or replace a plan; its id (PlanStore.save_plan)."""
        return self.plan_store.save_plan(plan)

    def plans(
        self,
        cluster: str | None = None,
        group: str | None = None,
        *,
        since: float | None = None,
        limit: int = 1000,
        documents: bool = True,
    ) -> list[PlanRecord]:
        """Stored plans, newest first (PlanStore.plans)."""
        return self.plan_store.plans(cluster, group, since=since, limit=limit, documents=documents)

    def latest_plan(
        self, cluster: str, group: str = "", *, document: bool = True
    ) -> PlanRecord | None:
        """The newest plan of the cluster and group, or None (PlanStore.latest_plan)."""
        return self.plan_store.latest_plan(cluster, group, document=document)

    def plan_document(self, plan_id: int) -> dict[str, Any] | None:
        """A stored plan's JSON document, or None (PlanStore.plan_document)."""
        return self.plan_store.plan_document(plan_id)

    def latest_plans(self, cluster: str | None = None) -> list[PlanRecord]:
        """The newest plan of every (cluster, group) (PlanStore.latest_plans)."""
        return self.plan_store.latest_plans(cluster)

    def clusters(self) -> list[str]:
        """Every registered cluster, by name (PlanStore.clusters)."""
        return self.plan_store.clusters()

    # ---- store/handoff.py and store/retention.py ----

    def leave_rollup_states(self, states: Iterable[Saved]) -> int:
        """Leave each target's roll-up state; how many (HandoffStore.leave_rollup_states)."""
        return self.handoff.leave_rollup_states(states)

    def take_rollup_states(self, targets: Sequence[str]) -> dict[str, Saved]:
        """The states left for ``targets``, deleted as read (HandoffStore.take_rollup_states)."""
        return self.handoff.take_rollup_states(targets)

    def prune(
        self,
        cutoff: float,
        *,
        batch: int = PRUNE_BATCH,
        dry_run: bool = False,
        whole_partitions: bool = False,
    ) -> Pruned:
        """Delete windows and outcomes before ``cutoff`` (RetentionStore.prune)."""
        return self.retention.prune(
            cutoff, batch=batch, dry_run=dry_run, whole_partitions=whole_partitions
        )
