"""A plan's ``cpu_tier`` section ("What a CPU tier would buy") as the contract gives it
(planner/plan/tier.py makes it; Plan.to_dict()["cpu_tier"]), for the surfaces that carry it:
the API, the plan gauges, the Planner dashboard's live stack and the report.

Four llama-3.1-8b engines on H100 (20.5 GiB of HBM KV each: 10,496 blocks of 16 tokens at
2 MiB a block) fitted, one without the histograms; LMCache pools of two engines. Native
offload is inclusive with HBM, so 0.5× and 1× add nothing and every gain is extrapolated past
the HBM eviction time; the LMCache pool's 4× cannot tell (its tail families disagree) and it
has no recommended size. :data:`CANNOT` is the section when no engine exports the histograms.
"""

from __future__ import annotations

import copy
import math
from typing import Any

HBM_GIB = 20.5
POOL = 2  # engines per LMCache pool
MEASURED = 0.41  # today's prefix-cache hit ratio (HBM only)
CURVE_POINTS = 25
INTERVAL = (
    "model-based 90 % interval: Poisson bootstrap of the sampled histogram counts ∪ the tail "
    "families past the HBM eviction time ∪ the HBM reproduction error; not a confidence "
    "interval over engines (cluster totals add the engines' ends)"
)
ENABLE = (
    "start each vLLM engine with --kv-cache-metrics (vLLM 0.12 and later): it samples a share "
    "of KV blocks at allocation and exports their reuse gaps, idle time before eviction and "
    "lifetime as histograms; the cost is a few timestamps per sampled block"
)
NOTHING = "holds no block HBM would not: an inclusive LRU adds nothing"
EXTRAPOLATED = "extrapolated past the HBM eviction time"
LOWER = "lower bound (cross-engine reuse not seen)"


def est(estimate: float | None, lo: float | None, hi: float | None) -> dict[str, float | None]:
    return {"estimate": estimate, "lo": lo, "hi": hi}


def _row(
    label: str,
    multiple: float,
    gib: float,
    extra: tuple[float, float, float],
    tokens: tuple[float, float, float],
    *,
    cap: tuple[float, float, float] | None,
    extrapolated: bool,
    can_tell: bool = True,
    why: str = "",
) -> dict[str, Any]:
    e, lo, hi = extra
    # 40,000 looked-up prompt tokens/s over the cluster; a prefill of 7,560 tokens/s per GPU
    return {
        "label": label,
        "multiple": multiple,
        "gib": gib,
        "hit_ratio": est(MEASURED + e, MEASURED + lo, MEASURED + hi),
        "extra_hit_ratio": est(e, lo, hi),
        "avoided_prefill_tokens_per_s": est(*tokens),
        "prefill_gpu_seconds_saved_per_hour": est(*(t * 3600 / 7560 for t in tokens)),
        "capacity_ratio": None if cap is None else est(*cap),
        "extrapolated": extrapolated,
        "can_tell": can_tell,
        "why": why,
    }


def _curve(top_gib: float, onset_gib: float, gain: float, spread: float) -> list[dict[str, Any]]:
    """Hit ratio from 0 to ``top_gib``: flat (today's) up to ``onset_gib``, then a saturating
    rise of ``gain`` at the top, its band widening with the distance past the onset."""
    out = []
    scale = top_gib / 3
    for i in range(CURVE_POINTS):
        gib = top_gib * i / (CURVE_POINTS - 1)
        past = max(0.0, gib - onset_gib)
        rise = gain * (1 - math.exp(-past / scale)) / (1 - math.exp(-(top_gib - onset_gib) / scale))
        half = spread * past / (top_gib - onset_gib)
        lo, hi = MEASURED + max(0.0, rise - half), MEASURED + rise + half
        out.append({"gib": gib, "hit_ratio": MEASURED + rise, "lo": lo, "hi": hi})
    return out


NATIVE: dict[str, Any] = {
    "scope": "per engine",
    "lower_bound": False,
    "rows": [
        _row("0.5× HBM", 0.5, 10.25, (0.0, 0.0, 0.0), (0.0, 0.0, 0.0), cap=(1.0, 1.0, 1.0),
             extrapolated=False, why=NOTHING),
        _row("1× HBM", 1.0, 20.5, (0.0, 0.0, 0.0), (0.0, 0.0, 0.0), cap=(1.0, 1.0, 1.0),
             extrapolated=False, why=NOTHING),
        _row("2× HBM", 2.0, 41.0, (0.08, 0.05, 0.11), (3100.0, 1950.0, 4300.0),
             cap=(1.05, 1.03, 1.07), extrapolated=True, why=EXTRAPOLATED),
        _row("4× HBM", 4.0, 82.0, (0.12, 0.06, 0.19), (4650.0, 2330.0, 7360.0),
             cap=(1.08, 1.04, 1.13), extrapolated=True, why=EXTRAPOLATED),
        _row("recommended", 62.0 / HBM_GIB, 62.0, (0.11, 0.06, 0.16), (4260.0, 2330.0, 6200.0),
             cap=(1.07, 1.04, 1.11), extrapolated=True, why=EXTRAPOLATED),
    ],
    "recommended": {
        "gib": 62.0,
        "multiple": 62.0 / HBM_GIB,
        "why": "the knee: past it each GiB adds less than 10 % of the hits the first GiB past "
        "HBM adds",
        "extrapolated": True,
    },
    "curve": _curve(4 * HBM_GIB, HBM_GIB, 0.12, 0.07),
}  # fmt: skip
LMCACHE: dict[str, Any] = {
    "scope": f"per node pool of {POOL} engines",
    "lower_bound": True,
    "rows": [
        _row("0.5× HBM", 0.5, 20.5, (0.0, 0.0, 0.004), (0.0, 0.0, 150.0),
             cap=(1.0, 1.0, 1.0), extrapolated=False, why=f"{LOWER}; {NOTHING}"),
        _row("1× HBM", 1.0, 41.0, (0.004, 0.0, 0.01), (150.0, 0.0, 390.0),
             cap=(1.0, 1.0, 1.01), extrapolated=False, why=LOWER),
        _row("2× HBM", 2.0, 82.0, (0.07, 0.04, 0.10), (2700.0, 1550.0, 3900.0),
             cap=(1.04, 1.02, 1.06), extrapolated=True, why=f"{LOWER}; {EXTRAPOLATED}"),
        _row("4× HBM", 4.0, 164.0, (0.13, 0.05, 0.22), (5000.0, 1900.0, 8500.0), cap=None,
             extrapolated=True, can_tell=False,
             why=f"{LOWER}; tail families disagree widely: 0.06 to 0.21 (15 pp apart)"),
    ],
    "recommended": None,
    "curve": _curve(4 * POOL * HBM_GIB, POOL * HBM_GIB, 0.13, 0.17),
}  # fmt: skip
SECTION: dict[str, Any] = {
    "can_tell": True,
    "why": "",
    "enable": ENABLE,
    "engines": 4,
    "engines_without": ["engine-4"],
    "level": 0.9,
    "interval": INTERVAL,
    "method": "per engine: AET hit-ratio curve from vLLM's sampled reuse-gap, idle-before-"
    "evict and lifetime histograms and the prefix-cache lookups and hits",
    "assumptions": ["LRU eviction and a stationary access stream over the window (AET)"],
    "hbm": {
        "gib_per_engine": HBM_GIB,
        "blocks_per_engine": 10496,
        "block_size": 16,
        "hit_ratio_measured": MEASURED,
        "hit_ratio_model": 0.43,
        "reproduction_error": 0.02,
        "eviction_time_s": 95.0,
    },
    "native": NATIVE,
    "lmcache": LMCACHE,
}
CANNOT: dict[str, Any] = {
    "can_tell": False,
    "why": "no engine exports vLLM's KV residency histograms (kv_block_reuse_gap_seconds and "
    "its siblings): turn --kv-cache-metrics on",
    "enable": ENABLE,
    "engines": 0,
    "engines_without": ["engine-0", "engine-1"],
    "level": 0.9,
    "interval": INTERVAL,
    "method": "",
    "assumptions": [],
    "hbm": None,
    "native": None,
    "lmcache": None,
}


def section() -> dict[str, Any]:
    """A fresh copy of :data:`SECTION` (tests may change it)."""
    return copy.deepcopy(SECTION)
