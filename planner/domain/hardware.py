"""The hardware catalogue: GPUs, models and storage tiers, each number with its source.

The built-in entries live in planner/domain/data/hardware.yaml (loaded once through
importlib.resources); users add or override entries with a YAML file of the same schema
(`load_catalog(extra_yaml)`) or build a model from a Hugging Face config.json
(`model_from_hf_config`). All quantities are SI: bytes, bytes/s, FLOP/s, seconds.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from core.errors import ConfigError

GB = 1e9  # decimal gigabyte: datasheet bandwidths are decimal (3.35 TB/s = 3.35e12 B/s)
GIB = 1024**3


@dataclass(frozen=True, slots=True)
class GPU:
    name: str
    hbm_bytes: float
    hbm_bandwidth_Bps: float  # noqa: N815 - unit suffix
    bf16_flops: float  # dense tensor-core peak, FLOP/s
    fp8_flops: float
    pcie_Bps: float  # noqa: N815 - one way, measured pinned DMA
    nvlink_Bps: float  # noqa: N815 - per direction; 0 = no NVLink (all-reduce over PCIe)
    source: str


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    params: float
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    weight_bytes_per_param: float  # 2 bf16, 1 fp8
    kv_bytes_per_elem: float  # 2 bf16 KV, 1 fp8 KV (FP8 weights keep bf16 KV by default)
    source: str
    # Context length vLLM derives as max_model_len (config.json max_position_embeddings);
    # None = unknown. Added after `source` so the ten-field constructor keeps working.
    max_context: int | None = None


@dataclass(frozen=True, slots=True)
class Tier:
    name: str
    read_Bps: float  # noqa: N815 - nominal read bandwidth
    write_Bps: float  # noqa: N815
    latency_s: float  # per object (seek / RPC / first byte)
    source: str
    # Optional spreads (low, high); default to the nominal value. Added after `source` so the
    # five-field constructor keeps working.
    read_Bps_range: tuple[float, float] | None = None  # noqa: N815
    latency_s_range: tuple[float, float] | None = None
    concurrency: int = 1  # objects in flight: latency is paid ceil(objects / concurrency) times
    per_gpu: bool = False  # bandwidth is per GPU link (host DRAM over PCIe): scales with TP

    @property
    def read_bounds(self) -> tuple[float, float]:
        return self.read_Bps_range or (self.read_Bps, self.read_Bps)

    @property
    def latency_bounds(self) -> tuple[float, float]:
        return self.latency_s_range or (self.latency_s, self.latency_s)


@dataclass(frozen=True, slots=True)
class Catalog:
    """Name -> entry maps (canonical lowercase names) plus alias -> canonical name."""

    gpus: Mapping[str, GPU]
    models: Mapping[str, Model]
    tiers: Mapping[str, Tier]
    aliases: Mapping[str, str] = field(default_factory=dict)

    def gpu(self, name: str) -> GPU:
        return self.gpus[_resolve(name, self.gpus, self.aliases, "GPU")]

    def model(self, name: str) -> Model:
        return self.models[_resolve(name, self.models, self.aliases, "model")]

    def tier(self, name: str) -> Tier:
        return self.tiers[_resolve(name, self.tiers, self.aliases, "tier")]


_GPU_KEYS = {
    "hbm_gib": ("hbm_bytes", GIB),
    "hbm_bandwidth_gbps": ("hbm_bandwidth_Bps", GB),
    "bf16_tflops": ("bf16_flops", 1e12),
    "fp8_tflops": ("fp8_flops", 1e12),
    "pcie_gbps": ("pcie_Bps", GB),
    "nvlink_gbps": ("nvlink_Bps", GB),
}
_MODEL_INT_KEYS = ("layers", "hidden", "q_heads", "kv_heads", "head_dim")
_MODEL_FLOAT_KEYS = ("params", "weight_bytes_per_param", "kv_bytes_per_elem")
_TIER_KEYS = {"read_gbps": ("read_Bps", GB), "write_gbps": ("write_Bps", GB)}
_TIER_OPTIONAL = {"read_gbps_range", "latency_ms_range", "concurrency", "per_gpu", "aliases"}


def normalize_name(name: str) -> str:
    """Lowercase, drop an org prefix ("meta-llama/"), "meta-" and "-instruct"/"-chat"."""
    text = name.strip().lower().replace("_", "-")
    text = text.rsplit("/", 1)[-1]
    text = text.removeprefix("meta-")
    return re.sub(r"-(instruct|chat)(?=-|$)", "", text)


def _resolve(name: str, table: Mapping[str, object], aliases: Mapping[str, str], what: str) -> str:
    for key in (name.strip().lower(), normalize_name(name)):
        if key in table:
            return key
        if key in aliases and aliases[key] in table:
            return aliases[key]
    known = ", ".join(sorted(table))
    raise ConfigError(f"unknown {what} {name!r}; known: {known}")


def _number(value: object, key: str, where: str, *, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{where}: key {key!r} must be a number, got {value!r}")
    if positive and value <= 0:
        raise ConfigError(f"{where}: key {key!r} must be > 0, got {value!r}")
    if not positive and value < 0:
        raise ConfigError(f"{where}: key {key!r} must be >= 0, got {value!r}")
    return float(value)


def _check_keys(entry: object, allowed: set[str], required: set[str], where: str) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(entry).__name__}")
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (allowed: {sorted(allowed)})")
    missing = sorted(required - set(entry))
    if missing:
        raise ConfigError(f"{where}: missing key {missing[0]!r}")
    if not isinstance(entry.get("source"), str) or not entry["source"].strip():
        raise ConfigError(f"{where}: key 'source' must be a non-empty citation string")
    return entry


def _gpu_from(name: str, entry: object, where: str) -> GPU:
    e = _check_keys(entry, {*_GPU_KEYS, "source", "aliases"}, {*_GPU_KEYS, "source"}, where)
    values = {
        attr: _number(e[key], key, where, positive=key != "nvlink_gbps") * scale
        for key, (attr, scale) in _GPU_KEYS.items()
    }
    return GPU(name=name, source=e["source"].strip(), **values)


def _pair(value: object, key: str, where: str, scale: float) -> tuple[float, float]:
    if not isinstance(value, list) or len(value) != 2:
        raise ConfigError(f"{where}: key {key!r} must be [low, high], got {value!r}")
    low, high = (_number(v, key, where, positive=False) * scale for v in value)
    if low > high:
        raise ConfigError(f"{where}: key {key!r} has low > high: {value!r}")
    return (low, high)


def _tier_from(name: str, entry: object, where: str) -> Tier:
    required = {*_TIER_KEYS, "latency_ms", "source"}
    e = _check_keys(entry, required | _TIER_OPTIONAL, required, where)
    read = _number(e["read_gbps"], "read_gbps", where) * GB
    write = _number(e["write_gbps"], "write_gbps", where) * GB
    latency = _number(e["latency_ms"], "latency_ms", where, positive=False) / 1e3
    read_range = latency_range = None
    if "read_gbps_range" in e:
        read_range = _pair(e["read_gbps_range"], "read_gbps_range", where, GB)
        if read_range[0] <= 0:
            raise ConfigError(f"{where}: key 'read_gbps_range' must be > 0")
    if "latency_ms_range" in e:
        latency_range = _pair(e["latency_ms_range"], "latency_ms_range", where, 1e-3)
    concurrency = e.get("concurrency", 1)
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigError(f"{where}: key 'concurrency' must be an integer >= 1")
    per_gpu = e.get("per_gpu", False)
    if not isinstance(per_gpu, bool):
        raise ConfigError(f"{where}: key 'per_gpu' must be true or false")
    return Tier(
        name,
        read,
        write,
        latency,
        e["source"].strip(),
        read_range,
        latency_range,
        concurrency,
        per_gpu,
    )


def _model_from(name: str, entry: object, where: str, base_dir: Path | None) -> Model:
    if isinstance(entry, dict) and "hf_config" in entry:
        allowed = {"hf_config", "source", "aliases", "kv_bytes_per_elem"}
        e = _check_keys(entry, allowed, {"hf_config", "source"}, where)
        path = Path(str(e["hf_config"]))
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        try:
            model = model_from_hf_config(path, name)
        except ConfigError as exc:
            raise ConfigError(f"{where}: hf_config: {exc}") from exc
        if "kv_bytes_per_elem" in e:
            kv = _number(e["kv_bytes_per_elem"], "kv_bytes_per_elem", where)
            model = dataclasses.replace(model, kv_bytes_per_elem=kv)
        return dataclasses.replace(model, source=f"{e['source'].strip()} ({model.source})")
    keys = {*_MODEL_INT_KEYS, *_MODEL_FLOAT_KEYS, "source"}
    e = _check_keys(entry, keys | {"aliases", "max_context"}, keys, where)
    ints: dict[str, int] = {}
    for key in (*_MODEL_INT_KEYS, "max_context"):
        if key not in e:
            continue
        value = e[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{where}: key {key!r} must be an integer >= 1, got {value!r}")
        ints[key] = value
    return Model(
        name=name,
        params=_number(e["params"], "params", where),
        layers=ints["layers"],
        hidden=ints["hidden"],
        q_heads=ints["q_heads"],
        kv_heads=ints["kv_heads"],
        head_dim=ints["head_dim"],
        weight_bytes_per_param=_number(
            e["weight_bytes_per_param"], "weight_bytes_per_param", where
        ),
        kv_bytes_per_elem=_number(e["kv_bytes_per_elem"], "kv_bytes_per_elem", where),
        source=e["source"].strip(),
        max_context=ints.get("max_context"),
    )


def fp8_variant(model: Model) -> Model:
    """FP8 weights (W8A8 checkpoints such as RedHatAI/…-FP8): 1 byte/param, KV stays bf16."""
    return dataclasses.replace(
        model,
        name=f"{model.name}-fp8",
        weight_bytes_per_param=1.0,
        source=f"{model.source} FP8 variant: 1 byte/param weights (embeddings and lm_head "
        "stay bf16 in these checkpoints, ~3 % more bytes for 70B: ignored), KV cache stays "
        "bf16 unless vLLM runs with --kv-cache-dtype fp8.",
    )


def with_kv_dtype(model: Model, kv_dtype: str) -> Model:
    """The same model with its KV cache in `kv_dtype` ("bf16"/"fp16"/"fp8"/"auto")."""
    sizes = {"bf16": 2.0, "bfloat16": 2.0, "fp16": 2.0, "float16": 2.0, "fp8": 1.0}
    if kv_dtype == "auto":
        return model
    if kv_dtype not in sizes:
        raise ConfigError(f"unknown KV dtype {kv_dtype!r}; known: auto, {', '.join(sizes)}")
    return dataclasses.replace(model, kv_bytes_per_elem=sizes[kv_dtype])


def _parse_catalog(doc: object, where: str, base: Catalog | None, base_dir: Path | None) -> Catalog:  # noqa: PLR0912 - one branch per catalogue key, each with its own error
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: top level must be a mapping with gpus/models/tiers")
    unknown = sorted(set(doc) - {"gpus", "models", "tiers"})
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (allowed: gpus, models, tiers)")
    gpus = dict(base.gpus) if base else {}
    models = dict(base.models) if base else {}
    tiers = dict(base.tiers) if base else {}
    aliases = dict(base.aliases) if base else {}
    for section in ("gpus", "models", "tiers"):
        entries = doc.get(section) or {}
        if not isinstance(entries, dict):
            raise ConfigError(f"{where}: key {section!r} must map names to entries")
        for raw_name, entry in entries.items():
            name = str(raw_name).strip().lower()
            at = f"{where}: {section}.{raw_name}"
            if section == "gpus":
                gpus[name] = _gpu_from(name, entry, at)
            elif section == "models":
                models[name] = _model_from(name, entry, at, base_dir)
                if models[name].weight_bytes_per_param >= 2 and f"{name}-fp8" not in entries:
                    models[f"{name}-fp8"] = fp8_variant(models[name])
            else:
                tiers[name] = _tier_from(name, entry, at)
            alias_list = entry.get("aliases") or []  # entry is a validated mapping here
            if not isinstance(alias_list, list):
                raise ConfigError(f"{at}: key 'aliases' must be a list of names")
            for alias in alias_list:
                aliases[normalize_name(str(alias))] = name
                if section == "models":
                    aliases[normalize_name(str(alias)) + "-fp8"] = f"{name}-fp8"
    return Catalog(gpus=gpus, models=models, tiers=tiers, aliases=aliases)


@functools.cache
def builtin_catalog() -> Catalog:
    """The shipped catalogue (planner/domain/data/hardware.yaml), parsed once."""
    text = (
        resources.files("planner.domain.data").joinpath("hardware.yaml").read_text(encoding="utf-8")
    )
    return _parse_catalog(yaml.safe_load(text), "planner/domain/data/hardware.yaml", None, None)


def load_catalog(extra_yaml: Path | None = None) -> Catalog:
    """The built-in catalogue plus (overriding by name) the entries of `extra_yaml`."""
    if extra_yaml is None:
        return builtin_catalog()
    path = Path(extra_yaml)
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read catalogue: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    return _parse_catalog(doc, str(path), builtin_catalog(), path.parent)


def get_gpu(name: str, catalog: Catalog | None = None) -> GPU:
    return (catalog or builtin_catalog()).gpu(name)


def get_model(name: str, catalog: Catalog | None = None) -> Model:
    return (catalog or builtin_catalog()).model(name)


def get_tier(name: str, catalog: Catalog | None = None) -> Tier:
    return (catalog or builtin_catalog()).tier(name)


# vLLM's `--dtype auto` serves float32 checkpoints in 16 bits, so they weigh 2 bytes/param.
_DTYPE_BYTES = {"bfloat16": 2.0, "float16": 2.0, "float32": 2.0}


def _weight_bytes(cfg: Mapping[str, Any], where: str) -> float:
    quant = cfg.get("quantization_config")
    if isinstance(quant, dict):
        method = str(quant.get("quant_method", "")).lower()
        if method in {"fp8", "fbgemm_fp8", "modelopt"}:
            return 1.0
        bits = quant.get("bits") or quant.get("w_bit")  # gptq / awq: integer weight bits
        if method == "compressed-tensors":  # config_groups.<g>.weights.num_bits
            groups = quant.get("config_groups") or {}
            found = [g.get("weights", {}).get("num_bits") for g in groups.values()]
            bits = found[0] if found else (8 if "quantized" in str(quant.get("format")) else None)
        if isinstance(bits, int) and not isinstance(bits, bool) and bits > 0:
            return bits / 8
        raise ConfigError(f"{where}: key 'quantization_config' has unsupported {method!r}")
    dtype = cfg.get("torch_dtype", cfg.get("dtype", "bfloat16"))
    if dtype not in _DTYPE_BYTES:
        raise ConfigError(f"{where}: key 'torch_dtype' has unsupported value {dtype!r}")
    return _DTYPE_BYTES[str(dtype)]


def model_from_hf_config(path_or_dict: Path | str | Mapping[str, Any], name: str) -> Model:
    """A Model from a Hugging Face config.json (dense decoder-only transformers).

    Parameters are estimated from the shapes (SwiGLU MLP as in Llama/Qwen/Mistral):
    per layer q/o = hidden·q_heads·head_dim each, k/v = hidden·kv_heads·head_dim each,
    MLP = 3·hidden·intermediate, two RMSNorms (2·hidden, + 2·head_dim with qk-norm as in
    Qwen3), q/k/v biases when `attention_bias`; plus vocab·hidden for the embedding and again
    for lm_head unless `tie_word_embeddings`, plus the final norm. This reproduces
    Llama-3.1-8B's 8,030,261,248 exactly.
    """
    if isinstance(path_or_dict, Mapping):
        cfg, where = dict(path_or_dict), f"config of {name}"
    else:
        path = Path(path_or_dict)
        where = str(path)
        try:
            cfg = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{where}: cannot read config.json: {exc.strerror or exc}") from exc
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}:{exc.lineno}: not valid JSON: {exc.msg}") from exc
        if not isinstance(cfg, dict):
            raise ConfigError(f"{where}: top level must be a JSON object")
    if "text_config" in cfg and "num_hidden_layers" not in cfg:
        cfg = dict(cfg["text_config"])  # multimodal wrappers keep the LM under text_config
    for moe_key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if cfg.get(moe_key):
            raise ConfigError(f"{where}: key {moe_key!r}: mixture-of-experts is not modelled")

    def need(key: str) -> int:
        if key not in cfg:
            raise ConfigError(f"{where}: missing key {key!r}")
        value = cfg[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{where}: key {key!r} must be an integer >= 1, got {value!r}")
        return value

    layers, hidden = need("num_hidden_layers"), need("hidden_size")
    q_heads, vocab, inter = (
        need("num_attention_heads"),
        need("vocab_size"),
        need("intermediate_size"),
    )
    kv_heads = need("num_key_value_heads") if "num_key_value_heads" in cfg else q_heads
    head_dim = need("head_dim") if cfg.get("head_dim") is not None else hidden // q_heads
    if "head_dim" not in cfg and hidden % q_heads:
        raise ConfigError(f"{where}: key 'hidden_size' not divisible by num_attention_heads")
    q_dim, kv_dim = q_heads * head_dim, kv_heads * head_dim
    per_layer = 2 * hidden * q_dim + 2 * hidden * kv_dim + 3 * hidden * inter + 2 * hidden
    if cfg.get("attention_bias") or str(cfg.get("model_type", "")).startswith("qwen2"):
        per_layer += q_dim + 2 * kv_dim
    if str(cfg.get("model_type", "")).startswith("qwen3"):
        per_layer += 2 * head_dim  # q_norm / k_norm
    tied = bool(cfg.get("tie_word_embeddings", False))
    params = layers * per_layer + vocab * hidden * (1 if tied else 2) + hidden
    # vLLM's max_model_len default: max_position_embeddings (rope_scaling factors ignored)
    max_context = need("max_position_embeddings") if "max_position_embeddings" in cfg else None
    return Model(
        name=name.strip().lower(),
        params=float(params),
        layers=layers,
        hidden=hidden,
        q_heads=q_heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        weight_bytes_per_param=_weight_bytes(cfg, where),
        kv_bytes_per_elem=2.0,  # vLLM's default KV dtype follows the bf16/fp16 activations
        source=f"Hugging Face config {where}; params estimated from shapes",
        max_context=max_context,
    )
