"""The hard limits of the offload decider, applied last: R8 (DRAM for native buffers and an
LMCache L1 together) and R9 (LMCache health). planner/decide/rules.py holds the rule table;
planner/decide/DECIDER.md documents both rules.
"""

from __future__ import annotations

import math

from planner.decide.evidence import CapacityEvidence, ValueCI
from planner.decide.rulestate import (
    GIB,
    HA_ADVICE,
    SRC_KVBM,
    SRC_LMCACHE_K8S,
    Risk,
    RuleState,
    deployed_modes,
)
from planner.domain.costmodel import hbm_kv_capacity_tokens, kv_bytes_per_token


def _engine_kv_gib(s: RuleState) -> float | None:
    if s.model is None or s.gpu is None or s.tp is None:
        return None
    tokens = hbm_kv_capacity_tokens(s.model, s.gpu, s.tp)
    return tokens * kv_bytes_per_token(s.model, s.tp) * s.tp / GIB


def r8_dram_for_both(s: RuleState) -> None:
    if not (s.votes["native"].on and s.votes["lmcache"].on):
        return
    ev = s.ev
    kv = _engine_kv_gib(s)
    per_node = ev.engines_per_node
    missing = [
        n
        for n, v in (
            ("model/gpu/tp", kv),
            ("engines_per_node", per_node),
            ("cpu_dram_per_node_gib", ev.cpu_dram_per_node_gib),
        )
        if v is None
    ]
    numbers: dict[str, float | str] = {}
    if not missing and kv is not None and per_node is not None and ev.cpu_dram_per_node_gib:
        usable = ev.cpu_dram_per_node_gib * (1 - s.t.dram_reserve_fraction)
        need = 2 * per_node * kv  # native buffers >= device KV, plus an L1 of the same size
        numbers = {"usable_dram_gib": usable, "needed_gib": need, "engine_hbm_kv_gib": kv}
        if usable >= need:
            s.rest(f"prior: {SRC_KVBM}")
            s.say(
                f"both: {usable:.0f} GiB of usable DRAM per node holds "
                f"native buffers and an LMCache L1 of at least the HBM KV each "
                f"({need:.0f} GiB)",
                numbers,
                SRC_KVBM,
            )
            return
    for name in missing:
        s.unknown(f"{name} (DRAM for native + LMCache together)")
    g_native, g_lmcache = _two_sided(ev.native_capacity), _two_sided(ev.lmcache_capacity)
    # Sampling noise is what a tie guards against: measured ratios only. Simulated ones
    # (advise) come from one deterministic model whose band is shared by both modes.
    measured = all(
        g is not None and g.provenance == "measured"
        for g in (ev.native_capacity, ev.lmcache_capacity)
    )
    if g_native is not None and g_lmcache is not None:
        diff = lmcache_over_native(g_native, g_lmcache)
        numbers |= {"lmcache_over_native": diff.estimate, "lo": diff.lo, "hi": diff.hi}
        if measured and diff.lo <= 0 <= diff.hi:
            keep = "native"
            why = (
                f"the data cannot tell it from LMCache (native {g_native.pct()}, LMCache "
                f"{g_lmcache.pct()}; LMCache over native {diff.pct()}) and it needs no "
                "shared server per node"
            )
        else:
            keep = "lmcache" if diff.estimate > 0 else "native"
            how = "measured" if measured else "simulated"
            why = f"the larger {how} capacity (LMCache over native {diff.pct()})"
    else:
        local = ev.reprefill_share if ev.reprefill_share is not None else ev.prefix_hit_ratio
        keep = "lmcache" if (ev.cross_engine_reuse or 0) >= (local or 0) else "native"
        why = "the larger saving (cross-engine against local prefix reuse)"
    drop = "lmcache" if keep == "native" else "native"
    s.vote(drop, False, "dram")
    s.say(
        f"not both: DRAM per node {'is unknown' if missing else 'is too small'}"
        f" for native buffers and an LMCache L1; keeping {keep}: {why}",
        numbers,
        SRC_KVBM,
    )


def _two_sided(fit: CapacityEvidence | None) -> ValueCI | None:
    """The capacity gain (ratio − 1) of a fit that can tell with a two-sided interval."""
    if fit is None or not fit.can_tell or fit.lower_bound:
        return None
    return fit.gain


def lmcache_over_native(native: ValueCI, lmcache: ValueCI) -> ValueCI:
    """LMCache's capacity over native offload's, (1 + g_lmcache) / (1 + g_native) − 1.

    The capacity intervals are t intervals on the log scale, so the log ratio's half-width is
    taken as the two half-widths added in quadrature, as for independent normal estimates
    (an approximation with few units). Both use the same no-offload units, which correlates
    them positively: the true interval is narrower, so this one calls a tie a little more
    often than it should.
    """
    if native.level != lmcache.level:
        raise ValueError(f"gain intervals at different levels: {native.level}, {lmcache.level}")
    log = math.log1p
    d = log(lmcache.estimate) - log(native.estimate)
    half = math.hypot(
        (log(native.hi) - log(native.lo)) / 2, (log(lmcache.hi) - log(lmcache.lo)) / 2
    )
    return ValueCI(math.expm1(d), math.expm1(d - half), math.expm1(d + half), native.level)


def r9_lmcache_unhealthy(s: RuleState) -> None:
    ev = s.ev
    relevant = s.votes["lmcache"].on or "lmcache" in deployed_modes(ev.current_mode)
    if not relevant:
        return
    up, healthy = ev.lmcache_up_fraction, ev.lmcache_healthy
    if up is None and healthy is None:
        if "lmcache" in deployed_modes(ev.current_mode):
            s.unknown("LMCache health (up fraction / healthy gauge)")
        return
    if (up is None or up >= 1) and healthy is not False:
        return
    numbers: dict[str, float | str] = {}
    if up is not None:
        numbers["lmcache_up_fraction"] = up
    if healthy is not None:
        numbers["lmcache_healthy"] = "yes" if healthy else "no"
    fallback = "native" if s.pressure and not s.short else "none"
    down = healthy is False or (up is not None and up < s.t.lmcache_down_fraction)
    if down and s.votes["lmcache"].on:
        s.vote("lmcache", False, "health")
        if fallback == "native":
            s.vote("native", True, "health")
    action = (
        f"fall back to {fallback} until it is healthy and highly available"
        if down
        else f"switch the engines of the affected nodes to {fallback} until their server is back"
    )
    s.risks.append(
        Risk(
            "lmcache_spof",
            "LMCache is unhealthy or down: the engines behind a dead "
            "server wait up to lmcache.mp.mq_timeout (300 s default) per request",
            HA_ADVICE,
        )
    )
    s.say(
        f"LMCache is unhealthy ({'?' if up is None else f'{up:.0%}'} of its targets up, "
        f"healthy gauge {numbers.get('lmcache_healthy', '?')}): {action}",
        numbers,
        SRC_LMCACHE_K8S,
    )
