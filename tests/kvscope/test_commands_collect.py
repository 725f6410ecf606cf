"""kvscope.commands.collect.collect_config: the flags checked once, each error naming its flag."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from collector.run_config import DirectConfig, PrometheusConfig
from collector.shard import Shard
from core.catalog import STORED_SIGNALS
from core.errors import ConfigError
from kvscope.commands.collect import CollectFlags, collect_config

DIRECT: dict[str, Any] = {"targets": Path("t.yaml"), "db": "sqlite://"}
PROM: dict[str, Any] = {"prometheus": "http://prom:9090", "db": "sqlite://"}


@pytest.fixture(autouse=True)
def _no_kvscope_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("KVSCOPE_")]:
        monkeypatch.delenv(key)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({}, "give exactly one of --targets FILE or --prometheus URL"),
        (DIRECT | PROM, "give exactly one of --targets FILE or --prometheus URL"),
        (PROM | {"targets_from_store": True}, "--targets-from-store is direct mode"),
        (DIRECT | {"allow_network": ("10.0.0.0/8",)}, "--allow-network applies to"),
        (PROM | {"file_sd": ("sd/*.json",)}, "--file-sd is direct mode: not with --prometheus"),
        (PROM | {"checkpoint_every": "10s"}, "--checkpoint-every is direct mode"),
        (PROM | {"shard": "0/2"}, "--shard splits scrape targets (direct mode)"),
        (DIRECT | {"keep": "most"}, "--keep must be one of used, all"),
        (DIRECT | {"shard": "2"}, "--shard must be I/N"),
        (DIRECT | {"shard": "2/2"}, "--shard 2/2: shard index must be 0..1"),
        (DIRECT | {"file_sd": ("sd/*.txt",)}, "--file-sd 'sd/*.txt' is not a file_sd file"),
        (PROM | {"source_label": "pod"}, "--source-label must be instance or job/instance"),
        (DIRECT | {"metrics_addr": "9464"}, "--metrics-addr: '9464' is not HOST:PORT"),
        (DIRECT | {"interval": "15x"}, "--interval: '15x' is not a duration"),
        (DIRECT | {"interval": "2h"}, "--interval (or KVSCOPE_SCRAPE_INTERVAL_S): "),
        (DIRECT | {"window": "0s"}, "--window: must be greater than 0"),
        (DIRECT | {"window": "2d"}, "--window (or KVSCOPE_WINDOW_S): "),
        (DIRECT | {"timeout": "soon"}, "--timeout: 'soon' is not a duration"),
        (DIRECT | {"retention": "30m"}, "--retention must be at least 1h, got '30m'"),
        (DIRECT | {"downsample_after": "5m"}, "--downsample-after must be at least 1h"),
        (DIRECT | {"checkpoint_every": "-1s"}, "--checkpoint-every: '-1s' is not a duration"),
        (DIRECT | {"checkpoint_every": "2d"}, "--checkpoint-every (or KVSCOPE_CHECKPOINT_S)"),
        (PROM | {"since": "-1h"}, "--since: '-1h' is not a duration"),
        (PROM | {"since": "0s"}, "--since: "),
        (PROM | {"settle": "later"}, "--settle: 'later' is not a duration"),
    ],
)
def test_collect_config_bad_flag_raises_config_error_naming_it(
    flags: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        collect_config(CollectFlags(**flags))
    assert str(info.value).startswith(message), str(info.value)


def test_collect_config_direct_mode_carries_the_flags_and_settings() -> None:
    config = collect_config(
        CollectFlags(
            **DIRECT, interval="5s", window="30s", timeout="2s", shard="1/3", keep="all",
            checkpoint_every="0", retention="30d", downsample_after="14d", once=True,
            since="not a duration",  # Prometheus mode's: not read in direct mode
            targets_from_store=True, allow_network=("10.0.0.0/8",), cluster="east",
        )
    )  # fmt: skip
    loop = config.loop
    assert isinstance(loop, DirectConfig)
    assert (loop.interval_s, loop.window_s, loop.timeout_s) == (5.0, 30.0, 2.0)
    assert (loop.shard, loop.keep, loop.checkpoint_s, loop.once) == (Shard(1, 3), None, 0.0, True)
    assert (config.retention_s, config.downsample_s) == (30 * 86_400.0, 14 * 86_400.0)
    assert config.allowed_networks == ("10.0.0.0/8",) and config.cluster == "east"
    assert config.keep_name == "all" and config.prometheus is None


def test_collect_config_prometheus_mode_reads_since_settle_and_the_settings_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KVSCOPE_CLUSTER", "prod")
    monkeypatch.setenv("KVSCOPE_SCRAPE_INTERVAL_S", "30")
    config = collect_config(
        CollectFlags(**PROM, since="2h", settle="0", source_label="job/instance")
    )
    loop = config.loop
    assert isinstance(loop, PrometheusConfig)
    assert (loop.cluster, loop.since_s, loop.settle_s, loop.interval_s) == ("prod", 7200, 0, 30)
    assert loop.keep == STORED_SIGNALS and config.source_from == "job/instance"
    assert config.default_cluster == "prod" and config.cluster is None
