"""`kvscope advise`: a what-if answer without history — cost model + a short simulation.

From a workload in a few numbers, the cost model gives KV bytes, HBM KV, prefill time and
the tiers' break-evens; a seeded simulation runs once per mode on the same requests; its
figures fill an Evidence record, decided and sized exactly like `kvscope plan`'s. Simulated
gains are not measurements: they carry the simulator's error (the band of the working-set
regime, planner/advise/sim.py ``BANDS``, no coverage level) and one seed's noise.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from core.errors import ConfigError
from planner.advise.question import WhatIf
from planner.advise.sim import (
    ALT_MAX_REQUESTS,
    BAND_SOURCE,
    BANDS,
    layout,
    quantile,
    scenario_of,
    simulate_modes,
    simulated_section,
    working_set_regime,
)
from planner.decide.decision import Decision, decide
from planner.decide.evidence import CapacityEvidence, Evidence, ValueCI
from planner.deploy.sizing import Sizing, size
from planner.domain import costmodel
from planner.domain.breakeven import breakeven_bandwidth, breakeven_context
from planner.domain.hardware import builtin_catalog, get_gpu, get_model
from planner.domain.values import json_ready
from planner.simulate.scenario import ROUTERS

GIB = 1024**3
# ValueCI requires a level; a simulated gain's band (largest in-sample miss) has none. This
# placeholder (ValueCI's default) is what R7 and R8 receive with provenance "simulated"; it is
# not a coverage claim, and Advice.to_dict replaces it with the band's description.
BAND_LEVEL_PLACEHOLDER = 0.95
__all__ = [
    "Advice",
    "WhatIf",
    "advise",
    "cost_model_section",
    "evidence_from_sim",
    "evidence_json",
]


@dataclass(frozen=True, slots=True, eq=False)
class Advice:
    """The answer of `kvscope advise`; ``to_dict()`` is its JSON."""

    whatif: WhatIf
    cost_model: dict[str, Any]
    scenario: dict[str, Any]
    simulated: dict[str, Any]
    evidence: Evidence
    decision: Decision
    sizing: Sizing | None
    sizing_error: str | None
    notes: tuple[str, ...] = field(default=())
    routers: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = json_ready(
            {
                "inputs": asdict(self.whatif),
                "router": self.routers,
                "decision": self.decision.to_dict(),
                "simulated": self.simulated,
                "cost_model": self.cost_model,
                "sizing": self.sizing.to_dict() if self.sizing else {"error": self.sizing_error},
                "configs": dict(self.sizing.configs) if self.sizing else {},
                "evidence": evidence_json(self.evidence, self.simulated),
                "scenario": self.scenario,
                "notes": list(self.notes),
            }
        )
        return out


def evidence_json(ev: Evidence, sim: dict[str, Any]) -> dict[str, Any]:
    """The Evidence as JSON, with no confidence level on a simulated figure: a simulated
    capacity ratio's ValueCI (its level a placeholder) is written as the estimate and its
    band, {"estimate", "band": {"lo", "hi", "kind", "rows", ...}} (lo/hi as ratios); the
    demand peak's lo/hi as the range of the run it is (median and maximum sampled)."""
    out = asdict(ev)
    peak = out.get("demand_peak")
    if peak is not None:
        peak.pop("level")
        peak["kind"] = "run_range_median_max"
    band = BANDS[sim["gain_band"]["regime"]]
    for key in ("native_capacity", "lmcache_capacity"):
        fit = out.get(key)
        if fit and fit["provenance"] == "simulated" and fit["ratio"] is not None:
            iv = fit["ratio"]
            fit.pop("claim", None)
            fit["ratio"] = {
                "estimate": iv["estimate"],
                "band": {**band.around(iv["estimate"] - 1), "lo": iv["lo"], "hi": iv["hi"]},
            }
    return out


def cost_model_section(w: WhatIf) -> dict[str, Any]:
    """KV bytes, HBM KV, prefill seconds, B* and the break-even context of every tier."""
    model, gpu = get_model(w.model), get_gpu(w.gpu)
    mfu = costmodel.DEFAULT_MFU
    prefix = max(1, round(w.prompt_tokens * w.prefix_share))
    tiers = []
    for tier in builtin_catalog().tiers.values():
        ctx = breakeven_context(model, gpu, w.tp, tier, mfu=mfu)
        tiers.append(
            {
                "tier": tier.name,
                "regime": ctx.regime,
                "tokens": ctx.tokens,
                "prompt_reads_faster": ctx.regime == "always"
                or (ctx.regime == "above" and w.prompt_tokens >= (ctx.tokens or 0)),
                "explanation": ctx.explanation,
            }
        )
    capacity = costmodel.hbm_kv_capacity_tokens(model, gpu, w.tp)
    per_token = costmodel.kv_bytes_per_token_engine(model)
    return {
        "model": model.name,
        "gpu": gpu.name,
        "tp": w.tp,
        "mfu": mfu,
        "mfu_basis": "prior: costmodel.DEFAULT_MFU (assumption: 40–60 % prefill MFU "
        "is a simulator default, not a measurement)",
        "kv_bytes_per_token": per_token,
        "kv_bytes_per_token_per_gpu": costmodel.kv_bytes_per_token(model, w.tp),
        "hbm_kv_tokens_per_engine": capacity,
        "hbm_kv_gib_per_engine": capacity * per_token / GIB,
        "prompt_kv_bytes": w.prompt_tokens * per_token,
        "prefill_seconds_prompt": costmodel.prefill_seconds(
            model, gpu, w.tp, w.prompt_tokens, mfu=mfu
        ),
        "prefill_seconds_prefix": costmodel.prefill_seconds(model, gpu, w.tp, prefix, mfu=mfu),
        "breakeven_bandwidth_Bps": breakeven_bandwidth(
            model, gpu, w.tp, mfu=mfu, prompt_tokens=w.prompt_tokens
        ),
        "breakeven_context_by_tier": tiers,
        # Engine-seconds of prefill per second at the offered QPS: a compute floor on the
        # engine count (decode excluded), every prompt computed vs the shared prefix cached.
        "prefill_busy_engines": {
            "all_computed": w.qps
            * costmodel.prefill_seconds(model, gpu, w.tp, w.prompt_tokens, mfu=mfu),
            "prefix_cached": w.qps
            * costmodel.prefill_seconds(
                model,
                gpu,
                w.tp,
                w.prompt_tokens,
                mfu=mfu,
                cached_tokens=min(prefix, w.prompt_tokens - 1),
            ),
            "basis": "qps × cost-model prefill seconds per prompt (decode not included: a "
            "lower bound on the engines the load keeps busy)",
        },
    }


def _clip01(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else min(max(x, 0.0), 1.0)


def evidence_from_sim(w: WhatIf, runs: dict[str, Any], sim: dict[str, Any]) -> Evidence:
    """Evidence from the simulated runs (field by field, see the comments)."""
    none, util, tokens = runs["none"]
    m = sim["modes"]
    nodes, gpn = layout(w.engines, w.tp)

    band = BANDS[sim["gain_band"]["regime"]]
    why = (
        f"simulated; band = the simulator's largest in-sample miss over {band.rows} published "
        f"rows ({band.row_set}; {BAND_SOURCE}), no coverage level"
    )

    def gain(mode: str) -> CapacityEvidence:
        g = m[mode]["throughput_gain"]
        if g is None:
            return CapacityEvidence(
                False, why="no simulated throughput", design="simulated", provenance="simulated"
            )
        half = band.halfwidth(g)
        # the simulated throughput gain at the described load, as a capacity ratio; its band
        # is no confidence interval: interval_kind says so and the level is a placeholder
        iv = ValueCI(1 + g, max(1 + g - half, 1e-9), 1 + g + half, BAND_LEVEL_PLACEHOLDER)
        return CapacityEvidence(
            True, iv, iv, units=(w.engines, w.engines), design="simulated", why=why,
            provenance="simulated", interval_kind="largest_in_sample_miss",
        )  # fmt: skip

    window = none["measured_window_s"] or 1.0
    prompt_total = (none["input_tokens_per_s"] or 0.0) * window
    shared = round(w.prompt_tokens * w.prefix_share)
    demand = None
    if tokens:
        # Demand peak: the p95 of the cluster's KV tokens in use over the run, lo/hi the
        # median and the maximum sampled (a range of the run, not a confidence interval).
        p50, p95, top = quantile(tokens, 0.5), quantile(tokens, 0.95), max(tokens)
        demand = ValueCI(p95 or 0.0, min(p50 or 0.0, p95 or 0.0), max(top, p95 or 0.0))
    ext_l, ext_n = m["lmcache"]["external_hit_rate"], m["native"]["external_hit_rate"]
    return Evidence(
        model=w.model,
        gpu=w.gpu,
        tp=w.tp,
        vllm_version=w.vllm_version,
        engines=w.engines,
        engines_per_node=gpn // w.tp,
        nodes=nodes,
        kv_util_p50=_clip01(quantile(util, 0.5)),
        kv_util_p95=_clip01(quantile(util, 0.95)),
        preemptions_per_1k=1000 * none["preemptions"] / max(none["completed_requests"], 1),
        reprefill_share=_clip01(none["reprefill_tokens"] / prompt_total) if prompt_total else None,
        prompt_tokens_mean=float(w.prompt_tokens),
        prompt_tokens_p90=float(w.prompt_tokens),
        prefix_hit_ratio=_clip01(none["prefix_hit_rate"]),
        # What only sharing serves: LMCache's external hits beyond engine-local offload's.
        cross_engine_reuse=_clip01((ext_l or 0.0) - (ext_n or 0.0)) if w.engines > 1 else None,
        distinct_prefix_tokens=float(w.prefix_tokens or shared) if shared >= 1 else None,
        native_capacity=gain("native"),
        lmcache_capacity=gain("lmcache"),
        cpu_dram_per_node_gib=w.cpu_gb,
        demand_now=quantile(tokens, 0.5),
        demand_peak=demand,
        demand_unit="KV tokens",
        engine_capacity=float(none["engine_kv_tokens"]),
    )


def headline(
    router: str, sim: dict[str, Any], decision: Decision, duration_s: float
) -> dict[str, Any]:
    """One router's answer in brief: the recommended mode, its simulated gain and prefill
    compute saved ("both" reads LMCache's run: the simulator has no combined mode), and
    LMCache's and native's own figures (what routing changes most)."""
    m = sim["modes"]
    run = {"both": "lmcache", "none": None}.get(decision.mode, decision.mode)

    def fig(mode: str | None, key: str) -> float | None:
        return None if mode is None else m[mode][key]

    return {
        "router": router,
        "recommended": decision.mode,
        "score": round(decision.score, 3),
        "throughput_gain": fig(run, "throughput_gain"),
        "prefill_compute_saved": fig(run, "prefill_compute_saved"),
        "lmcache_prefill_compute_saved": m["lmcache"]["prefill_compute_saved"],
        "lmcache_throughput_gain": m["lmcache"]["throughput_gain"],
        "native_prefill_compute_saved": m["native"]["prefill_compute_saved"],
        "gpu_prefix_hit_rate": m["none"]["prefix_hit_rate"],
        "kv_util_p95": m["none"]["kv_util_p95"],
        "duration_s": duration_s,
    }


def _answer(
    w: WhatIf, raw: dict[str, Any], progress: Callable[[str], None] | None
) -> tuple[dict[str, Any], dict[str, Any], Evidence, Decision]:
    runs = simulate_modes(raw, progress)
    sim = simulated_section(runs, w.qps, working_set_regime(raw))
    evidence = evidence_from_sim(w, runs, sim)
    return runs, sim, evidence, decide(evidence)


def other_routers(w: WhatIf, progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The headline under every router but the assumed one, each run capped at
    ALT_MAX_REQUESTS requests per mode (same seed)."""
    rows = []
    for router in ROUTERS:
        if router == w.assumed_router:
            continue
        raw, _ = scenario_of(w, router, ALT_MAX_REQUESTS)
        _, sim, _, decision = _answer(w, raw, progress)
        rows.append(headline(router, sim, decision, raw["duration_s"]))
    return rows


def advise(w: WhatIf, progress: Callable[[str], None] | None = None) -> Advice:
    """Cost model + simulation -> Evidence -> decide -> size (module docstring)."""
    w.check()
    cost = cost_model_section(w)
    raw, notes = scenario_of(w)
    _, sim, evidence, decision = _answer(w, raw, progress)
    if sim["none_keeps_up"]:
        notes.append(
            "without offload the cluster keeps up with the offered load: throughput "
            "gains are ~0 by construction; TTFT change and prefill compute saved show "
            "what offload buys at this load"
        )
    p95 = sim["modes"]["none"]["kv_util_p95"]
    if p95 is not None and p95 >= 0.95:
        notes.append(
            "KV use reaches capacity without offload: the KV demand is censored at "
            "capacity, so the engine count from it is a lower bound"
        )
    notes.append("the decider's 'measured' reasons (R7) rest on simulated gains here")
    routers: dict[str, Any] = {
        "assumed": w.assumed_router,
        "default": w.router is None,
        "scorer_weights": w.scorer_config(),
        "rows": [headline(w.assumed_router, sim, decision, raw["duration_s"])],
        "alternatives_max_requests": ALT_MAX_REQUESTS if w.compare_routers else None,
    }
    if w.compare_routers:
        routers["rows"] += other_routers(w, progress)
    sizing, err = None, None
    try:
        sizing = size(evidence, decision)
    except ConfigError as exc:
        err = str(exc)
    scenario = {k: v for k, v in raw.items() if not k.startswith("_")}
    if "_cpu_gb" in raw:
        scenario["cpu_cache_gb_by_mode"] = raw["_cpu_gb"]
    return Advice(w, cost, scenario, sim, evidence, decision, sizing, err, tuple(notes), routers)
