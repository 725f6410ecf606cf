"""What an engine says about itself: its offload mode and KV facts, from what it exposes.

Both collect modes use it: direct scrapes pass a snapshot's info families, Prometheus mode
the same families read back by instant query (collector.promsource.PrometheusSource.facts).
The facts are the labels of ``cache_config_info`` / ``kv_offload_config_info`` (keys of
collector.catalog.FACTS), plus which canonical signals the engine serves.

The offload mode, first rule that applies (``offload_basis`` says which, with the word
"exposed"):

1. ``kv_offload_config_info`` present → native (vLLM 0.33 writes it only when the CPU
   offloading spec runs);
2. ``cache_config_info`` with ``kv_offloading_backend="lmcache"`` → lmcache; with a backend
   and a ``kv_offloading_size`` that is not ``None`` → that backend. vLLM 0.33 writes
   ``kv_offloading_backend="native"`` even when offloading is off: the size says it is on;
3. native offload transfer counters served → native; the LMCache MP connector's lookup
   histogram on the engine → lmcache;
4. ``kv_offloading_size="None"`` and none of the above → none (offloading is off);
5. else unknown (None): releases before the offloading labels say nothing either way.

An operator's targets.yaml ``offload`` wins over this ("configured").
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from collector.catalog import FACTS, SIGNALS

__all__ = ["ENGINE_FACTS", "OFF_SIZES", "engine_facts_of", "offload_from_facts"]

CACHE_CONFIG, KV_OFFLOAD_CONFIG = "cache_config", "kv_offload_config"  # catalog.FACTS keys
ENGINE_FACTS = (CACHE_CONFIG, KV_OFFLOAD_CONFIG)  # the fact families a vLLM engine exposes
OFF_SIZES = frozenset({"", "None", "none", "0", "0.0"})
_MODES = ("native", "lmcache")
# canonical signals whose presence on an engine shows a connector
_NATIVE_SIGNALS = ("offload_bytes_total", "offload_seconds_total")
# the LMCache connector's series on the engine's own /metrics: vLLM-source LMCache signals
_LMCACHE_SIGNALS = tuple(n for n, d in SIGNALS.items() if d.source == "vllm" and "lmcache" in n)
_INTS = ("num_gpu_blocks", "block_size", "num_cpu_blocks")

Rows = Mapping[str, Sequence[Mapping[str, str]]]


def offload_from_facts(facts: Rows, signals: Collection[str] = ()) -> tuple[str | None, str]:
    """(offload mode or None, basis) of one engine (module docstring's rules)."""
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
