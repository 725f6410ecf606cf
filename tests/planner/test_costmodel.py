"""The analytic cost model against its published figures (planner/domain/data/sources.yaml)
and its own laws."""

from __future__ import annotations

from typing import Any

import pytest

from core.errors import ConfigError
from planner.domain.costmodel import (
    DEFAULT_STEP_OVERHEAD_S,
    hbm_kv_capacity_tokens,
    kv_bytes_per_token,
    prefill_flops,
    prefill_seconds,
    prefill_tokens_per_second,
    step_seconds,
    step_seconds_fns,
    tier_read_seconds,
    transfer_seconds,
    weight_bytes_per_gpu,
)
from planner.domain.hardware import get_gpu, get_model, get_tier, with_kv_dtype

H100 = get_gpu("h100")
LLAMA_8B = get_model("llama-3.1-8b")
LLAMA_70B = get_model("llama-3.1-70b")

# KV bytes per token from the config.json shapes ([source: hf-llama-3.1-8b-config] and the
# other hf-*-config entries): (bf16 B/token, fp8 B/token)
KV_TABLE = {
    "llama-3.1-8b": (131_072, 65_536),
    "llama-3.1-70b": (327_680, 163_840),
    "llama-3.3-70b": (327_680, 163_840),
    "qwen3-8b": (147_456, 73_728),
    "qwen3-32b": (262_144, 131_072),
}


@pytest.mark.parametrize("name", sorted(KV_TABLE))
def test_kv_bytes_per_token_catalogue_model_matches_config_shape(name: str) -> None:
    bf16, fp8 = KV_TABLE[name]
    model = get_model(name)
    assert kv_bytes_per_token(model) == bf16
    assert kv_bytes_per_token(get_model(f"{name}-fp8")) == bf16  # FP8 weights keep bf16 KV
    assert kv_bytes_per_token(with_kv_dtype(model, "fp8")) == fp8
    assert kv_bytes_per_token(model) * 16 == bf16 * 16  # a 16-token block
    assert kv_bytes_per_token(model, tp=2) == bf16 / 2


def test_kv_bytes_per_token_tp_beyond_kv_heads_replicates() -> None:
    # 8 KV heads on 16 GPUs: each GPU keeps one head, not half a head.
    assert kv_bytes_per_token(LLAMA_70B, tp=8) == 327_680 / 8
    assert kv_bytes_per_token(LLAMA_70B, tp=16) == 327_680 / 8


@pytest.mark.parametrize("tp", [0, -1, 3, 5])
def test_kv_bytes_per_token_bad_tp_raises(tp: int) -> None:
    with pytest.raises(ConfigError, match="tp"):
        kv_bytes_per_token(LLAMA_8B, tp=tp)


def test_weight_bytes_per_gpu_shards_by_tp() -> None:
    assert weight_bytes_per_gpu(LLAMA_8B) == pytest.approx(16.06e9, rel=1e-3)
    assert weight_bytes_per_gpu(get_model("llama-3.1-70b-fp8"), 4) == pytest.approx(
        17.64e9, rel=1e-3
    )


def test_hbm_kv_capacity_tokens_llama_8b_h100() -> None:
    tokens = hbm_kv_capacity_tokens(LLAMA_8B, H100, 1, 0.9, activation_reserve_bytes=0)
    expected = (80 * 1024**3 * 0.9 - 16.06e9) / 131_072
    assert tokens == pytest.approx(expected, rel=1e-3)
    assert hbm_kv_capacity_tokens(LLAMA_8B, H100, 1, 0.9) < tokens  # reserve costs tokens
    assert hbm_kv_capacity_tokens(LLAMA_70B, H100, 4, 0.9) > 0


@pytest.mark.parametrize(
    ("model", "gpu", "tp", "gmu"),
    [("llama-3.1-70b", "h100", 1, 0.9), ("llama-3.1-70b", "l40s", 2, 0.9),
     ("qwen3-32b", "l40s", 1, 0.9), ("llama-3.1-8b", "h100", 1, 0.2)],
)  # fmt: skip
def test_hbm_kv_capacity_tokens_weights_do_not_fit_raise(
    model: str, gpu: str, tp: int, gmu: float
) -> None:
    with pytest.raises(ConfigError, match="does not fit"):
        hbm_kv_capacity_tokens(get_model(model), get_gpu(gpu), tp, gmu)


@pytest.mark.parametrize("gmu", [0.0, 1.5, -0.1])
def test_hbm_kv_capacity_tokens_bad_utilization_raises(gmu: float) -> None:
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        hbm_kv_capacity_tokens(LLAMA_8B, H100, 1, gmu)


def test_prefill_flops_kaplan_formula() -> None:
    s = 4096
    d_attn = LLAMA_8B.q_heads * LLAMA_8B.head_dim
    kaplan = 2 * LLAMA_8B.params * s + 2 * LLAMA_8B.layers * s**2 * d_attn
    assert prefill_flops(LLAMA_8B, s, 0) == pytest.approx(kaplan, rel=1e-3)
    # With cached context the new tokens attend to it: more than the same chunk alone.
    assert prefill_flops(LLAMA_8B, 512, 4096) > prefill_flops(LLAMA_8B, 512, 0)


def test_prefill_tokens_per_second_llama_8b_tp1_mfu_half_is_31k() -> None:
    # Derived [source: kaplan-scaling-laws-2020]: Llama-3.1-8B TP1 bf16 at 50 % MFU ≈ 31 k tok/s
    rate = prefill_tokens_per_second(LLAMA_8B, H100, 1, mfu=0.5)
    assert rate == pytest.approx(31_000, rel=0.03)
    seconds = prefill_seconds(LLAMA_8B, H100, 1, 1024, mfu=0.5)
    assert 1024 / seconds == pytest.approx(31_000, rel=0.06)


def test_prefill_seconds_fp8_weights_faster_than_bf16() -> None:
    bf16 = prefill_seconds(LLAMA_70B, H100, 4, 4096)
    fp8 = prefill_seconds(get_model("llama-3.1-70b-fp8"), H100, 4, 4096)
    assert fp8 < 0.7 * bf16


def test_prefill_seconds_cached_tokens_and_chunks() -> None:
    full = prefill_seconds(LLAMA_8B, H100, 1, 8192)
    half = prefill_seconds(LLAMA_8B, H100, 1, 8192, cached_tokens=4096)
    assert half < full
    assert prefill_seconds(LLAMA_8B, H100, 1, 8192, cached_tokens=8192) == 0.0
    chunked = prefill_seconds(LLAMA_8B, H100, 1, 8192, chunk_tokens=2048)
    assert chunked > full  # four steps pay the weights read and the overhead four times
    with pytest.raises(ConfigError, match="cached_tokens"):
        prefill_seconds(LLAMA_8B, H100, 1, 10, cached_tokens=11)


def test_step_seconds_decode_batch_1_llama_8b_is_weight_bound() -> None:
    # Assumed decode efficiency 0.7: decode ≈ weights / (HBM bw × 0.7)
    # = 16 GB / (3.35 TB/s × 0.7) ≈ 6.8 ms
    step = step_seconds(LLAMA_8B, H100, 1, prefill=[], decode_seqs=1, decode_kv_tokens=1000)
    assert step == pytest.approx(16.06e9 / (3.35e12 * 0.7), rel=0.06)
    bare = step_seconds(LLAMA_8B, H100, 1, decode_seqs=1, decode_kv_tokens=0, overhead_s=0.0)
    assert bare == pytest.approx(16.06e9 / (3.35e12 * 0.7), rel=1e-3)
    # the 1,000 tokens of KV read on top of the weights, plus the fixed step overhead
    assert step - bare == pytest.approx(DEFAULT_STEP_OVERHEAD_S + 1000 * 131_072 / (3.35e12 * 0.7))


@pytest.mark.parametrize("model_name", ["llama-3.1-8b", "qwen3-32b", "llama-3.1-70b-fp8"])
def test_step_seconds_monotonic_in_batch_and_context(model_name: str) -> None:
    model = get_model(model_name)
    tp = 1 if model.params < 2e10 else 4
    last = 0.0
    for seqs in (1, 8, 64, 256, 1024):
        t = step_seconds(model, H100, tp, decode_seqs=seqs, decode_kv_tokens=seqs * 2048)
        assert t > last
        last = t
    last = 0.0
    for context in (0, 1024, 8192, 65_536):
        t = step_seconds(model, H100, tp, prefill=[(512, context)], decode_seqs=4,
                         decode_kv_tokens=4 * context)  # fmt: skip
        assert t > last
        last = t


def test_step_seconds_large_prefill_is_compute_bound_and_mfu_scales() -> None:
    fast = step_seconds(LLAMA_8B, H100, 1, prefill=[(8192, 0)], mfu=0.6, overhead_s=0.0)
    slow = step_seconds(LLAMA_8B, H100, 1, prefill=[(8192, 0)], mfu=0.3, overhead_s=0.0)
    assert slow == pytest.approx(2 * fast, rel=1e-6)


def test_step_seconds_tp_adds_allreduce_but_shrinks_compute() -> None:
    one = step_seconds(LLAMA_70B, H100, 2, prefill=[(4096, 0)])
    four = step_seconds(LLAMA_70B, H100, 4, prefill=[(4096, 0)])
    assert four < one
    l40s = step_seconds(LLAMA_70B, get_gpu("l40s"), 4, prefill=[(4096, 0)])
    assert l40s > four  # slower tensor cores and all-reduce over PCIe


def test_step_seconds_empty_step_costs_nothing() -> None:
    assert step_seconds(LLAMA_8B, H100, 1, prefill=[], decode_seqs=0, decode_kv_tokens=0) == 0.0


@pytest.mark.parametrize(
    ("model", "gpu", "tp"), [("llama-3.1-8b", "h100", 1), ("qwen3-32b", "h100", 2),
                             ("llama-3.1-70b", "l40s", 4)]
)  # fmt: skip
def test_decode_step_fn_equals_step_fn_without_prefill_bit_for_bit(
    model: str, gpu: str, tp: int
) -> None:
    # the simulator times its decode jumps with `decode` (results must not move by one ulp)
    fn, decode = step_seconds_fns(get_model(model), get_gpu(gpu), tp, mfu=0.37, overhead_s=3e-3)
    cases = [(r, r * c) for r in (0, 1, 3, 17, 64, 255, 256) for c in (1, 7, 1000, 8191, 131_071)]
    cases.append((0, 0))
    for seqs, kv in cases:
        assert decode(seqs, kv) == fn([], seqs, kv), (seqs, kv)
    assert decode(0, 0) == 0.0 and decode(256, 256 * 8000) > decode(1, 8000) > 0.0


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"mfu": 0.0}, "mfu"),
        ({"mfu": 1.2}, "mfu"),
        ({"hbm_efficiency": 0}, "hbm_efficiency"),
        ({"decode_seqs": -1}, "decode_seqs"),
        ({"decode_seqs": 0, "decode_kv_tokens": 5}, "decode_kv_tokens"),
        ({"prefill": [(10, -1)]}, "context_before"),
        ({"prefill": [(10,)]}, "prefill chunk"),
        ({"dtype": "int4"}, "dtype"),
        ({"overhead_s": -1.0}, "overhead_s"),
    ],
)
def test_step_seconds_bad_input_raises(kwargs: dict[str, Any], needle: str) -> None:
    args: dict[str, Any] = {"prefill": [(16, 0)], "decode_seqs": 1, "decode_kv_tokens": 10}
    with pytest.raises(ConfigError, match=needle):
        step_seconds(LLAMA_8B, H100, 1, **{**args, **kwargs})


def test_transfer_seconds_bandwidth_plus_latency() -> None:
    assert transfer_seconds(1e9, 1e9) == 1.0
    assert transfer_seconds(1e9, 1e9, latency_s=0.01, objects=16) == pytest.approx(1.16)
    assert transfer_seconds(1e9, 1e9, latency_s=0.01, objects=16, concurrency=4) == pytest.approx(
        1.04
    )
    assert transfer_seconds(0, 1e9, latency_s=0.01) == 0.0


@pytest.mark.parametrize(
    ("args", "kwargs", "needle"),
    [((-1, 1e9), {}, "nbytes"), ((1, 0), {}, "bandwidth"), ((1, 1e9), {"objects": 0}, "objects"),
     ((1, 1e9), {"latency_s": -1}, "latency"), ((1, 1e9), {"concurrency": 0}, "concurrency")],
)  # fmt: skip
def test_transfer_seconds_bad_input_raises(
    args: tuple[float, float], kwargs: dict[str, Any], needle: str
) -> None:
    with pytest.raises(ConfigError, match=needle):
        transfer_seconds(*args, **kwargs)


def test_tier_read_seconds_compression_and_per_gpu_links() -> None:
    ceph = get_tier("ceph-hdd")
    raw = tier_read_seconds(LLAMA_70B, ceph, 4096)
    packed = tier_read_seconds(LLAMA_70B, ceph, 4096, compression=4.0)
    latency = 16 * ceph.latency_s
    assert raw - latency == pytest.approx(4 * (packed - latency))
    dram = get_tier("cpu-dram-pcie")
    assert tier_read_seconds(LLAMA_70B, dram, 4096, tp=4) < tier_read_seconds(
        LLAMA_70B, dram, 4096, tp=1
    )
    with pytest.raises(ConfigError, match="compression"):
        tier_read_seconds(LLAMA_70B, ceph, 4096, compression=0.5)
