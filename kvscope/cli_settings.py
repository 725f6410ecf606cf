"""Settings: one factory, read when called (never at import time)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from collector.urlguard import split_allowlist

# the shortest retention KVSCOPE_RETENTION_S and `collect --retention` take: a bare "30" is
# 30 seconds, which would delete nearly everything a plan reads
MIN_RETENTION_S = 3_600.0


class Settings(BaseSettings):
    """kvscope settings; every field can be set as KVSCOPE_<NAME> in the environment."""

    model_config = SettingsConfigDict(env_prefix="KVSCOPE_", extra="forbid")

    db: str = Field("sqlite:///kvscope.db", description="SQLAlchemy URL of the store")
    window_s: float = Field(60.0, gt=0, le=86_400, description="rollup window length")
    scrape_interval_s: float = Field(15.0, gt=0, le=3_600)
    scrape_timeout_s: float = Field(10.0, gt=0, le=3_600)
    scrape_concurrency: int = Field(64, ge=1, le=4_096)
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1_024)
    cluster: str = Field("default", min_length=1, max_length=200)
    # The collector's local state (collector.spool, collector.checkpoint): None picks one from
    # the store's URL (collector.checkpoint.state_dir_for: beside a SQLite file, else under
    # $XDG_STATE_HOME/kvscope/).
    state_dir: Path | None = Field(None, description="spool + roll-up checkpoints of collect")
    # collector.run: a roll-up checkpoint after every tick that closes windows and at least
    # this often (0: after every tick). Every tick's save costs ~1/3 of the collector's CPU
    # at a 10 s interval (benchmarks/bench_collector_vs_prometheus.py --checkpoint-every 0).
    checkpoint_s: float = Field(
        60.0, ge=0, le=86_400, description="most seconds between roll-up checkpoints of collect"
    )
    retention_s: float | None = Field(
        None, ge=MIN_RETENTION_S, description="collect deletes windows older than this, every hour"
    )
    # store.downsample: collect moves the 1-minute windows of days older than this into the
    # 5-minute tier, every hour (None: never). The plan reads 24 h by default, a week at most
    # for its fits' usual horizons, so a week of minutes is kept.
    downsample_s: float | None = Field(
        7 * 86_400.0,
        ge=MIN_RETENTION_S,
        description="collect moves days older than this into the 5-minute tier, every hour",
    )
    spool_max_bytes: int = Field(1 << 30, ge=0, description="disk bound of the spool")
    spool_memory_windows: int = Field(
        100_000, ge=0, description="bound of the spool in memory (when its disk refuses)"
    )
    # Where targets registered in the store may point although private/loopback (collect
    # --targets-from-store; the API's setting of the same name); collector.urlguard checks.
    allowed_target_networks: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="CIDRs, comma-separated in KVSCOPE_ALLOWED_TARGET_NETWORKS"
    )

    @field_validator("downsample_s", mode="before")
    @classmethod
    def _never(cls, value: Any) -> Any:
        """'never' (KVSCOPE_DOWNSAMPLE_S or --downsample-after): keep the 1-minute windows."""
        return None if isinstance(value, str) and value.strip() == "never" else value

    @field_validator("allowed_target_networks", mode="before")
    @classmethod
    def _split_networks(cls, value: Any) -> Any:
        return split_allowlist(value)


def get_settings(**overrides: object) -> Settings:
    """Build settings from the environment, then apply explicit overrides (CLI flags)."""
    clean = {k: v for k, v in overrides.items() if v is not None}
    return Settings(**clean)  # type: ignore[arg-type]
