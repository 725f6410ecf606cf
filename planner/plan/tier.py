"""The plan's "What a CPU tier would buy": from each engine's own reuse, before anything is
deployed.

Per engine, the AET hit-ratio curve from vLLM's residency histograms (planner/fit/reuse.py,
[source: hu-aet-2016]) gives, for a native CPU tier or an LMCache pool of 0.5×–4× the HBM KV
size, the extra hit ratio, the re-prefill avoided and its GPU cost, the modelled capacity at
the SLO, and a recommended size. Intervals are model-based, not over engines.

Method: planner/plan/METHODS.md#tier
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from core.errors import ConfigError, KvscopeError
from planner.domain.costmodel import DEFAULT_MFU, prefill_tokens_per_second
from planner.domain.slo import Slo
from planner.fit.capacity import unit_capacity, violations
from planner.fit.common import Estimate
from planner.fit.reuse import (
    GIB,
    Histogram,
    ReuseFit,
    ReuseInputs,
    TierGain,
    bytes_per_block,
    fit_reuse,
    lmcache_pool_gain,
    native_offload_gain,
)
from planner.fit.units import engine_rows

if TYPE_CHECKING:
    import pandas as pd

    from planner.frames.residency import BucketCounts
    from planner.plan.fits import Hardware
    from store.tables import EngineRecord

MULTIPLES = (0.5, 1.0, 2.0, 4.0)
CURVE_POINTS = 25  # the plot's curve: 0 … CURVE_TOP × HBM
CURVE_TOP = 4.0
LEVEL = 0.9
# Each engine's fit bootstraps its histograms N_BOOT times and every tier size and the knee
# are read on each replicate (~0.3 s an engine here); MAX_FITTED engines spread over the
# load stand for the rest, which keeps a 1,000-engine plan's section within seconds.
N_BOOT = 50
MAX_FITTED = 8
REUSE = "kv_block_reuse_gap_seconds"
IDLE = "kv_block_idle_before_evict_seconds"
LIFETIME = "kv_block_lifetime_seconds"
NEEDED = (REUSE, IDLE, LIFETIME)
ENABLE = (
    "start each vLLM engine with --kv-cache-metrics (added by vLLM pull request 27793; 0.33 has "
    "it): it samples a share "
    "of KV blocks at allocation (--kv-cache-metrics-sample, default 0.01) and exports their "
    "reuse gaps, idle time before eviction and lifetime as histograms; the cost is a few "
    "timestamps per sampled block and an observation at each sampled eviction, nothing when "
    "off [source: vllm-kv-cache-metrics]"
)
INTERVAL = (
    "model-based {level:.0f} % interval: Poisson bootstrap of the sampled histogram counts ∪ the "
    "tail families past the HBM eviction time ∪ the HBM reproduction error; not a confidence "
    "interval over engines (cluster totals add the engines' ends)"
)


@dataclass(frozen=True, slots=True)
class _Pricing:
    """What turns avoided tokens into GPU-seconds and capacity."""

    prefill_tok_s: float | None  # prefill tokens/s of one engine (cost model at the MFU)
    tp: int
    capacity: float | None  # tokens/s an engine carries at the SLO (measured), None: unknown
    capacity_why: str


@dataclass(frozen=True, slots=True)
class _Engine:
    key: str
    fit: ReuseFit
    tokens_per_s: float


def _hist(b: BucketCounts) -> Histogram:
    # Prometheus mode's increase() per bucket can dip below 0 by extrapolation noise
    return Histogram(tuple(float(x) for x in b.bounds), tuple(max(float(x), 0.0) for x in b.counts))


# the frame columns _inputs reads of an engine's rows
_INPUT_COLUMNS = ("window_s", "prefix_queries", "prefix_hit_ratio", "output_tokens_per_s",
                  "requests", "tokens_per_s")  # fmt: skip


def _inputs(
    key: str, hists: Mapping[str, BucketCounts], rows: pd.DataFrame, facts: Mapping[str, Any]
) -> tuple[ReuseInputs, float]:
    """One engine's ReuseInputs and its served tokens/s (ConfigError: why not)."""
    missing = [s for s in NEEDED if s not in hists or hists[s].total() <= 0]
    if missing:
        raise ConfigError(f"no {', '.join(missing)} observations")
    blocks, bsize = facts.get("num_gpu_blocks"), facts.get("block_size")
    if not blocks or not bsize:
        raise ConfigError("num_gpu_blocks / block_size unknown (vLLM's cache_config_info)")
    secs = rows["window_s"].to_numpy(dtype=float)
    queries = rows["prefix_queries"].to_numpy(dtype=float)
    ratio = rows["prefix_hit_ratio"].to_numpy(dtype=float)
    ok = np.isfinite(secs) & np.isfinite(queries) & np.isfinite(ratio)
    span = float(secs[ok].sum())
    if span <= 0 or queries[ok].sum() <= 0:
        raise ConfigError("no prefix-cache lookups in the period")
    lookups = float(queries[ok].sum()) / span / int(bsize)
    hits = float((queries[ok] * ratio[ok]).sum()) / span / int(bsize)
    out_tok = rows["output_tokens_per_s"].to_numpy(dtype=float)
    good_out = np.isfinite(out_tok) & np.isfinite(secs)
    decode_blocks = float((out_tok[good_out] * secs[good_out]).sum()) / span / int(bsize)
    req = rows["requests"].to_numpy(dtype=float)
    requests_per_s = float(np.nansum(req)) / span
    tok = rows["tokens_per_s"].to_numpy(dtype=float)
    good_tok = np.isfinite(tok) & np.isfinite(secs)
    tokens_per_s = float((tok[good_tok] * secs[good_tok]).sum()) / span
    # the histograms cover the windows they were summed over, of this engine's length
    window_s = hists[LIFETIME].windows * float(np.median(secs[ok])) or span
    allocations = max(lookups - hits, 0.0) + decode_blocks
    evictions = hists[LIFETIME].total()
    # vLLM does not export its sample rate: the sampled evictions over the allocations
    sample = min(1.0, evictions / (allocations * window_s)) if allocations > 0 else 1.0
    inputs = ReuseInputs(
        reuse_gap=_hist(hists[REUSE]),
        idle_before_evict=_hist(hists[IDLE]),
        lifetime=_hist(hists[LIFETIME]),
        window_s=window_s,
        lookups_per_s=lookups,
        hits_per_s=min(hits, lookups),
        hbm_blocks=int(blocks),
        block_size=int(bsize),
        sample_rate=sample,
        allocations_per_s=allocations if allocations > 0 else None,
        unhittable_per_s=requests_per_s,
        name=key,
    )
    return inputs, tokens_per_s


def _est(e: Estimate | None, add: float = 0.0, top: float = math.inf) -> dict[str, float | None]:
    """{"estimate", "lo", "hi"} of ``e + add``, capped at ``top`` (a hit ratio at 1)."""
    if e is None:
        return {"estimate": None, "lo": None, "hi": None}

    def f(x: float) -> float | None:
        return min(x + add, top) if math.isfinite(x) else None

    return {"estimate": f(e.value), "lo": f(e.interval.lo), "hi": f(e.interval.hi)}


def _sum(parts: Sequence[dict[str, float | None]]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for k in ("estimate", "lo", "hi"):
        vals = [p[k] for p in parts]
        out[k] = None if any(v is None for v in vals) else float(sum(v for v in vals if v))
    return out


def _mean(parts: Sequence[dict[str, float | None] | None]) -> dict[str, float | None] | None:
    """The plain mean of several engines' (or pools') estimates, bound by bound; None when
    one of them has none."""
    if any(p is None for p in parts):
        return None
    out: dict[str, float | None] = {}
    for k in ("estimate", "lo", "hi"):
        vals = [p[k] for p in parts if p is not None]
        out[k] = None if any(v is None for v in vals) else sum(v for v in vals if v) / len(vals)
    return out


def _capacity_share(
    frame: pd.DataFrame, rows_of: Mapping[str, Any], engines: Sequence[str], slo: Slo
) -> tuple[float | None, str]:
    """Geometric mean capacity at the SLO (tokens/s per engine) of ``engines`` with a
    measured one, or None and why (planner/fit/capacity.py)."""
    caps = []
    for key in engines:
        rows = frame.iloc[rows_of[key]]
        value, status = unit_capacity(
            rows["tokens_per_s"].to_numpy(dtype=float), violations(rows, slo)
        )
        if status == "measured" and math.isfinite(value) and value > 0:
            caps.append(value)
    if not caps:
        return None, (
            f"no engine has windows on both sides of the SLO ({slo.text()}): its capacity, "
            "which the gain is a share of, is unknown"
        )
    return float(np.exp(np.mean(np.log(caps)))), f"{len(caps)} engine(s) with a measured capacity"


def _rows(
    gain: TierGain,
    engines: Sequence[_Engine],
    hbm_gib: float,
    *,
    today: float,
    price: _Pricing,
) -> list[dict[str, Any]]:
    """The JSON rows of one engine's (native) or one pool's (LMCache) tier points."""
    served = sum(e.tokens_per_s for e in engines)
    prefill_tok_s, tp, capacity = price.prefill_tok_s, price.tp, price.capacity
    rows = []
    for p in gain.points[: len(MULTIPLES)]:
        multiple = p.size_gib / hbm_gib if hbm_gib > 0 else math.nan
        label = f"{multiple:g}× HBM"
        tokens = _est(p.avoided_prefill_tokens_per_s)
        gpu_h: dict[str, float | None] = {"estimate": None, "lo": None, "hi": None}
        cap: dict[str, float | None] | None = None
        if prefill_tok_s:
            gpu_h = {k: (v * 3600.0 * tp / prefill_tok_s if v is not None else None)
                     for k, v in tokens.items()}  # fmt: skip
            if capacity is not None and served > 0:
                cap = {}
                for k, v in tokens.items():
                    # engine-seconds saved per served token × tokens/s an engine carries at
                    # its capacity = the share of its time at capacity the tier frees
                    share = (v / prefill_tok_s) / served * capacity if v is not None else None
                    cap[k] = 1.0 / (1.0 - share) if share is not None and share < 1 else None
        rows.append({
            "label": label,
            "multiple": multiple,
            "gib": p.size_gib,
            "hit_ratio": _est(p.extra_hit_ratio, add=today, top=1.0),
            "extra_hit_ratio": _est(p.extra_hit_ratio),
            "avoided_prefill_tokens_per_s": tokens,
            "prefill_gpu_seconds_saved_per_hour": gpu_h,
            "capacity_ratio": cap,
            "capacity_why": "" if cap is not None else price.capacity_why,
            "extrapolated": p.extrapolated,
            "can_tell": p.can_tell,
            "why": p.why,
        })  # fmt: skip
    return rows


def _tier(
    mode: str,
    gains: Sequence[tuple[TierGain, Sequence[_Engine]]],
    hbm_gib: float,
    today: float,
    *,
    price: _Pricing,
    scope: str,
    scale: float = 1.0,
) -> dict[str, Any]:
    """One tier's JSON: rows at the multiples, the recommended size. ``scale``: engines
    represented per engine fitted (MAX_FITTED), applied to the cluster totals."""
    parts = [_rows(g, engs, hbm_gib, today=today, price=price) for g, engs in gains]
    rows = _merge(parts)
    for r in rows:
        for k in ("avoided_prefill_tokens_per_s", "prefill_gpu_seconds_saved_per_hour"):
            r[k] = {b: (v * scale if v is not None else None) for b, v in r[k].items()}
    knees = [g.knee for g, _ in gains if g.knee.size_gib is not None]
    recommended: dict[str, Any] | None = None
    if knees:
        sizes = [k.size_gib.value for k in knees if k.size_gib is not None]
        gib = float(math.ceil(max(sizes)))
        told = [r["gib"] for r in rows if r["can_tell"]]
        within = bool(told) and gib <= max(told) * (1 + 1e-9)
        recommended = {
            "gib": gib,
            "multiple": gib / hbm_gib if hbm_gib > 0 else None,
            "can_tell": within,
            "why": (
                f"the knee: past it each GiB adds less than {knees[0].fraction * 100:.0f} % of "
                "the hits the first GiB past HBM adds"
                + (
                    ""
                    if within
                    else "; past the largest size the model can tell, so sizing does not use it"
                )
            ),
            "extrapolated": any(k.extrapolated for k in knees),
            "interval_gib": _est(
                max((k.size_gib for k in knees if k.size_gib is not None), key=lambda e: e.value)
            ),
        }
    else:
        why = "; ".join(sorted({g.knee.why for g, _ in gains if g.knee.why})) or "no gain"
        recommended = {"gib": None, "multiple": None, "can_tell": False, "why": why,
                       "extrapolated": False, "interval_gib": _est(None)}  # fmt: skip
    return {
        "scope": scope,
        "lower_bound": mode == "lmcache",
        "rows": rows,
        "recommended": recommended,
        "assumptions": list(gains[0][0].assumptions) if gains else [],
    }


def _merge(parts: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Rows of several engines (native) or pools (LMCache) at the same sizes: totals add
    (interval ends too: an envelope), ratios are the plain mean (the engines of one model
    group carry similar loads)."""
    if len(parts) == 1:
        return parts[0]
    out = []
    for same in zip(*parts, strict=True):
        first = dict(same[0])
        for k in ("avoided_prefill_tokens_per_s", "prefill_gpu_seconds_saved_per_hour"):
            first[k] = _sum([r[k] for r in same])
        for k in ("hit_ratio", "extra_hit_ratio", "capacity_ratio"):
            first[k] = _mean([r[k] for r in same])
        first["extrapolated"] = any(r["extrapolated"] for r in same)
        first["can_tell"] = all(r["can_tell"] for r in same)
        first["why"] = "; ".join(
            dict.fromkeys(part for r in same for part in str(r["why"]).split("; ") if part)
        )
        out.append(first)
    return out


def recommended_gib(section: Mapping[str, Any], mode: str) -> float | None:
    """The recommended size of ``mode``'s tier (GiB per engine for native, per pool for
    LMCache) of a ``cpu_tier`` section, for sizing: None when it recommends none or when
    the size lies past what the model can tell."""
    rec = (section.get(mode) or {}).get("recommended") or {}
    gib = rec.get("gib")
    if not rec.get("can_tell") or not isinstance(gib, int | float) or gib <= 0:
        return None
    return float(gib)


def cannot(why: str, engines_without: Sequence[str] = ()) -> dict[str, Any]:
    """The section when no engine's curve can be fitted."""
    return {
        "can_tell": False,
        "why": why,
        "enable": ENABLE,
        "engines": 0,
        "engines_without": list(engines_without),
        "level": LEVEL,
        "interval": INTERVAL.format(level=LEVEL * 100),
        "method": "",
        "assumptions": [],
        "hbm": None,
        "native": None,
        "lmcache": None,
    }


# (a native gain or a pool's LMCache gain, the engines it covers)
_Gains = list[tuple[TierGain, list[_Engine]]]


def tier_section(
    frame: pd.DataFrame,
    engines: Sequence[EngineRecord],
    hists: Mapping[str, Mapping[str, BucketCounts]],
    hw: Hardware | None,
    *,
    slo: Slo,
    mfu: float | None,
    engines_per_node: int | None,
    seed: int,
) -> dict[str, Any]:
    """The ``cpu_tier`` section of a plan (METHODS.md#tier)."""
    rows_of = engine_rows(frame)
    present = sorted(rows_of)
    ready, without, reasons = _ready(frame, engines, hists, rows_of, present)
    chosen = _spread(ready)
    fitted = _fit_engines(chosen, seed=seed, without=without, reasons=reasons)
    if not fitted:
        return cannot(_why_none_fitted(hists, present, reasons), without)
    if hw is None:
        return cannot("model/GPU/TP unknown: a GiB of CPU tier cannot be turned into KV blocks",
                      without)  # fmt: skip
    bsize = fitted[0].fit.inputs.block_size
    per_block = bytes_per_block(hw.model, bsize)
    hbm_blocks = float(np.median([e.fit.inputs.hbm_blocks for e in fitted]))
    hbm_gib = hbm_blocks * per_block / GIB
    price = _pricing(frame, rows_of, fitted, hw, mfu=mfu, slo=slo)
    lookups = sum(e.fit.inputs.lookups_per_s for e in fitted)
    today = sum(e.fit.inputs.hits_per_s for e in fitted) / lookups
    # engines with histograms each engine tried stands for (MAX_FITTED; 1 below it)
    scale = len(ready) / len(chosen)
    native, lm, per_pool = _gains(fitted, hbm_gib, per_block, engines_per_node)
    scope = (
        f"per node pool of {max(1, engines_per_node or 1)} engine(s)"
        if engines_per_node
        else "per engine (node topology unknown: a pool of one engine, the smallest merge)"
    )
    return {
        "can_tell": True,
        "why": "",
        "enable": ENABLE,
        "engines": len(fitted),
        "engines_with_histograms": len(ready),
        "engines_fitted_of": (
            f"{len(chosen)} of {len(ready)} engines with histograms fitted, spread over their "
            "load; cluster totals scaled to all of them"
            if len(chosen) < len(ready)
            else ""
        ),
        "engines_without": without,
        "engines_without_why": {k: reasons[k] for k in without},
        "level": LEVEL,
        "interval": INTERVAL.format(level=LEVEL * 100),
        "method": _METHOD,
        "assumptions": list(native[0][0].assumptions),
        "hbm": _hbm(fitted, hbm_blocks, hbm_gib, bsize),
        "capacity_basis": price.capacity_why
        + (f": {price.capacity:,.0f} tokens/s per engine at the SLO" if price.capacity else ""),
        "native": {
            **_tier("native", native, hbm_gib, today, scope="per engine", price=price, scale=scale),
            "curve": _curve(native, today),
        },
        "lmcache": {
            **_tier(
                "lmcache", lm, hbm_gib * per_pool, today, scope=scope, price=price, scale=scale
            ),
            "curve": _curve(lm, today),
        },
    }


def _ready(
    frame: pd.DataFrame,
    engines: Sequence[EngineRecord],
    hists: Mapping[str, Mapping[str, BucketCounts]],
    rows_of: Mapping[str, Any],
    present: Sequence[str],
) -> tuple[list[tuple[str, ReuseInputs, float]], list[str], dict[str, str]]:
    """(key, ReuseInputs, tokens/s) of each engine whose inputs are complete; the others'
    keys and why."""
    facts = {e.source: dict(e.facts or {}) for e in engines}
    ready: list[tuple[str, ReuseInputs, float]] = []
    without: list[str] = []
    reasons: dict[str, str] = {}
    read = frame[list(_INPUT_COLUMNS)]  # an engine's rows: the columns _inputs reads, not 31
    for key in present:
        source = key.split("/", 1)[0]
        try:
            inputs, tok = _inputs(key, hists.get(key, {}), read.iloc[rows_of[key]],
                                       facts.get(source, {}))  # fmt: skip
        except ConfigError as exc:
            without.append(key)
            reasons[key] = str(exc)
            continue
        ready.append((key, inputs, tok))
    return ready, without, reasons


def _fit_engines(
    chosen: Sequence[tuple[str, ReuseInputs, float]],
    *,
    seed: int,
    without: list[str],
    reasons: dict[str, str],
) -> list[_Engine]:
    """The engines whose reuse curve can tell; the others join ``without`` with why."""
    fitted: list[_Engine] = []
    for key, inputs, tok in chosen:
        try:
            fit = fit_reuse(inputs, level=LEVEL, n_boot=N_BOOT, seed=seed)
        except (ConfigError, KvscopeError) as exc:
            without.append(key)
            reasons[key] = str(exc)
            continue
        if not fit.can_tell:
            without.append(key)
            reasons[key] = fit.why
            continue
        fitted.append(_Engine(key, fit, tok))
    return fitted


def _why_none_fitted(
    hists: Mapping[str, Mapping[str, BucketCounts]],
    present: Sequence[str],
    reasons: Mapping[str, str],
) -> str:
    if not any(hists.get(k) for k in present):
        return (
            "no engine exports vLLM's KV residency histograms (kv_block_reuse_gap_seconds "
            "and its siblings): turn --kv-cache-metrics on"
        )
    first = next(iter(reasons.items()), ("", "no engine"))
    return f"no engine's reuse curve could be fitted ({first[0]}: {first[1]})"


def _pricing(
    frame: pd.DataFrame,
    rows_of: Mapping[str, Any],
    fitted: Sequence[_Engine],
    hw: Hardware,
    *,
    mfu: float | None,
    slo: Slo,
) -> _Pricing:
    """Prefill tokens/s of one engine at the MFU and the engines' capacity at the SLO."""
    prefill_tok_s = prefill_tokens_per_second(hw.model, hw.gpu, hw.tp, mfu=mfu or DEFAULT_MFU)
    capacity, capacity_why = _capacity_share(frame, rows_of, [e.key for e in fitted], slo)
    return _Pricing(prefill_tok_s, hw.tp, capacity, capacity_why)


def _gains(
    fitted: Sequence[_Engine], hbm_gib: float, per_block: float, engines_per_node: int | None
) -> tuple[_Gains, _Gains, int]:
    """Each engine's native gain, each node pool's LMCache gain (at the multiples of HBM,
    then along the curve) and the engines per pool."""
    sizes = [m * hbm_gib for m in MULTIPLES]
    grid = [CURVE_TOP * hbm_gib * i / (CURVE_POINTS - 1) for i in range(CURVE_POINTS)]
    native = [(native_offload_gain(e.fit, [*sizes, *grid], bytes_per_block=per_block), [e])
              for e in fitted]  # fmt: skip
    per_node = max(1, engines_per_node or 1)
    pools = [list(fitted[i : i + per_node]) for i in range(0, len(fitted), per_node)]
    if per_node == 1:
        # a pool of one engine is one LRU over that engine's stream, as native offload
        lm = [(_as_pool(g), engs) for g, engs in native]
    else:
        pool_gib = hbm_gib * len(pools[0])
        pool_sizes = [m * pool_gib for m in MULTIPLES]
        pool_grid = [CURVE_TOP * pool_gib * i / (CURVE_POINTS - 1) for i in range(CURVE_POINTS)]
        lm = [(lmcache_pool_gain([e.fit for e in p], [*pool_sizes, *pool_grid],
                                 bytes_per_block=per_block), p)
              for p in pools]  # fmt: skip
    return native, lm, len(pools[0])


def _hbm(
    fitted: Sequence[_Engine], hbm_blocks: float, hbm_gib: float, bsize: int
) -> dict[str, Any]:
    """The HBM the tiers are measured against and how well the model reproduces its hits."""
    model_hit = float(np.mean([e.fit.reproduction.hit_ratio for e in fitted]))
    measured = float(np.mean([e.fit.hit_ratio for e in fitted]))
    return {
        "gib_per_engine": hbm_gib,
        "blocks_per_engine": int(hbm_blocks),
        "block_size": bsize,
        "hit_ratio_measured": measured,
        "hit_ratio_model": model_hit,
        "reproduction_error": model_hit - measured,
        "eviction_time_s": float(np.median([e.fit.t_hbm for e in fitted])),
        "sample_rate": float(np.median([e.fit.inputs.sample_rate for e in fitted])),
    }


_METHOD = (
    "per engine: AET hit-ratio curve (planner/fit/reuse.py) from vLLM's sampled reuse-gap, "
    "idle-before-evict and lifetime histograms and the prefix-cache lookups and hits; "
    "native: an inclusive CPU LRU over the engine's stream; LMCache: one LRU over a pool's "
    "merged streams; avoided prefill priced at the prefill MFU; capacity as the share of an "
    "engine's GPU time at its measured capacity the avoided prefill frees"
)


def _curve(
    gains: Sequence[tuple[TierGain, Sequence[_Engine]]], today: float
) -> list[dict[str, float | None]]:
    """The hit ratio with a tier from 0 to CURVE_TOP × HBM (the plot), averaged over
    engines / pools: the gains' points past the rows'."""
    out = [
        [
            {"gib": p.size_gib, **_est(p.extra_hit_ratio, add=today, top=1.0),
             "extrapolated": float(p.extrapolated)}
            for p in g.points[len(MULTIPLES) :]
        ]
        for g, _ in gains
    ]  # fmt: skip
    merged = []
    for same in zip(*out, strict=True):
        mean = _mean(same) or {}
        row: dict[str, float | None] = {"gib": same[0]["gib"], "hit_ratio": mean["estimate"],
                                        "lo": mean["lo"], "hi": mean["hi"]}  # fmt: skip
        row["extrapolated"] = max(float(r["extrapolated"] or 0.0) for r in same)
        merged.append(row)
    return merged


def _as_pool(g: TierGain) -> TierGain:
    """A native gain read as an LMCache pool of that one engine: the same LRU, a lower bound."""
    bound = "lower bound (cross-engine reuse not seen)"
    points = tuple(replace(p, why=f"{bound}; {p.why}" if p.why else bound) for p in g.points)
    return replace(
        g, mode="lmcache", points=points, lower_bound=True,
        assumptions=(*g.assumptions, "no cross-engine reuse (a lower bound)"),
    )  # fmt: skip


def _spread(
    ready: Sequence[tuple[str, ReuseInputs, float]],
) -> list[tuple[str, ReuseInputs, float]]:
    """At most MAX_FITTED engines, spread evenly over the engines ranked by load (each fit
    costs a bootstrap); the section's totals are per engine fitted × engines."""
    if len(ready) <= MAX_FITTED:
        return list(ready)
    ranked = sorted(ready, key=lambda r: (r[2], r[0]))
    step = (len(ranked) - 1) / (MAX_FITTED - 1)
    return [ranked[round(i * step)] for i in range(MAX_FITTED)]
