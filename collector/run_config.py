"""What a collect run is told: frozen, validated when built, passed whole.

DirectConfig drives collector.run.collect_direct, PrometheusConfig
collector.run_prometheus.collect_prometheus; CollectConfig is a whole `kvscope collect`
run (the store, the local state, the health address and one of the two loops).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from collector.keep import Keep
from collector.shard import Shard
from core.catalog import STORED_SIGNALS
from core.errors import ConfigError

if TYPE_CHECKING:
    from collector.promsource import SourceFrom

# A range longer than this (the back-fill, a poll after an outage) is read and written an hour
# at a time: all of it at once held every window in memory (200 engines × 6 h: 3.1 M windows)
# and made each query as large as the range (benchmarks/bench_prometheus_mode.py).
BACKFILL_CHUNK_S = 3600.0


@dataclass(frozen=True, slots=True)
class DirectConfig:
    """The direct-scrape loop: tick, window, per-scrape limits, checkpoints, shard, keep.

    ``once``: one scrape per target; ``max_ticks``: stop after that many (None: on a stop);
    ``checkpoint_s``: most seconds between roll-up checkpoints (0: every tick);
    ``shard``: scrape only this shard's targets; ``keep``: the signals written (None: all).
    """

    interval_s: float
    window_s: float
    timeout_s: float
    concurrency: int
    max_body_bytes: int
    once: bool = False
    max_ticks: int | None = None
    checkpoint_s: float = 0.0
    shard: Shard | None = None
    keep: Keep = STORED_SIGNALS

    def __post_init__(self) -> None:
        if not (math.isfinite(self.interval_s) and self.interval_s > 0):
            raise ConfigError(f"scrape interval must be > 0 seconds, got {self.interval_s}")


@dataclass(frozen=True, slots=True)
class PrometheusConfig:
    """The Prometheus-mode loop: back-fill ``since_s``, then poll every ``interval_s``.

    ``settle_s``: windows younger than this are left for the next poll; ``once``: the
    back-fill only; ``max_polls``: stop after that many (None: on a stop); ``chunk_s``: a
    longer range is read this much at a time; ``keep``: the signals queried and written.
    """

    cluster: str
    window_s: float
    since_s: float
    interval_s: float
    settle_s: float = 30.0
    once: bool = False
    max_polls: int | None = None
    chunk_s: float = BACKFILL_CHUNK_S
    keep: Keep = STORED_SIGNALS

    def __post_init__(self) -> None:
        if not (math.isfinite(self.interval_s) and self.interval_s > 0):
            raise ConfigError(f"poll interval must be > 0 seconds, got {self.interval_s}")
        if not (math.isfinite(self.since_s) and self.since_s > 0):
            raise ConfigError(f"--since must be > 0 seconds, got {self.since_s}")


@dataclass(frozen=True, slots=True)
class CollectConfig:
    """A whole `kvscope collect` run; ``loop`` says the mode.

    Direct mode scrapes ``targets`` (a targets file), the store's targets table
    (``targets_from_store``, URLs allowed into ``allowed_networks``) and ``file_sd``;
    Prometheus mode reads ``prometheus`` (``source_from``: instance or job/instance).
    ``cluster`` is the --cluster flag (None: the targets file's, else ``default_cluster``).
    """

    db: str
    loop: DirectConfig | PrometheusConfig
    default_cluster: str
    cluster: str | None = None
    targets: Path | None = None
    targets_from_store: bool = False
    allowed_networks: tuple[str, ...] = ()
    file_sd: tuple[str, ...] = ()
    prometheus: str | None = None
    source_from: SourceFrom = "instance"
    query_timeout_s: float = 10.0
    engines: Path | None = None
    metrics_addr: str | None = None
    state_dir: Path | None = None
    spool_max_bytes: int = 1 << 30
    spool_memory_windows: int = 100_000
    retention_s: float | None = None
    downsample_s: float | None = None
    keep_name: str = "used"
    quiet: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.loop, PrometheusConfig) != (self.prometheus is not None):
            raise ConfigError("a Prometheus loop needs a Prometheus URL, and only it")
