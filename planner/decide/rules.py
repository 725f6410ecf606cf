"""The rule table of the offload decider: R1–R9, applied in order by planner/decide/decision.py.

Each rule reads the Evidence and the votes of the rules before it, may vote native or
lmcache on or off (basis: prior, measured, simulated, dram or health) and leaves a Reason with
the numbers it used and their source. planner/decide/DECIDER.md documents every rule id of RULES.
R8 and R9, the hard limits, live in planner/decide/rules_limits.py.
"""

from __future__ import annotations

from collections.abc import Callable

from core.errors import ConfigError
from planner.decide.evidence import CapacityEvidence
from planner.decide.rules_limits import r8_dram_for_both, r9_lmcache_unhealthy
from planner.decide.rulestate import (
    LMCACHE_OVERHEAD_PRIOR,
    SRC_GKE,
    SRC_GPUSTACK,
    SRC_VLLM_BLOG,
    RuleState,
    deployed_modes,
)
from planner.domain.breakeven import breakeven_bandwidth, breakeven_context
from planner.domain.costmodel import prefill_seconds
from planner.domain.hardware import get_tier


def _r1_hbm_pressure(s: RuleState) -> None:
    ev, t = s.ev, s.t
    signals = {
        k: v
        for k, v in (
            ("kv_util_p95", ev.kv_util_p95),
            ("preemptions_per_1k", ev.preemptions_per_1k),
            ("reprefill_share", ev.reprefill_share),
        )
        if v is not None
    }
    hot = (
        (ev.kv_util_p95 or 0) >= t.pressure_util
        or (ev.preemptions_per_1k or 0) >= t.preemptions_per_1k
        or (ev.reprefill_share or 0) >= t.local_reuse_min
    )
    if hot:
        s.pressure = True
        marks = {
            "pressure_util": t.pressure_util,
            "preemptions_per_1k_mark": t.preemptions_per_1k,
            "reprefill_share_mark": t.local_reuse_min,
        }
        s.say(
            "HBM under pressure: p95 KV use, preemptions per 1k requests or re-prefilled "
            "share at or above their marks",
            signals | marks,
            "measured: engine metrics",
        )
        return
    if ev.kv_util_p95 is None:
        s.unknown("kv_util_p95 (HBM pressure)")
        return
    ttl = ev.time_to_saturation_s
    if ttl is not None and ttl.lo <= t.saturation_horizon_s:
        s.pressure = True
        s.say(
            f"no HBM pressure now, but the forecast saturates HBM in "
            f"{ttl.estimate / 86400:.1f} d (earliest {ttl.lo / 86400:.1f} d): plan as under "
            "pressure",
            {**signals, "time_to_saturation_days": ttl.estimate / 86400},
            "measured: KV demand forecast",
        )
        return
    s.pressure = False
    near = ev.kv_util_p95 >= t.no_pressure_util
    s.vote("native", False, "prior")
    s.rest(f"prior: {SRC_GKE}")
    s.say(
        f"no HBM pressure: p95 KV use {ev.kv_util_p95:.0%}"
        + (f" (near the {t.pressure_util:.0%} mark; watch the forecast)" if near else "")
        + ": HBM holds the working set, so engine-local offload has nothing to keep "
        "(GKE test 1: extra tiers add nothing when the cache fits HBM)",
        {**signals, "no_pressure_util": t.no_pressure_util},
        SRC_GKE,
    )


def _r2_short_prompts(s: RuleState) -> None:
    ev, thr = s.ev, s.t.short_prompt_tokens
    p90, mean, censored = ev.prompt_tokens_p90, ev.prompt_tokens_mean, ev.prompt_tokens_p90_censored
    if p90 is None and mean is None:
        s.unknown("prompt_tokens_p90 (prompt-length mix)")
        return
    if censored and p90 is not None and p90 < thr and (mean is None or mean < thr):
        _r2_undetermined(s, p90, mean)
        return
    # A censored p90 is a lower bound: it can show prompts long, never short; then the
    # exact mean decides "long" (mean >= mark) and nothing decides "short".
    if p90 is not None and (p90 >= thr or not censored):
        p, what = p90, "p90 >=" if censored else "p90"
    else:
        assert mean is not None
        p, what = mean, "mean"
    numbers: dict[str, float | str] = {"prompt_tokens": p, "threshold": thr}
    if censored:
        numbers["prompt_tokens_p90_at_least"] = float(p90 or 0.0)
    if s.model is not None and s.gpu is not None and s.tp is not None:
        numbers["prefill_seconds"] = prefill_seconds(s.model, s.gpu, s.tp, int(p), mfu=s.mfu)
    if p >= thr:
        s.say(
            f"prompts are long enough to reload ({what} {p:.0f} tokens >= {thr:.0f}; "
            "GKE: 5 k-token prompts gained 16–27 %)",
            numbers,
            SRC_GKE,
        )
        return
    s.short = True
    s.vote("native", False, "prior")
    s.vote("lmcache", False, "prior")
    s.rest(f"prior: {SRC_GKE}")
    s.say(
        f"prompts are short ({what} {p:.0f} tokens < {thr:.0f}): 1 k-token prefixes gained "
        "0–1 % in the GKE tests while offload costs 0.5 % (vLLM DMA) to 3–15 % (LMCache) when "
        "nothing hits: recomputing is as cheap as reloading",
        numbers,
        SRC_GKE,
    )


def _r2_undetermined(s: RuleState, p90: float, mean: float | None) -> None:
    """The p90 is censored below the mark and the mean does not reach it: no verdict."""
    thr = s.t.short_prompt_tokens
    numbers: dict[str, float | str] = {"prompt_tokens_p90_at_least": p90, "threshold": thr}
    if mean is not None:
        numbers["prompt_tokens_mean"] = mean
    s.unknown(
        f"prompt_tokens_p90 (censored: only known as >= {p90:.0f} tokens, the top finite "
        "bucket of the prompt-length histogram)"
    )
    s.say(
        f"prompt length undetermined: the p90 is only known as >= {p90:.0f} tokens (the "
        "histogram's top finite bucket)"
        + (f", the mean is {mean:.0f}" if mean is not None else "")
        + f"; the short-prompt prior (< {thr:.0f} tokens) is not applied",
        numbers,
        "measured: request_prompt_tokens histogram (censored quantile)",
    )


def _r3_slow_tier(s: RuleState) -> None:
    name = s.ev.l2_tier
    if name is None:
        return
    if s.model is None or s.gpu is None or s.tp is None:
        s.unknown("model/gpu/tp (break-even bandwidth B* of the L2 tier)")
        return
    try:
        tier = get_tier(name)
    except ConfigError:
        s.unknown(f"l2_tier {name!r} (not in the hardware catalogue)")
        return
    p = s.prompt
    b_star = breakeven_bandwidth(s.model, s.gpu, s.tp, mfu=s.mfu, prompt_tokens=int(p or 4096))
    bw = tier.read_Bps * (s.tp if tier.per_gpu else 1)
    ctx = breakeven_context(s.model, s.gpu, s.tp, tier, mfu=s.mfu)
    if ctx.regime == "never":
        slow = True
    elif ctx.regime == "always":
        slow = False
    else:
        slow = p < (ctx.tokens or 0) if p is not None else bw < b_star
    s.l2_ok = not slow
    numbers: dict[str, float | str] = {
        "tier": tier.name,
        "tier_read_GBps": bw / 1e9,
        "breakeven_GBps": b_star / 1e9,
        "breakeven_tokens": float(ctx.tokens) if ctx.tokens else ctx.regime,
    }
    if p is not None:
        numbers["prompt_tokens"] = p
        numbers["prompt_tokens_basis"] = s.prompt_label
    verdict = "too slow: reloading loses to re-prefill, no L2" if slow else "fast enough for L2"
    s.rest("cost model: break-even bandwidth B* (planner/domain/breakeven.py)")
    s.say(
        f"L2 tier {tier.name}: {ctx.explanation}; {verdict}",
        numbers,
        f"cost model; tier figures: {tier.source}",
    )


def _r4_cross_engine_reuse(s: RuleState) -> None:
    ev = s.ev
    if ev.engines == 1:
        s.say(
            "one engine: nothing to share across engines",
            {"engines": 1},
            "evidence",
        )
        if not s.short:
            s.vote("lmcache", False, "prior")
        return
    if ev.cross_engine_reuse is None:
        s.unknown("cross_engine_reuse (prefix reuse across engines)")
        return
    share = ev.cross_engine_reuse
    numbers: dict[str, float | str] = {"cross_engine_reuse": share}
    if s.l2_ok is False:
        if ev.cross_node_reuse is None and (ev.nodes or 1) > 1:
            s.unknown("cross_node_reuse (the part of cross-engine reuse on other nodes)")
        share *= 1 - (ev.cross_node_reuse or 0)
        numbers["within_node_share"] = share
    overhead = s.overhead("lmcache")
    # The prior's floor is its own upper end; a measured overhead still needs >= idle_hit_ratio.
    floor = s.t.cross_engine_min if overhead is LMCACHE_OVERHEAD_PRIOR else s.t.idle_hit_ratio
    threshold = max(floor, overhead.hi)
    numbers |= {"threshold": threshold, "lmcache_overhead_hi": overhead.hi}
    if s.short:
        s.say(
            f"{share:.0%} of prompt tokens would hit on another "
            "engine, but the prompts are short (R2)",
            numbers,
            "evidence",
        )
        return
    on = share >= threshold
    s.vote("lmcache", on, "prior")
    s.rest(f"prior: {SRC_GPUSTACK}")
    s.say(
        f"{share:.0%} of prompt tokens are cached only on another "
        f"engine: {'above' if on else 'below'} the {threshold:.0%} LMCache must save to "
        "repay its no-hit overhead",
        numbers,
        SRC_GPUSTACK,
    )


def _r5_local_reuse_native(s: RuleState) -> None:
    if s.short or s.pressure is not True:
        if s.pressure is None and not s.short:
            s.unknown("HBM pressure (needed to judge engine-local offload)")
        return
    ev = s.ev
    if ev.reprefill_share is not None:
        local, what = ev.reprefill_share, "re-prefilled after preemption or eviction"
    elif ev.prefix_hit_ratio is not None:
        local, what = ev.prefix_hit_ratio, "hit the local prefix cache (proxy: evictions cut it)"
        s.penalty *= 0.9
        s.unknown("reprefill_share (used prefix_hit_ratio as a proxy)")
    else:
        s.unknown("reprefill_share / prefix_hit_ratio (engine-local reuse)")
        return
    threshold = max(s.t.local_reuse_min, s.overhead("native").hi)
    on = local >= threshold
    s.vote("native", on, "prior")
    s.rest(f"prior: {SRC_VLLM_BLOG}")
    s.say(
        f"under HBM pressure {local:.0%} of prompt tokens {what}: "
        f"{'above' if on else 'below'} {threshold:.0%}, engine-local DRAM (DMA, ~0.5 % when "
        "nothing hits) " + ("keeps them" if on else "would save little"),
        {"local_reuse": local, "threshold": threshold},
        SRC_VLLM_BLOG,
    )


def _r6_idle_connector(s: RuleState) -> None:
    ev = s.ev
    modes = deployed_modes(ev.current_mode)
    if not modes:
        return
    hits = ev.external_hit_ratio
    if hits is None:
        s.unknown(f"external_hit_ratio of the deployed {ev.current_mode} connector")
        return
    numbers = {"external_hit_ratio": hits, "idle_below": s.t.idle_hit_ratio}
    if hits < s.t.idle_hit_ratio:
        for mode in modes:
            s.vote(mode, False, "measured")
        s.rest("measured: external prefix-cache hit ratio")
        s.say(
            f"the deployed {ev.current_mode} connector serves {hits:.1%} "
            "of queried tokens: it pays its overhead for nothing",
            numbers,
            "measured",
        )
    elif hits >= max(s.t.cross_engine_min, s.overhead(modes[-1]).hi):
        for mode in modes:
            s.vote(mode, True, "measured")
        s.rest("measured: external prefix-cache hit ratio")
        s.say(
            f"the deployed {ev.current_mode} connector serves {hits:.0%} "
            "of queried tokens: more than its no-hit overhead",
            numbers,
            "measured",
        )


# Where R7's capacity ratio came from, for its reasons (CapacityEvidence.provenance).
GAIN_SOURCES = {
    "measured": "measured: planner/plan/verdict.py on the cluster's windows (capacity at the "
    "SLO per independent unit, planner/fit/capacity.py)",
    "simulated": "simulated: planner/simulate what-if runs of the described workload "
    "(planner/advise/sim.py; its band is the simulator's largest in-sample miss on published "
    "A/B runs, benchmarks/calibrate_sim.py, not a confidence interval)",
}


def _r7_capacity(s: RuleState) -> None:
    """The capacity ratio at the SLO votes when its claim interval excludes 1 (measured: a
    95 % interval over >= 2 independent units per arm; simulated: the band)."""
    fits: dict[str, CapacityEvidence | None] = {
        "native": s.ev.native_capacity,
        "lmcache": s.ev.lmcache_capacity,
    }
    for mode, fit in fits.items():
        if fit is None:
            s.unknown(f"capacity at the SLO ({mode})")
            continue
        prov = fit.provenance
        what = "capacity at the SLO" if prov == "measured" else "simulated capacity"
        if not fit.can_tell or fit.ratio is None:
            s.unknown(f"{what} ({mode}) cannot tell: {fit.why or 'no reason given'}")
            continue
        claim = fit.claim or fit.ratio
        numbers: dict[str, float | str] = {
            "capacity_ratio": fit.ratio.estimate,
            "lo": fit.ratio.lo,
            "hi": fit.ratio.hi,
            "level": fit.ratio.level,
            "claim_lo": claim.lo,
            "claim_hi": claim.hi,
            "units_treated": fit.units[0],
            "units_control": fit.units[1],
            "provenance": prov,
        }
        if fit.lower_bound:
            numbers["lower_bound"] = "yes"
        s.rest(f"{prov}: {what} ({mode}) {fit.text()}")
        up, down = claim.lo > 1, claim.hi < 1 and not fit.lower_bound
        if up or down:
            before = s.votes[mode]
            if prov == "simulated" and before.basis == "measured":
                continue  # a measurement outranks a simulation of the same question
            s.vote(mode, up, prov)
            flip = " (overrides the priors)" if before.on is not None and before.on != up else ""
            verb = "carries more" if up else "carries less"
            s.say(
                f"{prov}: an engine with {mode} offload {verb} load within the SLO: capacity "
                f"{fit.text()}{flip}",
                numbers,
                GAIN_SOURCES[prov],
            )
        else:
            s.penalty *= 0.8
            s.say(
                f"{prov}: {mode} capacity {fit.text()} is indistinguishable from no offload's; "
                "the priors stand",
                numbers,
                GAIN_SOURCES[prov],
            )


RULES: tuple[tuple[str, Callable[[RuleState], None]], ...] = (
    ("R1_hbm_pressure", _r1_hbm_pressure),
    ("R2_short_prompts", _r2_short_prompts),
    ("R3_slow_tier", _r3_slow_tier),
    ("R4_cross_engine_reuse", _r4_cross_engine_reuse),
    ("R5_local_reuse_native", _r5_local_reuse_native),
    ("R6_idle_connector", _r6_idle_connector),
    ("R7_capacity", _r7_capacity),
    ("R8_dram_for_both", r8_dram_for_both),
    ("R9_lmcache_unhealthy", r9_lmcache_unhealthy),
)
RULE_IDS = tuple(rule_id for rule_id, _ in RULES)


def apply_rules(s: RuleState) -> None:
    """Run every rule of RULES in order on the state."""
    for rule_id, rule in RULES:
        s.rule = rule_id
        rule(s)
    s.rule = ""
