"""Ready-to-deploy command lines for the offload mode kvscope recommends.

Every function returns an exact shell fragment (arguments joined with shlex.join, JSON values
made with json.dumps), so `shlex.split` and `json.loads` give the values back. Flag names are
checked against the sources of vLLM 0.11.0–0.33.0 and LMCache 0.5.6 (cited per function and
constant; vLLM's native-offload flags by version at OFFLOADING_SIZE_FLAG_FROM); versions
outside 0.11–0.33 raise ConfigError rather than guess.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Mapping, Sequence

from core.errors import ConfigError

SUPPORTED_VLLM = ((0, 11), (0, 33))
# vLLM native CPU offload by version (vllm/config/cache.py, vllm/config/vllm.py,
# vllm/v1/kv_offload/cpu.py of each release's sdist):
# - 0.11.0: only --kv-transfer-config with OffloadingConnector and
#   kv_connector_extra_config.num_cpu_blocks (blocks per worker of block_size tokens);
# - 0.11.1–0.13.x: --kv-offloading-size/--kv-offloading-backend exist, but the native backend
#   fills in num_cpu_blocks: 0 and CPUOffloadingSpec then raises "num_cpu_blocks must be
#   specified", so the JSON with an explicit num_cpu_blocks is emitted;
# - 0.14.0+: --kv-offloading-size GiB (total across TP·PP ranks) turns native offload on
#   (--kv-offloading-backend defaults to native from 0.14.0; spelled out anyway), and
#   kv_offloading_size -> cpu_bytes_to_use = size · 2**30 works for the native backend.
OFFLOADING_SIZE_FLAG_FROM = (0, 14)
GIB = 1024**3
# vLLM's default KV block size on CUDA (16 tokens; vllm/config/cache.py).
DEFAULT_BLOCK_SIZE = 16
# LMCache MP defaults (lmcache/v1/multiprocess/config.py, distributed/config.py, 0.5.6).
LMCACHE_PORT = 5555
LMCACHE_HTTP_PORT = 8080
LMCACHE_CHUNK_SIZE = 256
LMCACHE_WATERMARK = 0.8
LMCACHE_EVICTION_POLICIES = ("LRU", "ARC", "noop")
LMCACHE_MP_MODULE = "lmcache.integration.vllm.lmcache_mp_connector"

_VERSION = re.compile(
    r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:(?:rc|post|dev|\.dev|\.post|\+|-)[0-9A-Za-z.+-]*)?$"
)


def parse_vllm_version(text: str) -> tuple[int, int, int]:
    """(major, minor, patch) of "0.11.0", "v0.14.1", "0.12.0rc1", "0.13.0+cu128"; ConfigError
    for anything else or for versions outside the supported 0.11–0.33."""
    match = _VERSION.match(str(text).strip())
    if not match:
        raise ConfigError(f"vllm_version {text!r} is not a version like '0.14.0'")
    version = (int(match[1]), int(match[2]), int(match[3] or 0))
    low, high = SUPPORTED_VLLM
    if not low <= version[:2] <= high:
        raise ConfigError(
            f"vllm_version {text!r} is outside the supported range "
            f"{low[0]}.{low[1]}–{high[0]}.{high[1]}: kvscope does not guess flag names"
        )
    return version


def _positive(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    if value <= 0:
        raise ConfigError(f"{name} must be > 0, got {value!r}")
    return float(value)


def _port(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise ConfigError(f"{name} must be a TCP port 1–65535, got {value!r}")
    return value


def _count(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def _number_text(value: float) -> str:
    """12.0 -> "12", 12.5 -> "12.5" (flags parse floats; integral sizes read better)."""
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def _json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=False)


def native_offload_extra_config(
    vllm_version: str,
    cpu_gib: float,
    *,
    kv_bytes_per_token_per_gpu: float | None = None,
    tp: int = 1,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> dict[str, object]:
    """The OffloadingConnector's kv_connector_extra_config for `cpu_gib` GiB in total.

    From 0.14: {"cpu_bytes_to_use": total bytes} (CPUOffloadingSpec divides by the world
    size itself). Before: {"block_size": B, "num_cpu_blocks": N} with N blocks per worker,
    N = floor(total bytes / tp / (B · KV bytes per token on one GPU)); that needs
    kv_bytes_per_token_per_gpu (planner.domain.costmodel.kv_bytes_per_token(model, tp)).
    """
    version = parse_vllm_version(vllm_version)
    total = _positive(cpu_gib, "cpu_gib") * GIB
    _count(tp, "tp")
    _count(block_size, "block_size")
    if version[:2] >= OFFLOADING_SIZE_FLAG_FROM:
        return {"cpu_bytes_to_use": int(total)}
    if kv_bytes_per_token_per_gpu is None:
        raise ConfigError(
            f"vLLM {vllm_version} sizes the CPU cache in blocks (num_cpu_blocks): "
            "kv_bytes_per_token_per_gpu is required"
        )
    per_token = _positive(kv_bytes_per_token_per_gpu, "kv_bytes_per_token_per_gpu")
    blocks = int(total / tp // (block_size * per_token))
    if blocks < 1:
        raise ConfigError(f"cpu_gib={cpu_gib} holds less than one {block_size}-token block")
    return {"block_size": block_size, "num_cpu_blocks": blocks}


def vllm_native_offload_args(
    vllm_version: str,
    cpu_gib: float,
    *,
    kv_bytes_per_token_per_gpu: float | None = None,
    tp: int = 1,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> str:
    """`vllm serve` arguments for native CPU offload of `cpu_gib` GiB (total over TP ranks)."""
    version = parse_vllm_version(vllm_version)
    extra = native_offload_extra_config(
        vllm_version,
        cpu_gib,
        kv_bytes_per_token_per_gpu=kv_bytes_per_token_per_gpu,
        tp=tp,
        block_size=block_size,
    )
    if version[:2] >= OFFLOADING_SIZE_FLAG_FROM:
        size = _number_text(cpu_gib)
        return shlex.join(["--kv-offloading-size", size, "--kv-offloading-backend", "native"])
    config = {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }
    return shlex.join(["--kv-transfer-config", _json(config)])


def _server_url(host: str, port: int) -> str:
    host = str(host).strip()
    if not host:
        raise ConfigError("LMCache host must be a non-empty host name or URL")
    # LMCacheMPConnector reads lmcache.mp.host as "<transport>://<host>" (default
    # "tcp://localhost"; vllm lmcache_mp_connector.py); a bare host gets tcp://.
    return host if "://" in host else f"tcp://{host}"


def lmcache_connector_config(
    vllm_version: str,
    host: str = "localhost",
    port: int = LMCACHE_PORT,
    *,
    server_urls: Sequence[str] = (),
    world_size: int = 1,
    isolated_ipc: bool = False,
) -> dict[str, object]:
    """The --kv-transfer-config object for LMCacheMPConnector (LMCache docs mp/configuration).

    kv_connector_module_path is always set: vLLM 0.11.0 has no in-tree LMCacheMPConnector,
    0.11.1–0.19 prefer their in-tree copy, and from 0.20 the module path takes priority
    (vllm/distributed/kv_transfer/kv_connector/factory.py). server_urls: one LMCache server
    per group of ranks; vLLM's world size must be divisible by their number (TP only).
    """
    parse_vllm_version(vllm_version)
    _port(port, "port")
    _count(world_size, "world_size")
    extra: dict[str, object] = {}
    if server_urls:
        urls = [str(u).strip() for u in server_urls]
        if any(not u for u in urls):
            raise ConfigError("server_urls must not contain empty entries")
        if world_size % len(urls):
            raise ConfigError(
                f"world size {world_size} is not divisible by {len(urls)} LMCache servers "
                "(lmcache.mp.server_urls shards ranks into equal contiguous blocks)"
            )
        extra["lmcache.mp.server_urls"] = ",".join(u if "://" in u else f"tcp://{u}" for u in urls)
    else:
        extra["lmcache.mp.host"] = _server_url(host, port)
        extra["lmcache.mp.port"] = port
    if isolated_ipc:
        extra["lmcache.mp.isolated_ipc"] = True
    return {
        "kv_connector": "LMCacheMPConnector",
        "kv_connector_module_path": LMCACHE_MP_MODULE,
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }


def vllm_lmcache_mp_args(
    vllm_version: str,
    host: str = "localhost",
    port: int = LMCACHE_PORT,
    *,
    server_urls: Sequence[str] = (),
    world_size: int = 1,
    isolated_ipc: bool = False,
) -> str:
    """`vllm serve` arguments connecting the engine to an LMCache MP server."""
    config = lmcache_connector_config(
        vllm_version,
        host,
        port,
        server_urls=server_urls,
        world_size=world_size,
        isolated_ipc=isolated_ipc,
    )
    return shlex.join(["--kv-transfer-config", _json(config)])


def vllm_both_args(
    vllm_version: str,
    cpu_gib: float,
    host: str = "localhost",
    port: int = LMCACHE_PORT,
    *,
    kv_bytes_per_token_per_gpu: float | None = None,
    tp: int = 1,
    isolated_ipc: bool = False,
) -> str:
    """Native offload and LMCache together through vLLM's MultiConnector.

    MultiConnector loads from the first child that has the tokens and saves to all of them
    (vllm multi_connector.py, 0.11–0.33), so the engine-local DRAM copy is listed first.
    """
    native = {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": native_offload_extra_config(
            vllm_version, cpu_gib, kv_bytes_per_token_per_gpu=kv_bytes_per_token_per_gpu, tp=tp
        ),
    }
    lmcache = lmcache_connector_config(
        vllm_version, host, port, world_size=tp, isolated_ipc=isolated_ipc
    )
    config = {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"connectors": [native, lmcache]},
    }
    return shlex.join(["--kv-transfer-config", _json(config)])


def lmcache_server_command(  # noqa: PLR0913 - one parameter per lmcache_server flag written
    l1_size_gb: float,
    *,
    host: str | None = None,
    port: int = LMCACHE_PORT,
    http_port: int = LMCACHE_HTTP_PORT,
    http_host: str | None = None,
    chunk_size: int = LMCACHE_CHUNK_SIZE,
    eviction_policy: str = "LRU",
    eviction_trigger_watermark: float = LMCACHE_WATERMARK,
    l2_adapters: Sequence[str] = (),
    isolated_ipc: bool = False,
) -> str:
    """The `lmcache server` command line (LMCache 0.5.6 MP server flags).

    --l1-size-gb is GiB (LMCache multiplies by 1 << 30). --host / --http-host default to
    localhost / 127.0.0.1 in LMCache: pass "0.0.0.0" (request server) or a node IP when vLLM
    runs in another network namespace or Prometheus scrapes /metrics from elsewhere.
    """
    size = _positive(l1_size_gb, "l1_size_gb")
    _port(port, "port")
    _port(http_port, "http_port")
    _count(chunk_size, "chunk_size")
    if eviction_policy not in LMCACHE_EVICTION_POLICIES:
        raise ConfigError(
            f"eviction_policy must be one of {', '.join(LMCACHE_EVICTION_POLICIES)}, "
            f"got {eviction_policy!r}"
        )
    if not 0 < eviction_trigger_watermark <= 1:
        raise ConfigError(
            f"eviction_trigger_watermark must be in (0, 1], got {eviction_trigger_watermark!r}"
        )
    args = ["lmcache", "server", "--l1-size-gb", _number_text(size)]
    args += ["--eviction-policy", eviction_policy]
    if host:
        args += ["--host", host]
    args += ["--port", str(port), "--http-port", str(http_port)]
    if http_host:
        args += ["--http-host", http_host]
    args += ["--chunk-size", str(chunk_size)]
    args += ["--eviction-trigger-watermark", _number_text(eviction_trigger_watermark)]
    if isolated_ipc:
        args.append("--isolated-ipc")
    for spec in l2_adapters:
        try:
            parsed = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"l2 adapter spec is not JSON: {exc.msg}: {spec!r}") from exc
        if not isinstance(parsed, dict) or "type" not in parsed:
            raise ConfigError(f"l2 adapter spec needs a JSON object with 'type': {spec!r}")
        args += ["--l2-adapter", spec]
    return shlex.join(args)


# --l2-adapter schemas (LMCache 0.5.6 l2_adapters/*_l2_adapter.py from_dict): required and
# optional keys with their types. mooncake_store forwards every other key to Mooncake's
# setup_internal() as a string, so its optional keys are the documented common ones.
_Schema = tuple[Mapping[str, type | tuple[type, ...]], Mapping[str, type | tuple[type, ...]]]
_NUM = (int, float)
L2_SCHEMAS: Mapping[str, _Schema] = {
    "fs": ({"base_path": str}, {"relative_tmp_dir": str, "use_odirect": bool}),
    "mooncake_store": (
        {"master_server_addr": str, "metadata_server": str, "local_hostname": str},
        {
            "protocol": str,
            "global_segment_size": (str, int),
            "local_buffer_size": (str, int),
            "num_workers": int,
        },
    ),
    "resp": ({"host": str, "port": int}, {"num_workers": int, "max_capacity_gb": _NUM}),
    "valkey": (
        {"startup_nodes": str},
        {"cluster_mode": bool, "num_workers": int, "max_capacity_gb": _NUM, "tls_enable": bool},
    ),
    "s3": (
        {"s3_endpoint": str, "s3_region": str},
        {"max_capacity_gb": _NUM, "s3_num_io_threads": int, "disable_tls": bool},
    ),
}
_L2_ALIASES = {"mooncake": "mooncake_store", "redis": "resp"}


def l2_adapter_json(
    kind: str, fields: Mapping[str, object], *, eviction_watermark: float | None = None
) -> str:
    """One `--l2-adapter` JSON object of type `kind` (fs, mooncake_store, resp, valkey, s3).

    eviction_watermark adds LMCache's per-adapter "eviction" sub-object (LRU, ratio 0.2);
    it needs max_capacity_gb > 0 (resp/valkey/s3), since usage is measured against it.
    """
    kind = _L2_ALIASES.get(kind, kind)
    if kind not in L2_SCHEMAS:
        raise ConfigError(f"unknown L2 adapter {kind!r}; known: {', '.join(sorted(L2_SCHEMAS))}")
    required, optional = L2_SCHEMAS[kind]
    for key, value in fields.items():
        expected = required.get(key) or optional.get(key)
        if expected is None:
            allowed = ", ".join([*required, *optional])
            raise ConfigError(f"L2 adapter {kind}: unknown key {key!r} (allowed: {allowed})")
        if (isinstance(value, bool) and expected is not bool) or not isinstance(value, expected):
            raise ConfigError(f"L2 adapter {kind}: key {key!r} has the wrong type: {value!r}")
        if isinstance(value, str) and not value.strip():
            raise ConfigError(f"L2 adapter {kind}: key {key!r} must not be empty")
    missing = [key for key in required if key not in fields]
    if missing:
        raise ConfigError(f"L2 adapter {kind}: missing key {missing[0]!r}")
    spec: dict[str, object] = {"type": kind, **fields}
    if eviction_watermark is not None:
        if not 0 < eviction_watermark <= 1:
            raise ConfigError(f"eviction_watermark must be in (0, 1], got {eviction_watermark!r}")
        capacity = fields.get("max_capacity_gb")
        if not isinstance(capacity, int | float) or capacity <= 0:
            raise ConfigError(f"L2 adapter {kind}: eviction needs max_capacity_gb > 0")
        spec["eviction"] = {
            "eviction_policy": "LRU",
            "trigger_watermark": eviction_watermark,
            "eviction_ratio": 0.2,
        }
    return _json(spec)
