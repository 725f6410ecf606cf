"""The analytic cost model: KV bytes, prefill / decode step time, tier transfer time.

A vLLM engine step (one mixed batch of prefill chunks and decode tokens) is a roofline:
max(compute, HBM traffic) plus TP all-reduces plus a small fixed overhead. Every default
below cites its publication as [source: <id>] (planner/domain/data/sources.yaml) or is marked
as an assumption or a derivation; fit the
MFU / efficiency of a real deployment from its own TTFT and ITL (planner/fit/orchestrate.py).
Everything returns plain floats in SI units (seconds, bytes, bytes/s).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from core.errors import ConfigError
from planner.domain.hardware import GPU, Model, Tier

GIB = 1024**3

# Assumption: fixed cost of one engine step (scheduler + sampler + launch; vLLM V1 uses CUDA
# graphs and async scheduling, so a few hundred µs). No published figure: fit from ITL.
DEFAULT_STEP_OVERHEAD_S = 3e-4
# Assumption: latency of one small NCCL / custom all-reduce over NVLink (~5–10 µs); a TP
# layer does two (after attention and after the MLP).
ALLREDUCE_LATENCY_S = 8e-6
# Assumption: HBM vLLM keeps for activations, CUDA graphs and NCCL buffers besides weights and
# KV (it profiles the real peak at start-up). Calibrate with the engines' num_gpu_blocks
# (cache-config info, core.catalog.FACTS["cache_config"]).
DEFAULT_ACTIVATION_RESERVE_BYTES = 2 * GIB
# Assumption (a prior, no publication): decode is memory-bound, step time ≈ (weights + KV
# read) / (HBM bw × ~0.7); fit the efficiency of a deployment from its ITL.
DEFAULT_HBM_EFFICIENCY = 0.7
# Assumption (a prior, no publication): prefill MFU 40–60 % is a simulator default, not a
# measurement; fit the effective MFU of a deployment from TTFT vs prompt length.
DEFAULT_MFU = 0.5
ACTIVATION_BYTES = 2  # bf16 activations travel through the TP all-reduce


def _check_tp(model: Model, tp: int) -> None:
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ConfigError(f"tp must be an integer >= 1, got {tp!r}")
    if model.q_heads % tp:
        raise ConfigError(f"tp={tp} does not divide {model.name}'s {model.q_heads} query heads")
    # vLLM shards KV heads when kv_heads >= tp and replicates them when tp is a multiple.
    if model.kv_heads % tp and tp % model.kv_heads:
        raise ConfigError(
            f"tp={tp} and {model.name}'s {model.kv_heads} KV heads: one must divide the other"
        )


def _check_fraction(value: float, name: str) -> None:
    if not (isinstance(value, int | float) and 0 < value <= 1):
        raise ConfigError(f"{name} must be in (0, 1], got {value!r}")


def _check_count(value: int, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name} must be an integer >= 0, got {value!r}")


def kv_bytes_per_token(model: Model, tp: int = 1) -> float:
    """KV bytes one token occupies on ONE GPU of a TP group.

    2 (K and V) · layers · kv_heads · head_dim · bytes / tp (from the model shape). When tp
    exceeds the KV heads vLLM replicates them (each GPU keeps one head), so the per-GPU share is
    max(kv_heads / tp, 1) heads, not kv_heads / tp: the engine then stores more KV in total.
    """
    _check_tp(model, tp)
    heads = max(model.kv_heads / tp, 1.0)
    return 2.0 * model.layers * heads * model.head_dim * model.kv_bytes_per_elem


def kv_bytes_per_token_engine(model: Model) -> float:
    """Unique KV bytes per token for the whole engine (what a cache tier stores)."""
    return kv_bytes_per_token(model, 1)


def weight_bytes_per_gpu(model: Model, tp: int = 1) -> float:
    """Weights on one GPU: params · bytes/param / tp (vLLM shards embeddings and lm_head too;
    the replicated norms are negligible)."""
    _check_tp(model, tp)
    return model.params * model.weight_bytes_per_param / tp


def hbm_kv_capacity_tokens(
    model: Model,
    gpu: GPU,
    tp: int,
    gpu_memory_utilization: float = 0.9,
    activation_reserve_bytes: float = DEFAULT_ACTIVATION_RESERVE_BYTES,
) -> int:
    """Tokens of KV one engine (tp GPUs) holds: what vLLM's gpu_memory_utilization share of
    HBM keeps after weights and the activation reserve, divided by the per-GPU KV per token.
    """
    _check_fraction(gpu_memory_utilization, "gpu_memory_utilization")
    if activation_reserve_bytes < 0:
        raise ConfigError(f"activation_reserve_bytes must be >= 0, got {activation_reserve_bytes}")
    budget = gpu.hbm_bytes * gpu_memory_utilization
    weights = weight_bytes_per_gpu(model, tp)
    free = budget - weights - activation_reserve_bytes
    if free <= 0:
        raise ConfigError(
            f"{model.name} does not fit on {tp}× {gpu.name}: {weights / 1e9:.1f} GB weights + "
            f"{activation_reserve_bytes / 1e9:.1f} GB reserve per GPU exceed "
            f"{budget / 1e9:.1f} GB ({gpu_memory_utilization:.0%} of {gpu.hbm_bytes / 1e9:.1f} GB)"
        )
    return int(free // kv_bytes_per_token(model, tp))


def _attention_flops(model: Model, query_tokens_x_keys: float) -> float:
    # QKᵀ and A·V: 2 FLOPs per multiply-add each, over d_attn = q_heads·head_dim, per layer.
    return 4.0 * model.layers * model.q_heads * model.head_dim * query_tokens_x_keys


def _causal_pairs(new_tokens: int, context_tokens: int) -> float:
    # Each new token attends to the whole context plus the new tokens up to itself.
    return new_tokens * context_tokens + new_tokens * (new_tokens + 1) / 2


def prefill_flops(model: Model, new_tokens: int, context_tokens: int = 0) -> float:
    """Forward FLOPs of a prefill chunk: 2·N·S + attention (Kaplan et al. 2020, Table 1).

    With no context this is 2·N·S + 2·layers·S²·d_attn (causal halving included), the
    formula kvscope uses [source: kaplan-scaling-laws-2020]. N counts all parameters
    (embeddings and lm_head included, as the derived ~31 k tok/s for Llama-3.1-8B does):
    conservative by ~13 % for 8B models.
    """
    _check_count(new_tokens, "new_tokens")
    _check_count(context_tokens, "context_tokens")
    return 2.0 * model.params * new_tokens + _attention_flops(
        model, _causal_pairs(new_tokens, context_tokens)
    )


def _gemm_peak(model: Model, gpu: GPU, dtype: str) -> float:
    if dtype == "auto":
        dtype = "fp8" if model.weight_bytes_per_param <= 1 else "bf16"
    if dtype == "fp8":
        return gpu.fp8_flops
    if dtype in {"bf16", "fp16"}:
        return gpu.bf16_flops
    raise ConfigError(f"unknown compute dtype {dtype!r}; known: auto, bf16, fp16, fp8")


def _allreduce_seconds(model: Model, gpu: GPU, tp: int, tokens: int) -> float:
    if tp == 1 or tokens == 0:
        return 0.0
    link = gpu.nvlink_Bps or gpu.pcie_Bps  # no NVLink (L40S): all-reduce over PCIe
    message = tokens * model.hidden * ACTIVATION_BYTES
    ring = 2.0 * (tp - 1) / tp * message / link  # ring all-reduce bytes per GPU
    return 2.0 * model.layers * (ALLREDUCE_LATENCY_S + ring)


def step_seconds(  # noqa: PLR0913 - one parameter per input of the roofline step time
    model: Model,
    gpu: GPU,
    tp: int,
    *,
    prefill: Sequence[tuple[int, int]] = (),
    decode_seqs: int = 0,
    decode_kv_tokens: int = 0,
    mfu: float = DEFAULT_MFU,
    hbm_efficiency: float = DEFAULT_HBM_EFFICIENCY,
    dtype: str = "auto",
    overhead_s: float = DEFAULT_STEP_OVERHEAD_S,
) -> float:
    """Seconds of one vLLM engine step over a mixed batch.

    prefill: (new_tokens, context_before) chunks; decode_seqs sequences each make one token and
    read decode_kv_tokens of KV in total. Roofline: max(compute, memory) where compute = FLOPs /
    (tp · peak · mfu) — GEMMs at the fp8 peak for FP8-weight models when dtype="auto",
    attention at the bf16 peak — and memory = (weights per GPU + KV read and written per GPU) /
    (HBM bandwidth · hbm_efficiency); plus 2 all-reduces per layer when tp > 1 and overhead_s.
    An empty step costs 0.
    """
    _check_tp(model, tp)
    _check_fraction(mfu, "mfu")
    _check_fraction(hbm_efficiency, "hbm_efficiency")
    _check_count(decode_seqs, "decode_seqs")
    _check_count(decode_kv_tokens, "decode_kv_tokens")
    if overhead_s < 0:
        raise ConfigError(f"overhead_s must be >= 0, got {overhead_s!r}")
    if decode_kv_tokens and not decode_seqs:
        raise ConfigError("decode_kv_tokens > 0 needs decode_seqs > 0")
    for chunk in prefill:
        if len(chunk) != 2:
            raise ConfigError(f"prefill chunk must be (new_tokens, context_before), got {chunk!r}")
        _check_count(chunk[0], "prefill new_tokens")
        _check_count(chunk[1], "prefill context_before")
    fn = step_seconds_fn(
        model, gpu, tp, mfu=mfu, hbm_efficiency=hbm_efficiency, dtype=dtype, overhead_s=overhead_s
    )
    return fn(prefill, decode_seqs, decode_kv_tokens)


def step_seconds_fns(
    model: Model,
    gpu: GPU,
    tp: int,
    *,
    mfu: float = DEFAULT_MFU,
    hbm_efficiency: float = DEFAULT_HBM_EFFICIENCY,
    dtype: str = "auto",
    overhead_s: float = DEFAULT_STEP_OVERHEAD_S,
) -> tuple[Callable[[Sequence[tuple[int, int]], int, int], float], Callable[[int, int], float]]:
    """step_seconds with the model, GPU and efficiencies bound and validated once.

    Returns (fn, decode): fn(prefill, decode_seqs, decode_kv_tokens) -> seconds, the same
    roofline as step_seconds (which calls it) without per-call argument checks (the cluster
    simulator evaluates ~10^5 steps per simulated hour and engine), and
    decode(decode_seqs, decode_kv_tokens) == fn((), decode_seqs, decode_kv_tokens), bit for
    bit (the same operations in the same order), for the simulator's decode-only steps.
    """
    _check_tp(model, tp)
    _check_fraction(mfu, "mfu")
    _check_fraction(hbm_efficiency, "hbm_efficiency")
    if overhead_s < 0:
        raise ConfigError(f"overhead_s must be >= 0, got {overhead_s!r}")
    gemm_per_token = 2.0 * model.params / (tp * _gemm_peak(model, gpu, dtype) * mfu)
    attention_per_pair = _attention_flops(model, 1.0) / (tp * gpu.bf16_flops * mfu)
    weights = weight_bytes_per_gpu(model, tp)
    kv_per_token = kv_bytes_per_token(model, tp)
    hbm = gpu.hbm_bandwidth_Bps * hbm_efficiency
    # _allreduce_seconds is affine in tokens (for tokens > 0): split latency and per-token parts
    one, two = _allreduce_seconds(model, gpu, tp, 1), _allreduce_seconds(model, gpu, tp, 2)
    allreduce_fixed, allreduce_per_token = 2.0 * one - two, two - one

    def fn(prefill: Sequence[tuple[int, int]], decode_seqs: int, decode_kv_tokens: int) -> float:
        new_total = pairs = kv_touched = 0.0
        for new, context in prefill:
            new_total += new
            pairs += new * context + new * (new + 1) / 2  # _causal_pairs
            kv_touched += new + context  # write the new KV, read the context's KV once
        tokens = new_total + decode_seqs
        if tokens == 0:
            return 0.0
        pairs += decode_kv_tokens  # each decode token attends to its sequence's KV
        kv_touched += decode_kv_tokens + decode_seqs
        compute = gemm_per_token * tokens + attention_per_pair * pairs
        memory = (weights + kv_touched * kv_per_token) / hbm
        allreduce = allreduce_fixed + allreduce_per_token * tokens
        return max(compute, memory) + allreduce + overhead_s

    def decode(decode_seqs: int, decode_kv_tokens: int) -> float:
        # fn((), ...) with its zero prefill sums folded in: 0.0 + n is float(n), exactly
        tokens = 0.0 + decode_seqs
        if tokens == 0:
            return 0.0
        pairs = 0.0 + decode_kv_tokens
        kv_touched = 0.0 + (decode_kv_tokens + decode_seqs)
        compute = gemm_per_token * tokens + attention_per_pair * pairs
        memory = (weights + kv_touched * kv_per_token) / hbm
        allreduce = allreduce_fixed + allreduce_per_token * tokens
        # max(compute, memory) without the call: max keeps the first unless the second is
        # greater, so this is the same value (NaN and signed zeros included)
        return (memory if memory > compute else compute) + allreduce + overhead_s

    return fn, decode


def step_seconds_fn(
    model: Model,
    gpu: GPU,
    tp: int,
    *,
    mfu: float = DEFAULT_MFU,
    hbm_efficiency: float = DEFAULT_HBM_EFFICIENCY,
    dtype: str = "auto",
    overhead_s: float = DEFAULT_STEP_OVERHEAD_S,
) -> Callable[[Sequence[tuple[int, int]], int, int], float]:
    """fn(prefill, decode_seqs, decode_kv_tokens) -> seconds of step_seconds_fns."""
    fn, _ = step_seconds_fns(
        model, gpu, tp, mfu=mfu, hbm_efficiency=hbm_efficiency, dtype=dtype, overhead_s=overhead_s
    )
    return fn


def prefill_seconds(  # noqa: PLR0913 - one parameter per input of the roofline step time
    model: Model,
    gpu: GPU,
    tp: int,
    prompt_tokens: int,
    *,
    mfu: float = DEFAULT_MFU,
    cached_tokens: int = 0,
    chunk_tokens: int | None = None,
    hbm_efficiency: float = DEFAULT_HBM_EFFICIENCY,
    dtype: str = "auto",
    overhead_s: float = DEFAULT_STEP_OVERHEAD_S,
) -> float:
    """Seconds to prefill prompt_tokens of which cached_tokens are already in HBM, alone on the
    engine; chunk_tokens splits it into steps like vLLM's chunked prefill (None = one step)."""
    _check_count(prompt_tokens, "prompt_tokens")
    _check_count(cached_tokens, "cached_tokens")
    if cached_tokens > prompt_tokens:
        raise ConfigError(f"cached_tokens {cached_tokens} > prompt_tokens {prompt_tokens}")
    if chunk_tokens is not None and (not isinstance(chunk_tokens, int) or chunk_tokens < 1):
        raise ConfigError(f"chunk_tokens must be an integer >= 1, got {chunk_tokens!r}")
    step = chunk_tokens or max(prompt_tokens - cached_tokens, 1)
    total, done = 0.0, cached_tokens
    while done < prompt_tokens:
        new = min(step, prompt_tokens - done)
        total += step_seconds(
            model,
            gpu,
            tp,
            prefill=[(new, done)],
            mfu=mfu,
            hbm_efficiency=hbm_efficiency,
            dtype=dtype,
            overhead_s=overhead_s,
        )
        done += new
    return total


def prefill_tokens_per_second(
    model: Model, gpu: GPU, tp: int, *, mfu: float = DEFAULT_MFU, dtype: str = "auto"
) -> float:
    """Linear-term prefill throughput tp·peak·mfu / (2·N): the long-run rate without the
    attention term (derived: Llama-3.1-8B TP1 bf16 at 50 % MFU ≈ 31 k tok/s)."""
    _check_tp(model, tp)
    _check_fraction(mfu, "mfu")
    return tp * _gemm_peak(model, gpu, dtype) * mfu / (2.0 * model.params)


def transfer_seconds(
    nbytes: float,
    bandwidth_Bps: float,  # noqa: N803 - unit suffix
    *,
    latency_s: float = 0.0,
    objects: int = 1,
    concurrency: int = 1,
) -> float:
    """objects · latency (ceil(objects / concurrency) rounds when several are in flight) plus
    nbytes / bandwidth. Nothing to move costs nothing."""
    if not math.isfinite(nbytes) or nbytes < 0:
        raise ConfigError(f"nbytes must be >= 0, got {nbytes!r}")
    if not math.isfinite(bandwidth_Bps) or bandwidth_Bps <= 0:
        raise ConfigError(f"bandwidth_Bps must be > 0, got {bandwidth_Bps!r}")
    if latency_s < 0:
        raise ConfigError(f"latency_s must be >= 0, got {latency_s!r}")
    if isinstance(objects, bool) or not isinstance(objects, int) or objects < 1:
        raise ConfigError(f"objects must be an integer >= 1, got {objects!r}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigError(f"concurrency must be an integer >= 1, got {concurrency!r}")
    if nbytes == 0:
        return 0.0
    return math.ceil(objects / concurrency) * latency_s + nbytes / bandwidth_Bps


# LMCache stores KV in chunks of 256 tokens by default (`--chunk-size` 256
# [source: lmcache-mp-docs]):
# one object (file, Ceph object, S3 key, RPC) per chunk.
LMCACHE_CHUNK_TOKENS = 256


def tier_read_seconds(
    model: Model,
    tier: Tier,
    tokens: int,
    *,
    tp: int = 1,
    compression: float = 1.0,
    chunk_tokens: int = LMCACHE_CHUNK_TOKENS,
    bound: str = "nominal",
) -> float:
    """Seconds to read `tokens` of the engine's KV from `tier`: one object per chunk,
    bandwidth × compression (CacheGen shrinks KV 3.5–4.3× [source: cachegen-2024]), × tp for per-GPU
    links. bound="low" takes the best bandwidth and latency, "high" the worst."""
    _check_tp(model, tp)
    _check_count(tokens, "tokens")
    if not (isinstance(compression, int | float) and compression >= 1):
        raise ConfigError(f"compression must be >= 1, got {compression!r}")
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise ConfigError(f"chunk_tokens must be an integer >= 1, got {chunk_tokens!r}")
    (bw_low, bw_high), (lat_low, lat_high) = tier.read_bounds, tier.latency_bounds
    choices = {
        "nominal": (tier.read_Bps, tier.latency_s),
        "low": (bw_high, lat_low),
        "high": (bw_low, lat_high),
    }
    if bound not in choices:
        raise ConfigError(f"bound must be one of {sorted(choices)}, got {bound!r}")
    if tokens == 0:
        return 0.0
    bandwidth, latency = choices[bound]
    bandwidth *= tp if tier.per_gpu else 1
    return transfer_seconds(
        tokens * kv_bytes_per_token_engine(model) / compression,
        bandwidth,
        latency_s=latency,
        objects=math.ceil(tokens / chunk_tokens),
        concurrency=tier.concurrency,
    )
