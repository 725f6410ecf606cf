"""The hardware catalogue: built-in entries, user YAML, Hugging Face config.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.errors import ConfigError
from planner.domain.hardware import (
    GPU,
    Model,
    Tier,
    builtin_catalog,
    get_gpu,
    get_model,
    get_tier,
    load_catalog,
    model_from_hf_config,
    with_kv_dtype,
)

# Llama-3.1-8B's config.json (meta-llama/Llama-3.1-8B, the keys the estimate reads).
LLAMA_8B_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
}


def test_builtin_catalog_every_entry_has_a_source() -> None:
    cat = builtin_catalog()
    entries: list[GPU | Model | Tier] = [*cat.gpus.values(), *cat.models.values()]
    entries += cat.tiers.values()
    assert len(entries) >= 4 + 10 + 9
    for entry in entries:
        assert len(entry.source) > 20, entry.name


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [("h100", "h100-80gb"), ("H100-SXM5", "h100-80gb"), ("H200", "h200-141gb"),
     ("a100", "a100-80gb"), ("L40S", "l40s")],
)  # fmt: skip
def test_get_gpu_alias_any_case_resolves(alias: str, canonical: str) -> None:
    assert get_gpu(alias).name == canonical


def test_get_gpu_datasheet_numbers_h100() -> None:
    gpu = get_gpu("h100")
    assert gpu.hbm_bandwidth_Bps == 3.35e12
    assert gpu.bf16_flops == 989e12
    assert gpu.fp8_flops == 1979e12
    assert gpu.pcie_Bps == 50e9
    assert gpu.nvlink_Bps == 450e9


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("meta-llama/Meta-Llama-3.1-70B-Instruct", "llama-3.1-70b"),
        ("RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8", "llama-3.1-70b-fp8"),
        ("Qwen/Qwen3-32B", "qwen3-32b"),
        ("llama-3.3-70b-fp8", "llama-3.3-70b-fp8"),
    ],
)
def test_get_model_hf_repo_ids_resolve(name: str, canonical: str) -> None:
    assert get_model(name).name == canonical


def test_get_model_fp8_variant_keeps_bf16_kv() -> None:
    base, fp8 = get_model("llama-3.1-70b"), get_model("llama-3.1-70b-fp8")
    assert fp8.weight_bytes_per_param == 1.0
    assert base.weight_bytes_per_param == 2.0
    assert fp8.kv_bytes_per_elem == base.kv_bytes_per_elem == 2.0
    assert with_kv_dtype(fp8, "fp8").kv_bytes_per_elem == 1.0


@pytest.mark.parametrize(
    ("getter", "name", "listed"),
    [(get_gpu, "b300", "h100-80gb"), (get_model, "gpt-5", "qwen3-8b"),
     (get_tier, "tape", "ceph-hdd")],
)  # fmt: skip
def test_get_unknown_name_raises_listing_known(getter: Any, name: str, listed: str) -> None:
    with pytest.raises(ConfigError, match=listed) as info:
        getter(name)
    assert name in str(info.value)


def test_with_kv_dtype_unknown_raises() -> None:
    with pytest.raises(ConfigError, match="int3"):
        with_kv_dtype(get_model("qwen3-8b"), "int3")


def test_get_tier_ceph_hdd_ranges_match_published_figures() -> None:
    ceph = get_tier("ceph-hdd")
    assert ceph.read_Bps == 0.83e9
    assert ceph.read_bounds == (0.1e9, 0.83e9)
    assert ceph.latency_bounds == pytest.approx((0.005, 0.015))
    assert get_tier("cpu-dram-pcie").per_gpu


def _write(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "extra.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


GOOD_GPU = {
    "hbm_gib": 192, "hbm_bandwidth_gbps": 8000, "bf16_tflops": 2250, "fp8_tflops": 4500,
    "pcie_gbps": 50, "nvlink_gbps": 900, "source": "my lab's measurements, 2026",
}  # fmt: skip


def test_load_catalog_user_yaml_adds_and_overrides(tmp_path: Path) -> None:
    tier = {"read_gbps": 2, "write_gbps": 1, "latency_ms": 3, "source": "fio run 2026-02-01"}
    path = _write(tmp_path, {"gpus": {"MyGPU": {**GOOD_GPU, "aliases": ["mine"]}},
                             "tiers": {"ceph-hdd": tier}})  # fmt: skip
    cat = load_catalog(path)
    assert cat.gpu("mine").hbm_bandwidth_Bps == 8e12
    assert cat.tier("ceph-hdd").read_Bps == 2e9
    assert cat.tier("ceph-hdd").latency_s == pytest.approx(0.003)
    assert cat.gpu("h100").name == "h100-80gb"  # built-ins stay
    assert builtin_catalog().tier("ceph-hdd").read_Bps == 0.83e9  # not mutated


def test_load_catalog_model_from_hf_config_reference(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B_CONFIG), encoding="utf-8")
    path = _write(tmp_path, {"models": {"my-llama": {"hf_config": "config.json",
                                                     "source": "our fine-tune"}}})  # fmt: skip
    cat = load_catalog(path)
    assert cat.model("my-llama").params == get_model("llama-3.1-8b").params
    assert cat.model("my-llama-fp8").weight_bytes_per_param == 1.0


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ({"gpu": {}}, "'gpu'"),
        ({"gpus": {"x": {**GOOD_GPU, "hbm_gb": 80}}}, "'hbm_gb'"),
        ({"gpus": {"x": {k: v for k, v in GOOD_GPU.items() if k != "fp8_tflops"}}},
         "'fp8_tflops'"),
        ({"gpus": {"x": {**GOOD_GPU, "source": ""}}}, "'source'"),
        ({"gpus": {"x": {**GOOD_GPU, "bf16_tflops": "fast"}}}, "'bf16_tflops'"),
        ({"gpus": {"x": {**GOOD_GPU, "hbm_gib": -1}}}, "'hbm_gib'"),
        ({"gpus": {"x": {**GOOD_GPU, "aliases": "y"}}}, "'aliases'"),
        ({"gpus": ["x"]}, "'gpus'"),
        ({"tiers": {"t": {"read_gbps": 1, "write_gbps": 1, "source": "s"}}}, "'latency_ms'"),
        ({"tiers": {"t": {"read_gbps": 1, "write_gbps": 1, "latency_ms": 1, "source": "s",
                          "read_gbps_range": [2, 1]}}}, "low > high"),
        ({"tiers": {"t": {"read_gbps": 1, "write_gbps": 1, "latency_ms": 1, "source": "s",
                          "concurrency": 0}}}, "'concurrency'"),
        ({"models": {"m": {"params": 1e9, "layers": 2.5, "hidden": 8, "q_heads": 1,
                           "kv_heads": 1, "head_dim": 8, "weight_bytes_per_param": 2,
                           "kv_bytes_per_elem": 2, "source": "s"}}}, "'layers'"),
        ({"models": {"m": {"hf_config": "missing.json", "source": "s"}}}, "missing.json"),
        ({"models": {"m": {"params": 1e9, "layers": 2, "hidden": 8, "q_heads": 1,
                           "kv_heads": 1, "head_dim": 8, "weight_bytes_per_param": 2,
                           "kv_bytes_per_elem": 2, "max_context": 0, "source": "s"}}},
         "'max_context'"),
        ([1, 2], "top level"),
    ],
)  # fmt: skip
def test_load_catalog_bad_yaml_raises_naming_key(tmp_path: Path, doc: object, needle: str) -> None:
    path = _write(tmp_path, doc)
    with pytest.raises(ConfigError, match=needle) as info:
        load_catalog(path)
    assert "extra.yaml" in str(info.value)


def test_load_catalog_unparsable_yaml_raises(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("gpus: {x: [1,\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"broken\.yaml"):
        load_catalog(path)


def test_model_from_hf_config_llama_8b_roundtrip_matches_catalogue(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_8B_CONFIG), encoding="utf-8")
    model = model_from_hf_config(path, "Llama-8B-Local")
    ref = get_model("llama-3.1-8b")
    assert model.params == pytest.approx(8.03e9, rel=0.02)  # model card: 8B
    assert (model.layers, model.hidden, model.q_heads, model.kv_heads, model.head_dim) == (
        ref.layers, ref.hidden, ref.q_heads, ref.kv_heads, ref.head_dim)  # fmt: skip
    assert model.weight_bytes_per_param == 2.0
    assert model.name == "llama-8b-local"
    assert model.max_context == ref.max_context == LLAMA_8B_CONFIG["max_position_embeddings"]


def test_model_from_hf_config_without_max_position_embeddings_has_no_context() -> None:
    cfg = {k: v for k, v in LLAMA_8B_CONFIG.items() if k != "max_position_embeddings"}
    assert model_from_hf_config(cfg, "x").max_context is None


@pytest.mark.parametrize(("name", "context"), [("qwen3-8b", 40960), ("llama-3.1-70b", 131072)])
def test_catalogue_models_carry_their_config_context_length(name: str, context: int) -> None:
    model = get_model(name)
    assert model.max_context == context
    assert str(context) in model.source  # the figure is cited with its config.json


@pytest.mark.parametrize(
    ("overrides", "params_b"),
    [  # Qwen3-32B (model card 32.8B) and Llama-3.1-70B (70.6B)
        ({"model_type": "qwen3", "hidden_size": 5120, "intermediate_size": 25600,
          "num_attention_heads": 64, "num_hidden_layers": 64, "head_dim": 128,
          "vocab_size": 151936}, 32.8),
        ({"hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64,
          "num_hidden_layers": 80}, 70.6),
    ],
)  # fmt: skip
def test_model_from_hf_config_published_sizes(overrides: dict[str, Any], params_b: float) -> None:
    model = model_from_hf_config({**LLAMA_8B_CONFIG, **overrides}, "x")
    assert model.params / 1e9 == pytest.approx(params_b, rel=0.01)


@pytest.mark.parametrize(
    ("quant", "bytes_per_param"),
    [
        ({"quant_method": "fp8", "activation_scheme": "dynamic"}, 1.0),
        ({"quant_method": "compressed-tensors", "format": "float-quantized",
          "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}}}}, 1.0),
        ({"quant_method": "compressed-tensors", "format": "pack-quantized",
          "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int"}}}}, 0.5),
        ({"quant_method": "awq", "bits": 4}, 0.5),
    ],
)  # fmt: skip
def test_model_from_hf_config_quantization_weight_bytes(
    quant: dict[str, Any], bytes_per_param: float
) -> None:
    model = model_from_hf_config({**LLAMA_8B_CONFIG, "quantization_config": quant}, "x")
    assert model.weight_bytes_per_param == bytes_per_param
    assert model.kv_bytes_per_elem == 2.0  # KV stays bf16 unless --kv-cache-dtype fp8


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"num_hidden_layers": None}, "num_hidden_layers"),
        ({"vocab_size": None}, "vocab_size"),
        ({"hidden_size": "big"}, "hidden_size"),
        ({"torch_dtype": "int4"}, "torch_dtype"),
        ({"num_local_experts": 8}, "num_local_experts"),
        ({"quantization_config": {"quant_method": "mystery"}}, "quantization_config"),
    ],
)
def test_model_from_hf_config_bad_fields_raise(
    tmp_path: Path, change: dict[str, Any], needle: str
) -> None:
    cfg = {k: v for k, v in {**LLAMA_8B_CONFIG, **change}.items() if v is not None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    with pytest.raises(ConfigError, match=needle) as info:
        model_from_hf_config(path, "x")
    assert "config.json" in str(info.value)


def test_model_from_hf_config_invalid_json_names_line(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{\n  "hidden_size": 4096,\n  oops\n}', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"config\.json:3"):
        model_from_hf_config(path, "x")
