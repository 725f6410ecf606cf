"""What a cached shared prefix saves a tenant: GPU-seconds and money per hour.

A tenant sends a system prompt of P tokens with every query. Without a cache every query
re-prefills it; with one, the first query of each cache lifetime computes it and the others
reload its KV from a tier. The cost model (planner/domain/costmodel.py) gives both durations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.errors import ConfigError
from planner.domain.costmodel import DEFAULT_MFU, prefill_seconds, tier_read_seconds
from planner.domain.hardware import GPU, Model, Tier, get_gpu, get_model, get_tier


@dataclass(frozen=True, slots=True)
class Savings:
    """GPU time and money a cached shared prefix saves per hour (see prefix_savings)."""

    prefix_tokens: int
    queries_per_hour: float
    hit_probability: float
    cache_lifetime_s: float
    prefill_seconds: float  # one prefill of the prefix on one engine (tp GPUs)
    reload_seconds: float  # one reload of its KV from the tier
    reuses_per_hour: float
    saved_gpu_seconds_per_hour: float
    saved_cost_per_hour: float | None  # None when no GPU price was given
    verdict: str
    assumptions: tuple[str, ...]


def prefix_savings(  # noqa: PLR0917, PLR0913 - the issue's positional signature
    model: Model | str,
    gpu: GPU | str,
    tp: int,
    prefix_tokens: int,
    queries_per_hour: float,
    gpu_price_per_hour: float | None,
    tier: Tier | str,
    *,
    hit_probability: float = 1.0,
    mfu: float = DEFAULT_MFU,
    cache_lifetime_s: float = 3600.0,
) -> Savings:
    """Savings of caching a prefix shared by `queries_per_hour` queries of one tenant.

    Per cache lifetime the first query computes the prefix; each of the other
    (queries per lifetime − 1) hits with hit_probability and then reloads the KV from `tier`
    instead of re-prefilling it: saved = hits × (prefill − reload) engine-seconds, × tp GPUs.
    gpu_price_per_hour None prices nothing (saved_cost_per_hour is None).
    """
    m = get_model(model) if isinstance(model, str) else model
    g = get_gpu(gpu) if isinstance(gpu, str) else gpu
    t = get_tier(tier) if isinstance(tier, str) else tier
    if isinstance(prefix_tokens, bool) or not isinstance(prefix_tokens, int) or prefix_tokens < 1:
        raise ConfigError(f"prefix_tokens must be an integer >= 1, got {prefix_tokens!r}")
    for name, value in (
        ("queries_per_hour", queries_per_hour),
        ("gpu_price_per_hour", 0.0 if gpu_price_per_hour is None else gpu_price_per_hour),
        ("cache_lifetime_s", cache_lifetime_s),
    ):
        if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
            raise ConfigError(f"{name} must be a number >= 0, got {value!r}")
    if cache_lifetime_s == 0:
        raise ConfigError("cache_lifetime_s must be > 0")
    if not 0 <= hit_probability <= 1:
        raise ConfigError(f"hit_probability must be in [0, 1], got {hit_probability!r}")
    prefill = prefill_seconds(m, g, tp, prefix_tokens, mfu=mfu)
    reload = tier_read_seconds(m, t, prefix_tokens, tp=tp)
    per_lifetime = queries_per_hour * cache_lifetime_s / 3600
    reuses = max(per_lifetime - 1, 0.0) * hit_probability * 3600 / cache_lifetime_s
    gpu_seconds = reuses * (prefill - reload) * tp
    cost = None if gpu_price_per_hour is None else gpu_seconds / 3600 * gpu_price_per_hour
    priced = "" if cost is None else f" ({cost:.2f}/h at {gpu_price_per_hour:g}/GPU-h)"
    verdict = (
        f"caching saves {gpu_seconds:,.0f} GPU-s/h{priced}"
        if gpu_seconds > 0
        else "caching does not pay: reloading from the tier is slower than re-prefill"
        if prefill <= reload
        else "nothing to save: fewer than two queries per cache lifetime"
    )
    assumptions = (
        f"prefill of {prefix_tokens} tokens on {tp}× {g.name} at {mfu:.0%} MFU (cost model, "
        "engine otherwise idle): 2·N·S + attention FLOPs (Kaplan et al. 2020)",
        f"reload from {t.name}: {t.read_Bps / 1e9:.3g} GB/s"
        + (f" per GPU × {tp} GPUs" if t.per_gpu else "")
        + f", {t.latency_s * 1e3:.3g} ms per "
        f"256-token chunk ({t.source})",
        f"{queries_per_hour:g} queries/h evenly spread; the prefix is computed once per "
        f"{cache_lifetime_s:g} s cache lifetime, then hits with probability {hit_probability:g}",
        "baseline: without the cache every query re-prefills the prefix (it was evicted or "
        "routed to another engine); the engine is busy during the reload (no overlap)",
        f"{tp} GPUs per engine; "
        + (
            "no GPU price given: GPU-seconds only"
            if gpu_price_per_hour is None
            else f"GPU price {gpu_price_per_hour:g} per GPU-hour"
        ),
    )
    return Savings(
        prefix_tokens,
        float(queries_per_hour),
        hit_probability,
        cache_lifetime_s,
        prefill,
        reload,
        reuses,
        gpu_seconds,
        cost,
        verdict,
        assumptions,
    )
