"""Emitted deployment configs: version boundaries, exact flags, shell/JSON round trips."""

from __future__ import annotations

import json
import shlex

import pytest

from core.errors import ConfigError
from planner.deploy import configs
from planner.domain.costmodel import kv_bytes_per_token
from planner.domain.hardware import get_model

GIB = 1024**3


def _transfer_config(args: str) -> dict[str, object]:
    argv = shlex.split(args)
    assert argv[0] == "--kv-transfer-config" and len(argv) == 2
    value = json.loads(argv[1])
    assert isinstance(value, dict)
    return value


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.11.0", (0, 11, 0)),
        ("v0.14.1", (0, 14, 1)),
        ("0.12.0rc1", (0, 12, 0)),
        ("0.13.0+cu128", (0, 13, 0)),
        ("0.33", (0, 33, 0)),
    ],
)
def test_parse_vllm_version_known_spellings_parse(
    text: str, expected: tuple[int, int, int]
) -> None:
    assert configs.parse_vllm_version(text) == expected


@pytest.mark.parametrize("text", ["0.10.2", "0.34.0", "1.0.0", "latest", "0.x", "", "0.11.0.0"])
def test_parse_vllm_version_outside_or_malformed_raises(text: str) -> None:
    with pytest.raises(ConfigError, match="vllm_version"):
        configs.parse_vllm_version(text)


@pytest.mark.parametrize("version", ["0.14.0", "0.20.1", "0.33.0"])
def test_native_args_from_0_14_use_size_flags(version: str) -> None:
    argv = shlex.split(configs.vllm_native_offload_args(version, 64))
    assert argv == ["--kv-offloading-size", "64", "--kv-offloading-backend", "native"]


def test_native_args_fractional_size_keeps_fraction() -> None:
    argv = shlex.split(configs.vllm_native_offload_args("0.33.0", 12.5))
    assert argv[1] == "12.5"


@pytest.mark.parametrize("version", ["0.11.0", "0.12.0", "0.13.0"])
def test_native_args_before_0_14_emit_num_cpu_blocks(version: str) -> None:
    model = get_model("llama-3.1-70b")
    per_gpu = kv_bytes_per_token(model, 4)
    config = _transfer_config(
        configs.vllm_native_offload_args(
            version, 200, kv_bytes_per_token_per_gpu=per_gpu, tp=4, block_size=16
        )
    )
    assert config["kv_connector"] == "OffloadingConnector"
    assert config["kv_role"] == "kv_both"
    extra = config["kv_connector_extra_config"]
    assert isinstance(extra, dict)
    # Hand computation: 200 GiB over 4 workers, 16-token blocks, 70B bf16 KV / 4 per GPU.
    assert per_gpu == 2 * 80 * 2 * 128 * 2  # 81,920 B per token per GPU
    assert extra == {"block_size": 16, "num_cpu_blocks": (200 * GIB // 4) // (16 * 81_920)}


def test_native_args_before_0_14_without_kv_bytes_raises() -> None:
    with pytest.raises(ConfigError, match="kv_bytes_per_token_per_gpu"):
        configs.vllm_native_offload_args("0.13.0", 64)


def test_native_extra_config_from_0_14_is_total_bytes() -> None:
    assert configs.native_offload_extra_config("0.14.0", 8, tp=2) == {"cpu_bytes_to_use": 8 * GIB}


@pytest.mark.parametrize("cpu_gib", [0, -1, float("nan"), True])
def test_native_args_bad_size_raises(cpu_gib: float) -> None:
    with pytest.raises(ConfigError, match="cpu_gib"):
        configs.vllm_native_offload_args("0.33.0", cpu_gib)


def test_native_args_too_small_for_one_block_raises() -> None:
    with pytest.raises(ConfigError, match="less than one"):
        configs.vllm_native_offload_args(
            "0.11.0", 1e-6, kv_bytes_per_token_per_gpu=131_072, block_size=16
        )


def test_lmcache_mp_args_round_trip_has_module_path_and_tcp_host() -> None:
    config = _transfer_config(configs.vllm_lmcache_mp_args("0.14.0", "10.0.0.7", 5555))
    assert config == {
        "kv_connector": "LMCacheMPConnector",
        "kv_connector_module_path": "lmcache.integration.vllm.lmcache_mp_connector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"lmcache.mp.host": "tcp://10.0.0.7", "lmcache.mp.port": 5555},
    }


def test_lmcache_mp_args_keeps_explicit_transport_and_isolated_ipc() -> None:
    config = _transfer_config(
        configs.vllm_lmcache_mp_args("0.33.0", "grpc://node1", 6000, isolated_ipc=True)
    )
    assert config["kv_connector_extra_config"] == {
        "lmcache.mp.host": "grpc://node1",
        "lmcache.mp.port": 6000,
        "lmcache.mp.isolated_ipc": True,
    }


def test_lmcache_mp_args_multi_server_divisible_world_size_lists_urls() -> None:
    config = _transfer_config(
        configs.vllm_lmcache_mp_args(
            "0.33.0", server_urls=["host1:6667", "tcp://host2:6667"], world_size=4
        )
    )
    extra = config["kv_connector_extra_config"]
    assert extra == {"lmcache.mp.server_urls": "tcp://host1:6667,tcp://host2:6667"}


def test_lmcache_mp_args_multi_server_indivisible_world_size_raises() -> None:
    with pytest.raises(ConfigError, match="divisible"):
        configs.vllm_lmcache_mp_args("0.33.0", server_urls=["a:1", "b:1", "c:1"], world_size=4)


@pytest.mark.parametrize(("host", "port"), [("", 5555), ("h", 0), ("h", 70000)])
def test_lmcache_mp_args_bad_endpoint_raises(host: str, port: int) -> None:
    with pytest.raises(ConfigError):
        configs.vllm_lmcache_mp_args("0.33.0", host, port)


def test_lmcache_mp_args_old_version_raises() -> None:
    with pytest.raises(ConfigError, match="outside"):
        configs.vllm_lmcache_mp_args("0.10.0", "h")


@pytest.mark.parametrize(
    ("version", "key"), [("0.12.0", "num_cpu_blocks"), ("0.14.0", "cpu_bytes_to_use")]
)
def test_both_args_multiconnector_lists_native_first(version: str, key: str) -> None:
    config = _transfer_config(
        configs.vllm_both_args(version, 32, "node1", kv_bytes_per_token_per_gpu=131_072, tp=1)
    )
    assert config["kv_connector"] == "MultiConnector"
    extra = config["kv_connector_extra_config"]
    assert isinstance(extra, dict)
    native, lmcache = extra["connectors"]
    assert native["kv_connector"] == "OffloadingConnector"
    assert key in native["kv_connector_extra_config"]
    assert lmcache["kv_connector"] == "LMCacheMPConnector"
    assert lmcache["kv_connector_extra_config"]["lmcache.mp.host"] == "tcp://node1"


def test_lmcache_server_command_round_trip_exact_flags() -> None:
    spec = configs.l2_adapter_json("fs", {"base_path": "/mnt/nvme/l2 cache"})
    argv = shlex.split(
        configs.lmcache_server_command(
            48,
            host="0.0.0.0",
            http_host="0.0.0.0",
            eviction_trigger_watermark=0.85,
            l2_adapters=[spec],
            isolated_ipc=True,
        )
    )
    assert argv[:2] == ["lmcache", "server"]
    flags = dict(zip(argv[2::2], argv[3::2], strict=False))
    assert flags["--l1-size-gb"] == "48"
    assert flags["--eviction-policy"] == "LRU"
    assert flags["--host"] == "0.0.0.0"
    assert flags["--port"] == "5555"
    assert flags["--http-port"] == "8080"
    assert flags["--http-host"] == "0.0.0.0"
    assert flags["--chunk-size"] == "256"
    assert flags["--eviction-trigger-watermark"] == "0.85"
    assert "--isolated-ipc" in argv
    l2 = json.loads(argv[argv.index("--l2-adapter") + 1])
    assert l2 == {"type": "fs", "base_path": "/mnt/nvme/l2 cache"}


def test_lmcache_server_command_defaults_omit_hosts() -> None:
    argv = shlex.split(configs.lmcache_server_command(10))
    assert "--host" not in argv and "--http-host" not in argv and "--l2-adapter" not in argv


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"l1_size_gb": 0}, "l1_size_gb"),
        ({"l1_size_gb": 8, "eviction_policy": "FIFO"}, "eviction_policy"),
        ({"l1_size_gb": 8, "eviction_trigger_watermark": 1.5}, "watermark"),
        ({"l1_size_gb": 8, "port": 0}, "port"),
        ({"l1_size_gb": 8, "l2_adapters": ["{not json"]}, "not JSON"),
        ({"l1_size_gb": 8, "l2_adapters": ['{"base_path": "/x"}']}, "type"),
    ],
)
def test_lmcache_server_command_bad_input_raises(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        configs.lmcache_server_command(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "fields", "expected_type"),
    [
        ("fs", {"base_path": "/data/l2"}, "fs"),
        (
            "mooncake",
            {
                "master_server_addr": "m:50051",
                "metadata_server": "http://m:8080/metadata",
                "local_hostname": "n1",
                "protocol": "rdma",
            },
            "mooncake_store",
        ),
        ("resp", {"host": "valkey", "port": 6379, "num_workers": 8}, "resp"),
        ("redis", {"host": "valkey", "port": 6379}, "resp"),
        ("valkey", {"startup_nodes": "a:6379,b:6379", "cluster_mode": True}, "valkey"),
        ("s3", {"s3_endpoint": "s3://bucket", "s3_region": "us-east-1"}, "s3"),
    ],
)
def test_l2_adapter_json_round_trip(
    kind: str, fields: dict[str, object], expected_type: str
) -> None:
    spec = json.loads(configs.l2_adapter_json(kind, fields))
    assert spec == {"type": expected_type, **fields}


def test_l2_adapter_json_eviction_needs_capacity_and_round_trips() -> None:
    fields = {"s3_endpoint": "s3://b", "s3_region": "eu-west-1", "max_capacity_gb": 500}
    spec = json.loads(configs.l2_adapter_json("s3", fields, eviction_watermark=0.85))
    assert spec["eviction"] == {
        "eviction_policy": "LRU",
        "trigger_watermark": 0.85,
        "eviction_ratio": 0.2,
    }
    with pytest.raises(ConfigError, match="max_capacity_gb"):
        configs.l2_adapter_json("fs", {"base_path": "/x"}, eviction_watermark=0.8)


@pytest.mark.parametrize(
    ("kind", "fields", "match"),
    [
        ("nfs", {"base_path": "/x"}, "unknown L2 adapter"),
        ("fs", {}, "missing key 'base_path'"),
        ("fs", {"base_path": ""}, "must not be empty"),
        ("fs", {"base_path": "/x", "size": 3}, "unknown key 'size'"),
        ("resp", {"host": "h", "port": "6379"}, "wrong type"),
        ("resp", {"host": "h", "port": True}, "wrong type"),
        ("s3", {"s3_endpoint": "s3://b"}, "missing key 's3_region'"),
    ],
)
def test_l2_adapter_json_bad_fields_raise(kind: str, fields: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        configs.l2_adapter_json(kind, fields)
