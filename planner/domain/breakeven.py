"""Re-read the KV cache from a tier, or re-prefill it? Break-even bandwidth and context.

B* = KV bytes of a prompt / its prefill time: a tier reading faster than B* (times the KV
compression) beats recomputing. The per-object latency of a tier favours recompute for short
prompts, the quadratic attention term favours reading for long ones (derived from the
prefill FLOPs of [source: kaplan-scaling-laws-2020]).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from core.errors import ConfigError
from planner.domain.costmodel import (
    DEFAULT_HBM_EFFICIENCY,
    DEFAULT_MFU,
    LMCACHE_CHUNK_TOKENS,
    kv_bytes_per_token_engine,
    prefill_seconds,
    tier_read_seconds,
)
from planner.domain.hardware import (
    GPU,
    Catalog,
    Model,
    Tier,
    builtin_catalog,
    get_gpu,
    get_model,
    get_tier,
    with_kv_dtype,
)

# Llama 3.1 / Qwen3 (YaRN) context windows are 128 K tokens: search no further by default.
DEFAULT_MAX_CONTEXT = 131_072

LLAMA_70B_4K_CEPH_HDD_NOTE = (
    "Llama-3.1-70B FP8, 4 K tokens, KV cache on HDD-backed Ceph (LMCache): re-read or "
    "re-prefill? A quoted '500 MB' of KV for this prompt is inconsistent with the model: "
    "Llama-3.1-70B keeps 2 × 80 layers × 8 KV heads × 128 dims per token = 163,840 B with "
    "fp8 KV (--kv-cache-dtype fp8) and 327,680 B with bf16 KV (the default even for FP8 "
    "weights), so "
    "4,096 tokens are 0.67 GB (fp8 KV) or 1.34 GB (bf16 KV), not 0.5 GB. Reading them from "
    "HDD-backed Ceph (0.83 GB/s aggregate, 0.1–0.3 GB/s for one stream, 5–15 ms per object) "
    "takes ~0.9–14 s; re-prefill on 4× H100 (TP4, FP8 GEMMs, 20–60 % MFU) takes ~0.17–0.43 s. "
    "Re-prefill wins unless the KV is compressed (CacheGen 3.5–4.3× [source: cachegen-2024]), "
    "the GPUs are compute-saturated, or loading overlaps compute (Cake [source: cake-2024])."
)
# The case LLAMA_70B_4K_CEPH_HDD_NOTE describes: model, GPU, TP, tier (catalogue names), tokens.
# "70B FP8" = Llama-3.1-70B with FP8 weights on 4× H100 SXM5 (70 GB of weights need at least
# two 80 GB GPUs; TP4 leaves room for KV).
LLAMA_70B_4K_CEPH_HDD_CASE = ("llama-3.1-70b-fp8", "h100-80gb", 4, "ceph-hdd", 4096)

# KV cache dtype names by bytes per element, and the dtypes compare_tiers takes.
KV_DTYPE_BY_BYTES = {2.0: "bf16", 1.0: "fp8"}
KV_DTYPES = ("auto", "bf16", "fp8")
# Prefill MFU range of the re-read vs re-prefill comparisons (low, high).
DEFAULT_MFU_RANGE = (0.2, 0.6)


@dataclass(frozen=True, slots=True)
class BreakevenContext:
    """Prompt length above which reading the KV from `tier` beats re-prefill.

    regime "above": reading wins from `tokens` on; "always": it wins even for one chunk;
    "never": it loses up to max_tokens (tokens is None in the last two).
    """

    tier: str
    tokens: int | None
    regime: str
    explanation: str


@dataclass(frozen=True, slots=True)
class Comparison:
    """Re-read vs re-prefill of `tokens` for one model / GPU / TP / tier, as ranges."""

    model: str
    gpu: str
    tp: int
    tier: str
    tokens: int
    kv_bytes_per_token: float
    kv_bytes: float  # stored on the tier, before compression
    compression: float
    objects: int
    read_seconds_low: float
    read_seconds_high: float
    prefill_seconds_low: float
    prefill_seconds_high: float
    verdict: str  # "re-prefill" | "re-read" | "depends"
    explanation: str
    assumptions: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, every number with its unit in the key."""
        d = asdict(self)
        return {
            "model": d["model"],
            "gpu": d["gpu"],
            "tp": d["tp"],
            "tier": d["tier"],
            "tokens": d["tokens"],
            "kv_bytes_per_token": d["kv_bytes_per_token"],
            "kv_bytes": d["kv_bytes"],
            "kv_gb": round(d["kv_bytes"] / 1e9, 3),
            "compression_ratio": d["compression"],
            "objects": d["objects"],
            "read_seconds": {"low": d["read_seconds_low"], "high": d["read_seconds_high"]},
            "prefill_seconds": {"low": d["prefill_seconds_low"], "high": d["prefill_seconds_high"]},
            "verdict": d["verdict"],
            "explanation": d["explanation"],
            "assumptions": list(d["assumptions"]),
        }


def breakeven_bandwidth(
    model: Model, gpu: GPU, tp: int, *, mfu: float = DEFAULT_MFU, prompt_tokens: int = 4096
) -> float:
    """B* in bytes/s: the engine's KV bytes of the prompt / the prompt's prefill seconds.

    Llama-3.1-8B TP1 bf16 at 50 % MFU: ~31 k tok/s × 131,072 B ≈ 4.0 GB/s (derived).
    """
    if prompt_tokens < 1:
        raise ConfigError(f"prompt_tokens must be >= 1, got {prompt_tokens!r}")
    seconds = prefill_seconds(model, gpu, tp, prompt_tokens, mfu=mfu)
    return prompt_tokens * kv_bytes_per_token_engine(model) / seconds


def breakeven_context(
    model: Model,
    gpu: GPU,
    tp: int,
    tier: Tier,
    *,
    mfu: float = DEFAULT_MFU,
    compression: float = 1.0,
    chunk_tokens: int = LMCACHE_CHUNK_TOKENS,
    max_tokens: int = DEFAULT_MAX_CONTEXT,
) -> BreakevenContext:
    """Smallest prompt length from which reading `tier` (nominal figures) beats re-prefill for
    every longer prompt up to max_tokens, to chunk granularity then refined by bisection."""
    if max_tokens < chunk_tokens:
        raise ConfigError(f"max_tokens {max_tokens} < chunk_tokens {chunk_tokens}")

    def read_wins(tokens: int) -> bool:
        read = tier_read_seconds(
            model, tier, tokens, tp=tp, compression=compression, chunk_tokens=chunk_tokens
        )
        return read < prefill_seconds(model, gpu, tp, tokens, mfu=mfu)

    # Check both ends of every chunk: the per-object latency makes the margin a sawtooth.
    grid = [
        t
        for k in range(1, max_tokens // chunk_tokens + 1)
        for t in (k * chunk_tokens - chunk_tokens + 1, k * chunk_tokens)
    ]
    losing = [t for t in grid if not read_wins(t)]
    bw = tier.read_Bps * compression * (tp if tier.per_gpu else 1)
    b_star = breakeven_bandwidth(model, gpu, tp, mfu=mfu, prompt_tokens=max_tokens)
    if not losing:
        return BreakevenContext(
            tier.name,
            None,
            "always",
            f"reading at {bw / 1e9:.3g} GB/s beats re-prefill for every prompt length "
            f"(B* ≈ {b_star / 1e9:.3g} GB/s at {max_tokens} tokens)",
        )
    last = losing[-1]
    if last == grid[-1]:
        return BreakevenContext(
            tier.name,
            None,
            "never",
            f"reading at {bw / 1e9:.3g} GB/s loses to re-prefill up to {max_tokens} tokens "
            f"(B* ≈ {b_star / 1e9:.3g} GB/s even at that length)",
        )
    low, high = last, grid[grid.index(last) + 1]  # loses at low, wins at high
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if read_wins(mid) else (mid, high)
    return BreakevenContext(
        tier.name,
        high,
        "above",
        f"reading at {bw / 1e9:.3g} GB/s wins from {high} tokens on: below, the per-object "
        f"latency ({tier.latency_s * 1e3:.3g} ms per {chunk_tokens}-token chunk) or the "
        "linear prefill rate favours recompute",
    )


def reread_vs_reprefill(
    model: Model,
    gpu: GPU,
    tp: int,
    tier: Tier,
    tokens: int,
    *,
    mfu_range: tuple[float, float] = DEFAULT_MFU_RANGE,
    compression: float = 1.0,
    chunk_tokens: int = LMCACHE_CHUNK_TOKENS,
) -> Comparison:
    """Ranges of read seconds (best bandwidth + lowest latency … worst) and of re-prefill
    seconds (mfu_range high … low) for `tokens`, with the verdict and its assumptions."""
    mfu_low, mfu_high = mfu_range
    if not 0 < mfu_low <= mfu_high <= 1:
        raise ConfigError(f"mfu_range must satisfy 0 < low <= high <= 1, got {mfu_range!r}")
    if tokens < 1:
        raise ConfigError(f"tokens must be >= 1, got {tokens!r}")
    kwargs: dict[str, Any] = {"tp": tp, "compression": compression, "chunk_tokens": chunk_tokens}
    read_low = tier_read_seconds(model, tier, tokens, bound="low", **kwargs)
    read_high = tier_read_seconds(model, tier, tokens, bound="high", **kwargs)
    pre_low = prefill_seconds(model, gpu, tp, tokens, mfu=mfu_high)
    pre_high = prefill_seconds(model, gpu, tp, tokens, mfu=mfu_low)
    if read_low > pre_high:
        verdict = "re-prefill"
        explanation = (
            f"re-prefill wins: the fastest read ({read_low:.3g} s) is slower than the slowest "
            f"re-prefill ({pre_high:.3g} s), unless the KV is compressed further, the GPUs are "
            "compute-saturated, or loading overlaps compute (Cake [source: cake-2024])"
        )
    elif read_high < pre_low:
        verdict = "re-read"
        explanation = (
            f"re-read wins: the slowest read ({read_high:.3g} s) beats the fastest re-prefill "
            f"({pre_low:.3g} s), and it also frees the GPUs for other work"
        )
    else:
        verdict = "depends"
        explanation = (
            f"the ranges overlap (read {read_low:.3g}–{read_high:.3g} s, re-prefill "
            f"{pre_low:.3g}–{pre_high:.3g} s): fit the tier bandwidth and the MFU from "
            "this cluster's metrics to decide"
        )
    kv_pt = kv_bytes_per_token_engine(model)
    objects = math.ceil(tokens / chunk_tokens)
    gemm = "fp8" if model.weight_bytes_per_param <= 1 else "bf16"
    assumptions = (
        f"model {model.name}: {model.params / 1e9:.1f} B params, {model.weight_bytes_per_param:g}"
        f" B/param weights, KV {model.kv_bytes_per_elem:g} B/element = {kv_pt:,.0f} B/token "
        f"({model.source})",
        f"GPU {tp}× {gpu.name}: {gemm} GEMMs at {mfu_low:.0%}–{mfu_high:.0%} MFU, attention at "
        f"the bf16 peak, HBM efficiency {DEFAULT_HBM_EFFICIENCY:.0%}, engine otherwise idle "
        f"({gpu.source})",
        "re-prefill FLOPs = 2·N·S + 2·layers·S²·d_attn (Kaplan et al. 2020, Table 1), one step",
        f"tier {tier.name}: read {tier.read_bounds[0] / 1e9:.3g}–{tier.read_bounds[1] / 1e9:.3g}"
        f" GB/s, {tier.latency_bounds[0] * 1e3:.3g}–{tier.latency_bounds[1] * 1e3:.3g} ms per "
        f"object, {tier.concurrency} object(s) in flight ({tier.source})",
        f"{objects} objects of {chunk_tokens} tokens (LMCache --chunk-size default 256)",
        f"KV compression {compression:g}× (CacheGen reaches 3.5–4.3×); decompression cost ignored",
        "no overlap of loading and compute; the tier→host→GPU copy over PCIe is not the bottleneck",
    )
    return Comparison(
        model=model.name,
        gpu=gpu.name,
        tp=tp,
        tier=tier.name,
        tokens=tokens,
        kv_bytes_per_token=kv_pt,
        kv_bytes=kv_pt * tokens,
        compression=float(compression),
        objects=objects,
        read_seconds_low=read_low,
        read_seconds_high=read_high,
        prefill_seconds_low=pre_low,
        prefill_seconds_high=pre_high,
        verdict=verdict,
        explanation=explanation,
        assumptions=assumptions,
    )


def kv_dtype_name(model: Model) -> str:
    """The model's KV cache dtype, "bf16" or "fp8" (else its size, "<n> B/element")."""
    size = model.kv_bytes_per_elem
    return KV_DTYPE_BY_BYTES.get(size, f"{size:g} B/element")


def case_note(model: Model, gpu: GPU, tp: int, tier: Tier, tokens: int) -> str | None:
    """LLAMA_70B_4K_CEPH_HDD_NOTE when the comparison is the case it describes, else None."""
    case = (model.name, gpu.name, tp, tier.name, tokens)
    return LLAMA_70B_4K_CEPH_HDD_NOTE if case == LLAMA_70B_4K_CEPH_HDD_CASE else None


def compare_tiers(  # noqa: PLR0913 - keyword-only options of the comparison
    model: Model | str,
    gpu: GPU | str,
    tp: int,
    tokens: int,
    *,
    tiers: Sequence[Tier | str] | None = None,
    kv_dtypes: Sequence[str] = ("auto",),
    catalog: Catalog | None = None,
    mfu_range: tuple[float, float] = DEFAULT_MFU_RANGE,
    compression: float = 1.0,
) -> dict[str, dict[str, Comparison]]:
    """Re-read `tokens` of KV from each tier or re-prefill them, for each KV dtype.

    Returns {kv dtype: {tier name: Comparison}} in the order asked (duplicates dropped).
    Names resolve in `catalog` (default: the built-in one); tiers None = every tier of the
    catalogue; kv_dtypes: "auto" (the model's own, keyed by its name), "bf16", "fp8".
    """
    m = get_model(model, catalog) if isinstance(model, str) else model
    g = get_gpu(gpu, catalog) if isinstance(gpu, str) else gpu
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ConfigError(f"tokens must be an integer >= 1, got {tokens!r}")
    if tiers is None:
        tiers = list((catalog or builtin_catalog()).tiers.values())
    resolved = [get_tier(t, catalog) if isinstance(t, str) else t for t in tiers]
    if not resolved:
        raise ConfigError("tiers must name at least one tier")
    if not kv_dtypes:
        raise ConfigError(f"kv_dtypes must name at least one of {', '.join(KV_DTYPES)}")
    result: dict[str, dict[str, Comparison]] = {}
    for kv in kv_dtypes:
        if kv not in KV_DTYPES:
            raise ConfigError(f"unknown KV dtype {kv!r}; known: {', '.join(KV_DTYPES)}")
        variant = with_kv_dtype(m, kv)
        rows = result.setdefault(kv_dtype_name(variant), {})
        for t in resolved:
            if t.name not in rows:
                rows[t.name] = reread_vs_reprefill(
                    variant, g, tp, t, tokens, mfu_range=mfu_range, compression=compression
                )
    return result
