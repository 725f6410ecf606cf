"""collector.run_config: the loops' configs refuse what would make a loop misbehave, when built."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest

from collector.run_config import BACKFILL_CHUNK_S, CollectConfig, DirectConfig, PrometheusConfig
from collector.shard import Shard
from core.catalog import STORED_SIGNALS
from core.errors import ConfigError

DIRECT: dict[str, Any] = {"interval_s": 15.0, "window_s": 60.0, "timeout_s": 10.0, "concurrency": 4,
          "max_body_bytes": 1 << 20}  # fmt: skip
PROM: dict[str, Any] = {"cluster": "c", "window_s": 60.0, "since_s": 3600.0, "interval_s": 15.0}


@pytest.mark.parametrize("interval", [0.0, -1.0, math.inf, -math.inf, math.nan])
def test_direct_config_bad_interval_raises_config_error(interval: float) -> None:
    with pytest.raises(ConfigError, match=r"^scrape interval must be > 0 seconds, got "):
        DirectConfig(**DIRECT | {"interval_s": interval})


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("interval_s", 0.0, "poll interval must be > 0 seconds, got 0.0"),
        ("interval_s", math.nan, "poll interval must be > 0 seconds, got nan"),
        ("interval_s", -15.0, "poll interval must be > 0 seconds, got -15.0"),
        ("since_s", 0.0, "--since must be > 0 seconds, got 0.0"),
        ("since_s", -3600.0, "--since must be > 0 seconds, got -3600.0"),
        ("since_s", math.inf, "--since must be > 0 seconds, got inf"),
    ],
)
def test_prometheus_config_bad_value_raises_config_error_naming_it(
    field: str, value: float, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        PrometheusConfig(**PROM | {field: value})
    assert str(info.value) == message


def test_loop_configs_defaults_are_the_loops_former_defaults() -> None:
    direct = DirectConfig(**DIRECT)
    assert (direct.once, direct.max_ticks, direct.checkpoint_s, direct.shard) == (
        False, None, 0.0, None,
    )  # fmt: skip
    assert direct.keep == STORED_SIGNALS
    prom = PrometheusConfig(**PROM)
    assert (prom.settle_s, prom.once, prom.max_polls, prom.chunk_s) == (
        30.0, False, None, BACKFILL_CHUNK_S,
    )  # fmt: skip
    assert prom.keep == STORED_SIGNALS


def test_loop_configs_are_frozen() -> None:
    direct = DirectConfig(**DIRECT | {"shard": Shard(0, 2)})
    with pytest.raises(dataclasses.FrozenInstanceError):
        direct.interval_s = 1.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        PrometheusConfig(**PROM).since_s = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("loop", "prometheus"),
    [(DirectConfig(**DIRECT), "http://prom:9090"), (PrometheusConfig(**PROM), None)],
)
def test_collect_config_loop_and_prometheus_url_disagree_raises(
    loop: DirectConfig | PrometheusConfig, prometheus: str | None
) -> None:
    with pytest.raises(ConfigError, match="a Prometheus loop needs a Prometheus URL"):
        CollectConfig(db="sqlite://", loop=loop, default_cluster="c", prometheus=prometheus)


def test_collect_config_either_mode_builds() -> None:
    common: dict[str, Any] = {"db": "sqlite://", "default_cluster": "c"}
    direct = CollectConfig(loop=DirectConfig(**DIRECT), targets=Path("t.yaml"), **common)
    prom = CollectConfig(loop=PrometheusConfig(**PROM), prometheus="http://p:9090", **common)
    assert isinstance(direct.loop, DirectConfig) and direct.prometheus is None
    assert isinstance(prom.loop, PrometheusConfig) and prom.source_from == "instance"
