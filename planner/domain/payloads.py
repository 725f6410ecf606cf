"""The answers of `kvscope costmodel compare-tiers` and `kvscope costmodel savings`, which are
also those of POST /v1/costmodel/compare-tiers and /v1/costmodel/savings: the JSON-ready
payload from the inputs, assembled here once for both edges.

Each edge checks the form of its inputs (typer options, pydantic bounds); the domain checks
are here: an unknown model, GPU, tier or KV dtype, a TP the model cannot be split over, a
number out of range raise :class:`InputError`. Its ``field`` is the input's key (the API's
body field) and its message starts with ``label(field)`` (the CLI passes its --option names).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from core.errors import ConfigError, InputError
from planner.domain.breakeven import DEFAULT_MFU_RANGE, KV_DTYPES, case_note, compare_tiers
from planner.domain.costmodel import kv_bytes_per_token, kv_bytes_per_token_engine
from planner.domain.hardware import Catalog, builtin_catalog, with_kv_dtype
from planner.domain.savings import prefix_savings

Label = Callable[[str], str]

SAVINGS_FORMULA = (
    "saved_gpu_seconds_per_hour = reuses_per_hour × (prefill_seconds − reload_seconds) × tp; "
    "reuses_per_hour = max(queries per lifetime − 1, 0) × hit_probability × lifetimes per "
    "hour; saved_usd_per_hour = saved_gpu_seconds_per_hour / 3600 × gpu_hour_usd"
)


@contextmanager
def _about(field: str, label: Label) -> Iterator[None]:
    """A ConfigError inside becomes an InputError about `field`, prefixed with its label."""
    try:
        yield
    except ConfigError as exc:
        raise InputError(field, f"{label(field)}: {exc}") from exc


def _check(ok: bool, field: str, requirement: str, value: object, *, label: Label) -> None:
    if not ok:
        raise InputError(field, f"{label(field)} must be {requirement}, got {value!r}")


def compare_tiers_payload(
    *,
    model: str,
    gpu: str,
    tp: int,
    tokens: int,
    tiers: Sequence[str] | None,
    kv_dtype: str,
    catalog: Catalog | None = None,
    label: Label = str,
) -> dict[str, Any]:
    """Re-read `tokens` of a prompt's KV from each tier, or re-prefill it? One comparison per
    KV dtype × tier.

    Names resolve in `catalog` (None: the built-in one); tiers None = every tier of the
    catalogue, a tier named twice (or by an alias) counts once; kv_dtype: auto (the model's),
    bf16, fp8 or both (fp8 then bf16).
    """
    cat = catalog if catalog is not None else builtin_catalog()
    with _about("model", label):
        m = cat.model(model)
    with _about("gpu", label):
        g = cat.gpu(gpu)
    with _about("tp", label):
        kv_bytes_per_token(m, tp)  # tp >= 1 and compatible with the model's heads
    _check(tokens >= 1, "tokens", "an integer >= 1", tokens, label=label)
    known = (*KV_DTYPES, "both")
    if kv_dtype not in known:
        raise InputError(
            "kv_dtype",
            f"{label('kv_dtype')}: unknown KV dtype {kv_dtype!r}; known: {', '.join(known)}",
        )
    if tiers is not None and not tiers:
        known_tiers = ", ".join(sorted(cat.tiers))
        raise InputError("tiers", f"{label('tiers')}: no tier named; known: {known_tiers}")
    with _about("tiers", label):
        chosen = list(cat.tiers.values()) if tiers is None else [cat.tier(n) for n in tiers]
    dtypes = ("fp8", "bf16") if kv_dtype == "both" else (kv_dtype,)
    result = compare_tiers(m, g, tp, tokens, tiers=chosen, kv_dtypes=dtypes, catalog=cat)
    notes = {case_note(m, g, tp, t, tokens) for t in chosen} - {None}
    rows = [(kv, c) for kv, by_tier in result.items() for c in by_tier.values()]
    return {
        "model": m.name,
        "gpu": g.name,
        "tp": tp,
        "tokens": tokens,
        "kv_dtypes": list(result),
        "tiers": list(dict.fromkeys(t.name for t in chosen)),
        "mfu_range": dict(zip(("low", "high"), DEFAULT_MFU_RANGE, strict=True)),
        "note": next(iter(notes), None),
        "comparisons": [{"kv_dtype": kv, **c.to_dict()} for kv, c in rows],
    }


def savings_payload(  # noqa: PLR0913 - one parameter per field of the savings question (the API's)
    *,
    model: str,
    gpu: str,
    tp: int,
    tier: str,
    kv_dtype: str,
    prefix_tokens: int,
    queries_per_hour: float,
    gpu_hour_usd: float | None,
    mfu: float,
    hit_probability: float,
    cache_lifetime_s: float,
    catalog: Catalog | None = None,
    label: Label = str,
) -> dict[str, Any]:
    """What caching a tenant's shared prefix of `prefix_tokens` saves: GPU-seconds per hour,
    and USD per hour when gpu_hour_usd is given (planner.domain.savings.prefix_savings).

    Names resolve in `catalog` (None: the built-in one); kv_dtype: auto (the model's), bf16
    or fp8.
    """
    cat = catalog if catalog is not None else builtin_catalog()
    with _about("model", label):
        base = cat.model(model)
    with _about("kv_dtype", label):
        m = with_kv_dtype(base, kv_dtype)
    with _about("gpu", label):
        g = cat.gpu(gpu)
    with _about("tier", label):
        t = cat.tier(tier)
    with _about("tp", label):
        kv_bytes_per_token(m, tp)  # tp >= 1 and compatible with the model's heads
    _check(prefix_tokens >= 1, "prefix_tokens", "an integer >= 1", prefix_tokens, label=label)
    for field, value in (
        ("queries_per_hour", queries_per_hour),
        ("gpu_hour_usd", 0.0 if gpu_hour_usd is None else gpu_hour_usd),
    ):
        _check(math.isfinite(value) and value >= 0, field, "a number >= 0", value, label=label)
    _check(0 < mfu <= 1, "mfu", "in (0, 1]", mfu, label=label)
    _check(0 <= hit_probability <= 1, "hit_probability", "in [0, 1]", hit_probability, label=label)
    ok_lifetime = math.isfinite(cache_lifetime_s) and cache_lifetime_s > 0
    _check(
        ok_lifetime, "cache_lifetime_s", "a number of seconds > 0", cache_lifetime_s, label=label
    )
    s = prefix_savings(
        m,
        g,
        tp,
        prefix_tokens,
        queries_per_hour,
        gpu_hour_usd,
        t,
        hit_probability=hit_probability,
        mfu=mfu,
        cache_lifetime_s=cache_lifetime_s,
    )
    kv_pt = kv_bytes_per_token_engine(m)
    return {
        "model": m.name,
        "gpu": g.name,
        "tp": tp,
        "tier": t.name,
        "kv_bytes_per_token": kv_pt,
        "prefix_tokens": prefix_tokens,
        "prefix_kv_bytes": kv_pt * prefix_tokens,
        "queries_per_hour": s.queries_per_hour,
        "hit_probability": s.hit_probability,
        "cache_lifetime_s": s.cache_lifetime_s,
        "mfu": mfu,
        "prefill_seconds": s.prefill_seconds,
        "reload_seconds": s.reload_seconds,
        "reuses_per_hour": s.reuses_per_hour,
        "saved_gpu_seconds_per_hour": s.saved_gpu_seconds_per_hour,
        "gpu_hour_usd": gpu_hour_usd,
        "saved_usd_per_hour": s.saved_cost_per_hour,
        "formula": SAVINGS_FORMULA,
        "verdict": s.verdict,
        "sources": {"model": m.source, "gpu": g.source, "tier": t.source},
        "assumptions": list(s.assumptions),
    }
