"""The connector sections of a scenario's cluster: `native` (vLLM's OffloadingConnector) and
`lmcache` (with its optional `l2` tier), parsed into frozen specs (split from scenario.py
to keep modules short)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.errors import ConfigError
from planner.domain import costmodel
from planner.domain.hardware import get_tier
from planner.simulate.spec import Param, Section

GB = 1e9
SRC_NATIVE = (
    "default: vLLM blog 2026-01-08, DMA offload path costs ~0.5 % at 0 % hit "
    "[source: vllm-offloading-connector-2026]"
)
SRC_CHUNK = "default: LMCache --chunk-size 256 [source: lmcache-mp-docs]"
SRC_LOOKUP = "default: assumption, fitted so LMCache with nothing to reuse costs ~1-3 %"
SRC_DECODE = (
    "default: LMCache >= 0.3.4 stores no decode-phase chunks unless save_decode_cache; "
    "0.3.3's vLLM v1 adapter stored them regardless [source: lmcache-0.3.3-source]"
)
SRC_UNFULL = (
    "default: false (LMCache's default from December 2025); 0.3.x before it kept each "
    "prompt's unfull last chunk (save_unfull_chunk true) [source: lmcache-0.3.3-source]"
)
SRC_SYNC_STORE = (
    "default: stores overlap compute; LMCache 0.3.x's in-process connector copies each stored "
    "chunk GPU->CPU and synchronizes before the step ends [source: lmcache-0.3.3-source]"
)
SRC_PROMOTE = (
    "default: an L2 hit is copied into L1; LMCache 0.3.x's in-process retrieve reads it into "
    "a transient buffer of the L1 allocator and keeps it in L2 only [source: lmcache-0.3.3-source]"
)


@dataclass(frozen=True, slots=True)
class NativeSpec:
    """vLLM's OffloadingConnector (engine-local CPU pool, async DMA over PCIe)."""

    step_overhead: float  # fractional step-time cost of the store path when nothing hits
    latency_s: float  # per transfer


@dataclass(frozen=True, slots=True)
class L2Spec:
    name: str
    read_Bps: float  # noqa: N815 - (writes through from L1 are asynchronous: no cost)
    latency_s: float  # per chunk object
    concurrency: int
    size_bytes: float  # math.inf = unbounded


@dataclass(frozen=True, slots=True)
class LMCacheSpec:
    chunk_size: int
    lookup_overhead_s: float  # per admitted request, blocks the step (vLLM scheduler lookup)
    store_overhead_s: float  # per step that stores chunks, blocks the step
    read_Bps: float  # noqa: N815 - L1 -> GPU, per GPU (stores are asynchronous: no cost)
    latency_s: float  # per chunk read from L1
    async_load: bool
    l2: L2Spec | None
    save_decode_cache: bool = False  # chunks filled during decode are stored too
    save_unfull_chunk: bool = False  # a prompt's unfull last chunk is stored (never hit)
    l2_promote: bool = True  # an L2 hit is written into L1 (else: a transient L1 buffer)
    sync_store: bool = False  # the GPU->CPU copy of stored chunks blocks the step


def parse_native(sec: Section) -> NativeSpec:
    tier = get_tier("cpu-dram-pcie")
    frac = sec.number("step_overhead", 0.005, low=0.0, high=1.0, source=SRC_NATIVE)
    lat = (
        sec.number(
            "latency_ms",
            tier.latency_s * 1e3,
            low=0.0,
            source=f"default: tier cpu-dram-pcie ({tier.source})",
        )
        / 1e3
    )
    sec.finish()
    return NativeSpec(frac, lat)


def parse_lmcache(sec: Section) -> LMCacheSpec:
    tier = get_tier("lmcache-cpu-loopback")
    tier_src = "default: tier lmcache-cpu-loopback (13-22 GB/s prior, no publication recorded)"
    chunk = sec.integer("chunk_size", costmodel.LMCACHE_CHUNK_TOKENS, low=1, source=SRC_CHUNK)
    lookup = sec.number("lookup_overhead_s", 1e-3, low=0.0, source=SRC_LOOKUP)
    store = sec.number("store_overhead_s", 2e-4, low=0.0, source=SRC_LOOKUP)
    read = (
        sec.number("bandwidth_gbps", tier.read_Bps / GB, low=0.0, low_open=True, source=tier_src)
        * GB
    )
    lat = sec.number("latency_ms", tier.latency_s * 1e3, low=0.0, source=tier_src) / 1e3
    async_load = sec.boolean(
        "async_load", False, source="default: in-process connector loads inside the forward"
    )
    decode = sec.boolean("save_decode_cache", False, source=SRC_DECODE)
    unfull = sec.boolean("save_unfull_chunk", False, source=SRC_UNFULL)
    sync_store = sec.boolean("sync_store", False, source=SRC_SYNC_STORE)
    l2 = parse_l2(sec.section("l2")) if sec.has("l2") else None
    if l2 is None:
        sec.raw("l2")
    promote = sec.boolean("l2_promote", True, source=SRC_PROMOTE)
    sec.finish()
    return LMCacheSpec(
        chunk, lookup, store, read, lat, async_load, l2, decode, unfull, promote, sync_store
    )


def parse_l2(sec: Section) -> L2Spec:
    name = "custom"
    read = lat = None
    concurrency = 1
    if sec.has("tier"):
        name = sec.string("tier", "")
        try:
            tier = get_tier(name)
        except ConfigError as exc:
            raise sec.fail("tier", str(exc)) from exc
        read, lat, concurrency = tier.read_Bps, tier.latency_s, tier.concurrency
        src = f"default: tier {name}"
    else:
        sec.raw("tier")
        if not sec.has("bandwidth_gbps"):
            raise sec.fail("bandwidth_gbps", "is required when no tier is named")
        src = "scenario"
    read_bw = (
        sec.number("bandwidth_gbps", (read or 1.0) / GB, low=0.0, low_open=True, source=src) * GB
    )
    latency = sec.number("latency_ms", (lat or 0.0) * 1e3, low=0.0, source=src) / 1e3
    conc = sec.integer("concurrency", concurrency, low=1, source=src)
    if sec.has("size_gb"):
        size = sec.number("size_gb", low=0.0, low_open=True) * GB
    else:
        sec.raw("size_gb")
        size = math.inf
        sec.params.append(Param(sec.key("size_gb"), None, "default: unbounded"))
    sec.finish()
    return L2Spec(name, read_bw, latency, conc, size)
