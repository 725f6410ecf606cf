"""SQLAlchemy 2 typed tables of the kvscope store (SQLite by default, PostgreSQL for scale).

Times are UTC epoch seconds in DOUBLE columns: SQLite hands back naive datetimes and a float
round-trips exactly on both backends. Windows are kept once: ``series`` names each series of
each source by an integer; ``head`` holds the windows of the hours still written, one row
each, unique on (series, start); ``chunks`` the windows of each closed hour of a series as
one compressed columnar value (store/chunks.py), unique on (series, hour). On PostgreSQL
``chunks`` is range-partitioned by day on ``hour`` (store/partitions.py). ``chunks_5m``, the
downsampled tier, holds older days as 5-minute windows, one chunk per series and day.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from core.records import OFFLOAD_MODES as OFFLOAD_MODES  # noqa: PLC0414
from core.records import Labels

# Bump when the schema changes and add the step to store.MIGRATIONS.
SCHEMA_VERSION = 10

TARGET_KINDS = ("vllm", "lmcache", "prometheus")


class Base(DeclarativeBase):
    pass


class SchemaVersionRow(Base):
    """One row: the schema version the database was migrated to."""

    __tablename__ = "schema_version"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    migrated_at: Mapped[float] = mapped_column(Double, nullable=False)


class ClusterRow(Base):
    __tablename__ = "clusters"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), unique=True, nullable=False)


class EngineRow(Base):
    """One serving engine (one scrape source); facts come from e.g. vllm cache_config_info."""

    __tablename__ = "engines"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id"), nullable=False)
    source: Mapped[str] = mapped_column(String(500), unique=True, nullable=False)
    model: Mapped[str | None] = mapped_column(String(500))
    gpu: Mapped[str | None] = mapped_column(String(100))
    hbm_gb: Mapped[float | None] = mapped_column(Double)
    tensor_parallel: Mapped[int | None] = mapped_column(Integer)
    offload: Mapped[str] = mapped_column(String(16), nullable=False, default="none")
    facts: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False, default=dict)
    updated: Mapped[float] = mapped_column(Double, nullable=False)


class EngineChangeRow(Base):
    """One regime of an engine: its offload mode and KV facts as first observed at ``at``.

    A row is appended when what an engine runs changes (a restart with offload switched on,
    a new KV pool size), so the planner attributes each window to the regime that served it.
    """

    __tablename__ = "engine_changes"
    __table_args__ = (UniqueConstraint("source", "at", name="uq_engine_changes_source_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    source: Mapped[str] = mapped_column(String(500), nullable=False, index=True)
    at: Mapped[float] = mapped_column(Double, nullable=False)
    offload: Mapped[str] = mapped_column(String(16), nullable=False)
    facts: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False, default=dict)


class TargetRow(Base):
    """One scrape target (an engine /metrics, an LMCache server or a Prometheus)."""

    __tablename__ = "targets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(500), unique=True, nullable=False)
    url: Mapped[str] = mapped_column(Text, nullable=False)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id"), nullable=False)
    updated: Mapped[float] = mapped_column(Double, nullable=False)


class RollupStateRow(Base):
    """A direct collector's roll-up state of one target, left at its clean stop for whichever
    collector scrapes the target next (a re-sharded or moved one: store.handoff)."""

    __tablename__ = "rollup_states"

    target: Mapped[str] = mapped_column(String(500), primary_key=True)
    url: Mapped[str] = mapped_column(Text, nullable=False)
    written: Mapped[float] = mapped_column(Double, nullable=False)
    # collector.rollup export_state() as JSON text: it may hold ±Infinity (histogram bounds),
    # which PostgreSQL's json type refuses
    state: Mapped[str] = mapped_column(Text, nullable=False)


class ScrapeOutcomeRow(Base):
    """One scrape of one target; unique on (target, started) so retries do not duplicate."""

    __tablename__ = "scrape_outcomes"
    __table_args__ = (
        UniqueConstraint("target", "started", name="uq_scrape_outcomes_target_started"),
        Index("ix_scrape_outcomes_started", "started"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    target: Mapped[str] = mapped_column(String(500), nullable=False)
    started: Mapped[float] = mapped_column(Double, nullable=False)
    duration_s: Mapped[float] = mapped_column(Double, nullable=False)
    up: Mapped[bool] = mapped_column(Boolean, nullable=False)
    bytes: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    series: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    error_kind: Mapped[str | None] = mapped_column(String(32))
    error: Mapped[str | None] = mapped_column(Text)


class SeriesRow(Base):
    """One series of one source: what every window of it shares, named by a small integer.

    Unique on (source, key): ``key`` is the 128-bit hash of signal and canonical labels
    (:func:`series_key`); ``labels`` the canonical JSON text of the label set."""

    __tablename__ = "series"
    __table_args__ = (
        UniqueConstraint("source", "key", name="uq_series_source_key"),
        Index("ix_series_signal", "signal"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    source: Mapped[str] = mapped_column(String(500), nullable=False)
    key: Mapped[str] = mapped_column(String(32), nullable=False)
    signal: Mapped[str] = mapped_column(String(200), nullable=False)
    labels: Mapped[str] = mapped_column(Text, nullable=False)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)


class HeadRow(Base):
    """One window of an hour still being written (a TSDB's head), one row per window.

    Once a later hour of its source is written, the hour's rows move into one ChunkRow
    per series (store/writes.py); a window of an hour that has its chunk is written into
    the chunk instead, so a window is in one of the two tables, never both."""

    __tablename__ = "head"
    __table_args__ = {"sqlite_with_rowid": False}  # noqa: RUF012 - SQLAlchemy's declaration

    # keyed by (start, series): a batch of one scrape's windows lands in a few pages at the
    # end of the key's B-tree, where (series, start) would touch a page per series
    start: Mapped[float] = mapped_column(Double, primary_key=True)
    series_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    length_s: Mapped[float] = mapped_column(Double, nullable=False)
    samples: Mapped[int] = mapped_column(Integer, nullable=False)
    delta: Mapped[float | None] = mapped_column(Double)
    rate: Mapped[float | None] = mapped_column(Double)
    resets: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    mean: Mapped[float | None] = mapped_column(Double)
    min: Mapped[float | None] = mapped_column(Double)
    max: Mapped[float | None] = mapped_column(Double)
    last: Mapped[float | None] = mapped_column(Double)
    p50: Mapped[float | None] = mapped_column(Double)
    p90: Mapped[float | None] = mapped_column(Double)
    p99: Mapped[float | None] = mapped_column(Double)
    sum_delta: Mapped[float | None] = mapped_column(Double)
    # the bucket counts of a catalogue keep_buckets histogram (store/buckets.py), else NULL
    buckets: Mapped[bytes | None] = mapped_column(LargeBinary)


class ChunkRow(Base):
    """The windows of one series that start in one closed UTC hour, columnar and
    compressed (store/chunks.py). On PostgreSQL partitioned by day on ``hour``
    (store/partitions.py)."""

    __tablename__ = "chunks"

    series_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    hour: Mapped[float] = mapped_column(Double, primary_key=True)
    n: Mapped[int] = mapped_column(Integer, nullable=False)  # its windows
    data: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)


class Chunk5mRow(Base):
    """The downsampled tier: one series' 5-minute windows of one UTC day (``day``: its
    start, epoch s), in the chunk format (store/downsample.py). On PostgreSQL partitioned
    by day like ``chunks``."""

    __tablename__ = "chunks_5m"

    series_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    day: Mapped[float] = mapped_column(Double, primary_key=True)
    n: Mapped[int] = mapped_column(Integer, nullable=False)  # its windows
    data: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)


# The headline figures of a stored plan, one column each (None: the plan could not tell).
# Kept as columns so history, the closed loop and /metrics read them without parsing JSON.
PLAN_HEADLINE = (
    "score",
    "breakeven_native", "breakeven_native_lo", "breakeven_native_hi",
    "breakeven_lmcache", "breakeven_lmcache_lo", "breakeven_lmcache_hi",
    "capacity_native", "capacity_native_lo", "capacity_native_hi",
    "capacity_lmcache", "capacity_lmcache_lo", "capacity_lmcache_hi",
    "equal_kv_gain_native", "equal_kv_gain_native_lo", "equal_kv_gain_native_hi",
    "equal_kv_gain_lmcache", "equal_kv_gain_lmcache_lo", "equal_kv_gain_lmcache_hi",
    "kv_util_now",
    "forecast_peak", "forecast_peak_lo", "forecast_peak_hi",
    "kv_capacity",
    "saturation_s", "saturation_lo_s", "saturation_hi_s",
    "p_saturation",
)  # fmt: skip


class PlanRow(Base):
    """One stored plan (`kvscope plan --save`): unique on (cluster, group, window range), so
    re-planning the same history replaces the row instead of adding one."""

    __tablename__ = "plans"
    __table_args__ = (
        UniqueConstraint(
            "cluster_id", "group_name", "window_from", "window_until", name="uq_plans_window"
        ),
        Index("ix_plans_cluster_created", "cluster_id", "created_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id"), nullable=False)
    group_name: Mapped[str] = mapped_column(String(500), nullable=False, default="")
    created_at: Mapped[float] = mapped_column(Double, nullable=False)
    window_from: Mapped[float] = mapped_column(Double, nullable=False)
    window_until: Mapped[float] = mapped_column(Double, nullable=False)
    horizon_s: Mapped[float] = mapped_column(Double, nullable=False)
    version: Mapped[str] = mapped_column(String(64), nullable=False)
    mode: Mapped[str | None] = mapped_column(String(16))
    document: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    score: Mapped[float | None] = mapped_column(Double)
    breakeven_native: Mapped[float | None] = mapped_column(Double)
    breakeven_native_lo: Mapped[float | None] = mapped_column(Double)
    breakeven_native_hi: Mapped[float | None] = mapped_column(Double)
    breakeven_lmcache: Mapped[float | None] = mapped_column(Double)
    breakeven_lmcache_lo: Mapped[float | None] = mapped_column(Double)
    breakeven_lmcache_hi: Mapped[float | None] = mapped_column(Double)
    # capacity at the SLO of the mode over no offload (90 % interval; hi None: a lower bound)
    capacity_native: Mapped[float | None] = mapped_column(Double)
    capacity_native_lo: Mapped[float | None] = mapped_column(Double)
    capacity_native_hi: Mapped[float | None] = mapped_column(Double)
    capacity_lmcache: Mapped[float | None] = mapped_column(Double)
    capacity_lmcache_lo: Mapped[float | None] = mapped_column(Double)
    capacity_lmcache_hi: Mapped[float | None] = mapped_column(Double)
    # the diagnostic: relative tokens/s at equal KV use, at the current KV use (schema <= 7
    # called these gain_<mode>_now and read them as a throughput gain)
    equal_kv_gain_native: Mapped[float | None] = mapped_column(Double)
    equal_kv_gain_native_lo: Mapped[float | None] = mapped_column(Double)
    equal_kv_gain_native_hi: Mapped[float | None] = mapped_column(Double)
    equal_kv_gain_lmcache: Mapped[float | None] = mapped_column(Double)
    equal_kv_gain_lmcache_lo: Mapped[float | None] = mapped_column(Double)
    equal_kv_gain_lmcache_hi: Mapped[float | None] = mapped_column(Double)
    kv_util_now: Mapped[float | None] = mapped_column(Double)
    forecast_peak: Mapped[float | None] = mapped_column(Double)
    forecast_peak_lo: Mapped[float | None] = mapped_column(Double)
    forecast_peak_hi: Mapped[float | None] = mapped_column(Double)
    kv_capacity: Mapped[float | None] = mapped_column(Double)
    saturation_s: Mapped[float | None] = mapped_column(Double)
    saturation_lo_s: Mapped[float | None] = mapped_column(Double)
    saturation_hi_s: Mapped[float | None] = mapped_column(Double)
    p_saturation: Mapped[float | None] = mapped_column(Double)


def labels_json(labels: Labels) -> str:
    """Canonical JSON text of a label set (sorted keys, no spaces)."""
    return json.dumps(dict(labels), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def series_key(signal: str, labels: Labels) -> str:
    """Fixed-width identity of a series: 128-bit BLAKE2b of signal and canonical labels."""
    raw = f"{signal}\x00{labels_json(labels)}".encode()
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class EngineRecord:
    """One engine as the store knows it (returned by Store.engines())."""

    cluster: str
    source: str
    model: str | None
    gpu: str | None
    hbm_gb: float | None
    tensor_parallel: int | None
    offload: str
    facts: Mapping[str, Any] = field(default_factory=dict)
    # the regimes observed, oldest first (Store.engines(); empty: never observed)
    changes: tuple[EngineChange, ...] = ()


@dataclass(frozen=True, slots=True)
class EngineChange:
    """An engine's regime from ``at`` on: offload mode and the facts that define it."""

    at: float
    offload: str
    facts: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TargetRecord:
    """One scrape target as the store knows it."""

    name: str
    url: str
    kind: str
    cluster: str


@dataclass(frozen=True, slots=True)
class PlanRecord:
    """One plan as the store keeps it (Store.save_plan / latest_plan / plans).

    ``group`` is the model group planned ("" for the whole cluster); ``window_from`` /
    ``window_until`` the history it used (epoch s); ``document`` the `kvscope plan --json`
    object; ``headline`` its figures by PLAN_HEADLINE name (missing or None: unknown);
    ``mode`` the decided mode (None: decided per group). ``id`` is set by the store.
    """

    cluster: str
    group: str
    created_at: float
    window_from: float
    window_until: float
    horizon_s: float
    version: str
    mode: str | None
    document: Mapping[str, Any]
    headline: Mapping[str, float | None] = field(default_factory=dict)
    id: int | None = None
