"""What an engine says about itself: its offload mode and KV facts, from what it exposes.

Both collect modes use it. The offload mode comes from the first rule that applies to
``kv_offload_config_info``, ``cache_config_info``'s offloading labels, and the connectors'
own series (else unknown); :func:`describe` merges the exposed facts with engines.yaml
rules, the targets file and DCGM, keeping each fact's provenance (exposed, configured,
assumed).

Rules: collector/DESIGN.md#engine_facts
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from collector.dcgm import GpuFacts
from collector.engine_rules import EngineRules
from core.catalog import FACTS, SIGNALS

__all__ = ["ENGINE_FACTS", "OFF_SIZES", "PRESENCE_SIGNALS", "Described", "assumed_facts",
           "describe", "engine_facts_of", "offload_from_facts"]  # fmt: skip

CACHE_CONFIG, KV_OFFLOAD_CONFIG = "cache_config", "kv_offload_config"  # catalog.FACTS keys
ENGINE_FACTS = (CACHE_CONFIG, KV_OFFLOAD_CONFIG)  # the fact families a vLLM engine exposes
OFF_SIZES = frozenset({"", "None", "none", "0", "0.0"})
_MODES = ("native", "lmcache")
# canonical signals whose presence on an engine shows a connector
_NATIVE_SIGNALS = ("offload_bytes_total", "offload_seconds_total")
# the LMCache connector's series on the engine's own /metrics: vLLM-source LMCache signals
_LMCACHE_SIGNALS = tuple(n for n, d in SIGNALS.items() if d.source == "vllm" and "lmcache" in n)
# the signals whose presence the offload mode reads (Prometheus mode queries them whatever
# it keeps: collector.keep)
PRESENCE_SIGNALS = _NATIVE_SIGNALS + _LMCACHE_SIGNALS
_INTS = ("num_gpu_blocks", "block_size", "num_cpu_blocks")

Rows = Mapping[str, Sequence[Mapping[str, str]]]


def offload_from_facts(facts: Rows, signals: Collection[str] = ()) -> tuple[str | None, str]:
    """(offload mode or None, basis) of one engine (DESIGN.md#engine_facts)."""
    if facts.get(KV_OFFLOAD_CONFIG):
        return "native", f"exposed: {FACTS[KV_OFFLOAD_CONFIG]} present"
    rows = facts.get(CACHE_CONFIG) or ()
    row = rows[0] if rows else {}
    backend = row.get("kv_offloading_backend")
    size = row.get("kv_offloading_size")
    family = FACTS[CACHE_CONFIG]
    if backend == "lmcache":
        return "lmcache", f'exposed: {family} kv_offloading_backend="lmcache"'
    if backend in _MODES and size is not None and size not in OFF_SIZES:
        return backend, f'exposed: {family} kv_offloading_backend="{backend}", size {size} GiB'
    if any(s in signals for s in _NATIVE_SIGNALS):
        return "native", "exposed: native offload transfer counters"
    if any(s in signals for s in _LMCACHE_SIGNALS):
        return "lmcache", "exposed: LMCache MP connector lookups on the engine"
    if size is not None and size in OFF_SIZES:
        return "none", f'exposed: {family} kv_offloading_size="{size}" (offloading off)'
    return None, "not exposed (no offloading labels or connector series)"


def engine_facts_of(facts: Rows, signals: Collection[str] = ()) -> dict[str, Any]:
    """The facts kept per engine: the raw rows by fact key, the per-engine ints of the first
    ``cache_config`` row (``dp_engines``: how many rows), and the derived offload mode with
    its basis (``offload``, ``offload_basis``)."""
    out: dict[str, Any] = {k: [dict(r) for r in rows] for k, rows in facts.items()}
    rows = facts.get(CACHE_CONFIG, ())
    if rows:
        out["dp_engines"] = len(rows)
        for key in _INTS:
            raw = rows[0].get(key, "")
            if raw.isdigit():
                out[key] = int(raw)
    mode, basis = offload_from_facts(facts, signals)
    out["offload"] = mode
    out["offload_basis"] = basis
    return out


@dataclass(frozen=True, slots=True)
class Described:
    """What to store for one engine: the columns (None: unknown) and the facts, whose
    ``provenance`` says where each column came from."""

    model: str | None
    gpu: str | None
    hbm_gb: float | None
    tensor_parallel: int | None
    offload: str
    facts: dict[str, Any]


def describe(
    exposed: Mapping[str, Any],
    *,
    model_label: str | None = None,
    labels: Mapping[str, str] | None = None,
    configured: Mapping[str, Any] | None = None,
    rules: EngineRules | None = None,
    gpus: GpuFacts | None = None,
) -> Described:
    """One engine's facts from every place they come from, first that says wins
    (DESIGN.md#engine_facts). ``exposed``: :func:`engine_facts_of` of its series;
    ``model_label``: its ``model_name``; ``labels``: what engines.yaml rules match on;
    ``configured``: the targets.yaml values written for it (keys model, gpu, tensor_parallel,
    offload, pool)."""
    ruled = rules.facts_for(labels or {}) if rules is not None else {}
    given = {k: v for k, v in (configured or {}).items() if v is not None}
    prov: dict[str, str] = {}

    def pick(key: str, *found: tuple[Any, str]) -> Any:
        for value, where in found:
            if value is not None:
                prov[key] = where
                return value
        return None

    def conf(key: str) -> tuple[tuple[Any, str], tuple[Any, str]]:
        rule = ruled.get(key, (None, ""))
        return (rule[0], f"configured: {rule[1]}"), (given.get(key), "configured: targets file")

    model = pick("model", *conf("model"), (model_label, "exposed: model_name label"))
    offload = pick(
        "offload", *conf("offload"), (exposed.get("offload"), str(exposed.get("offload_basis")))
    )
    if offload is None:
        offload = pick("offload", ("none", "assumed: none (no offloading labels or series)"))
    dcgm_gpu = (gpus.gpu, f"exposed: {gpus.basis}") if gpus else (None, "")
    dcgm_tp = (gpus.gpus, f"exposed: {gpus.basis}") if gpus else (None, "")
    gpu = pick("gpu", dcgm_gpu, *conf("gpu"))
    tp = pick("tensor_parallel", dcgm_tp, *conf("tensor_parallel"),
              (1, "assumed: 1 (vLLM's default tensor_parallel_size)"))  # fmt: skip
    hbm = pick("hbm_gb", *conf("hbm_gb"))
    facts = dict(exposed)
    dram = pick("dram_gib", *conf("dram_gib"))
    if dram is not None:
        facts["dram_gib"] = dram
    pool = pick("pool", *conf("pool"))
    if pool is not None:
        facts["pool"] = pool
    facts["provenance"] = prov
    return Described(model, gpu, hbm, tp, str(offload), facts)


def assumed_facts(facts: Mapping[str, Any]) -> list[str]:
    """The facts of one engine that nothing exposed or configured (provenance "assumed")."""
    prov = facts.get("provenance") or {}
    return sorted(k for k, v in prov.items() if str(v).startswith("assumed"))
