"""The ``basis`` lines, the hardware and the cost section of a plan (planner/plan/build.py).

``basis`` says what each figure rests on and what was left unknown (EVIDENCE_GAPS says why
the metrics cannot fill an Evidence field); ``cost`` prices the engines now and the sized
fleet at a GPU-hour price.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from core.errors import ConfigError
from planner.decide.evidence import Evidence
from planner.deploy.sizing import Sizing
from planner.domain.hardware import get_gpu, get_model
from planner.frames.groups import mode_regimes
from planner.plan.fits import FitRun, Hardware
from planner.plan.forecast import ForecastRun
from planner.plan.observe import most_common

HOURS_PER_MONTH = 730.0  # 365 × 24 / 12
EVIDENCE_GAPS: Mapping[str, str] = {
    "vllm_version": "vLLM exposes no version metric; the configs assume the latest supported",
    "engines_per_node": "the store holds no node topology (sizing assumes 1 engine per node)",
    "nodes": "the store holds no node topology",
    "cross_engine_reuse": "needs per-request prefix hashes (a trace): metrics count hits, not "
    "which engine holds the prefix",
    "cross_node_reuse": "needs per-request prefix hashes and node placement (a trace)",
    "distinct_prefix_tokens": "needs per-request prefix hashes (a trace)",
    "overhead_zero_hit": "needs offload engines measured at a 0 % hit rate; not separated from "
    "the gain fit",
    "l2_tier": "the L2 tier is not visible in the metrics",
    "cpu_dram_per_node_gib": "host DRAM is not visible in the metrics (set dram_gib in an "
    "engines.yaml: kvscope collect --engines)",
}


def plan_basis(ev: Evidence, fits: Mapping[str, FitRun], fc: ForecastRun) -> list[str]:
    out: list[str] = []
    if ev.effective_mfu is None:
        why = fits["prefill_mfu"].entry.get("why") or "no fit"
        out.append(
            f"prefill MFU: prior 50 % (assumption: 40–60 % simulator default); the "
            f"fit could not tell: {why}"
        )
    else:
        m = ev.effective_mfu
        out.append(
            f"prefill MFU: fitted {m.estimate:.1%} [{m.lo:.1%}, {m.hi:.1%}] "
            f"({fits['prefill_mfu'].entry['n']} low-load windows)"
        )
    for name, entry in fits.items():
        if not entry.entry.get("can_tell"):
            out.append(f"fit {name}: cannot tell: {entry.entry.get('why')}")
    if fc.capacity is not None:
        out.append(f"HBM KV capacity: {fc.capacity.basis}")
    if fc.evidence.saturation_censored:
        out.append(
            "time to saturation: an end lies beyond the forecast horizon; it is "
            "reported at the horizon (censored)"
        )
    for name, why in EVIDENCE_GAPS.items():
        if getattr(ev, name) is None:
            out.append(f"left unknown: {name}: {why}")
    return out


def plan_cost(ev: Evidence, sizing: Sizing | None, price: float | None) -> dict[str, Any] | None:
    """GPU cost per month of the engines now and of the sized fleet (price × GPUs × 730 h)."""
    if price is None:
        return None
    gpus = ev.tp or 1
    per_engine = price * gpus * HOURS_PER_MONTH
    out: dict[str, Any] = {
        "gpu_price_per_hour": price,
        "gpus_per_engine": gpus,
        "per_engine_per_month": per_engine,
        "current_per_month": per_engine * ev.engines if ev.engines else None,
        "basis": f"price × {gpus} GPU(s) per engine × {HOURS_PER_MONTH:g} h per month"
        + ("" if ev.tp else " (tp unknown: 1 assumed)"),
    }
    eng = sizing.engines if sizing else None
    if eng is not None:
        out |= {
            "needed_per_month": per_engine * eng.needed,
            "needed_interval_per_month": [per_engine * eng.lo, per_engine * eng.hi],
        }
        if eng.needed_with_offload is not None:
            out["needed_with_offload_per_month"] = per_engine * eng.needed_with_offload
    return out


def facts_basis(engines: list[Any]) -> list[str]:
    """Where the engines' facts came from (collector.engine_facts.describe's provenance):
    which were assumed, how the offload modes were read, and the engines whose offload mode
    changed (each window counts as the mode in force at its start)."""
    out: list[str] = []
    n = len(engines)
    kinds: dict[str, Counter[str]] = {}
    for e in engines:
        prov = (e.facts or {}).get("provenance") or {}
        for key, where in prov.items():
            kinds.setdefault(key, Counter())[str(where).split(":", 1)[0]] += 1
    assumed = [
        f"{key} on {c['assumed']} of {n} engine(s)"
        for key, c in sorted(kinds.items())
        if c.get("assumed")
    ]
    if assumed:
        out.append(
            "facts assumed (no engine exposed them and nothing configured them): "
            + "; ".join(assumed)
            + " — set them in an engines.yaml (kvscope collect --engines) or the targets file"
        )
    if "offload" in kinds:
        c = kinds["offload"]
        out.append(
            "offload modes: " + ", ".join(f"{c[k]} {k}" for k in sorted(c)) + f" of {n} engine(s)"
        )
    for e in engines:
        regimes = mode_regimes(getattr(e, "changes", ()))
        if len({m for _, m in regimes}) > 1:
            steps = " → ".join(
                f"{m} from {datetime.fromtimestamp(t, UTC):%Y-%m-%dT%H:%MZ}" for t, m in regimes
            )
            out.append(
                f"engine {e.source} changed offload mode: {steps}; each window counts as the "
                "mode in force at its start"
            )
    return out


def dram_of(engines: list[Any]) -> float | None:
    """CPU DRAM per node (GiB) an engines.yaml rule set (the most common); None: not set."""
    value, _ = most_common((e.facts or {}).get("dram_gib") for e in engines)
    return float(value) if isinstance(value, int | float) else None


def hardware_of(engines: list[Any], basis: list[str]) -> tuple[dict[str, Any], Hardware | None]:
    """Model/GPU/TP of the engines (the most common when they differ)."""
    out: dict[str, Any] = {}
    for key, attr in (("model", "model"), ("gpu", "gpu"), ("tp", "tensor_parallel")):
        value, distinct = most_common(getattr(e, attr) for e in engines)
        out[key] = value
        if distinct > 1:
            basis.append(
                f"engines differ in {key} ({distinct} values): the cost-model priors use "
                f"the most common ({value})"
            )
    if not all(out.values()):
        missing = [k for k, v in out.items() if not v]
        basis.append(
            f"engine metadata lacks {', '.join(missing)}: cost-model priors and the "
            "MFU fit are unavailable (register engines with model, gpu, tp)"
        )
        return out, None
    try:
        return out, Hardware(get_model(str(out["model"])), get_gpu(str(out["gpu"])), int(out["tp"]))
    except ConfigError as exc:
        basis.append(f"hardware catalogue: {exc}")
        return out, None
