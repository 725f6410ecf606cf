"""Sizing for the chosen offload mode: engines, CPU DRAM, LMCache L1/L2 and the configs.

`size(evidence, decision)` turns a Decision into numbers with their basis: engines for the
forecast peak plus headroom (with the forecast's bounds; the peak is the KV-demand forecast's,
or the KV the request-rate forecast implies when that is wholly higher: ``demand_basis``
says which, see planner/forecast/implied_kv.py), the native CPU buffer per engine,
the LMCache L1 per node (from the hit-rate curve, else the working set), the eviction
watermark, the L2 adapter by sharing scope, and the ready-to-use command lines of
planner/deploy/configs.py. `prefix_savings` prices a tenant's shared prefix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from core.errors import ConfigError
from planner.decide.decision import Decision
from planner.decide.evidence import CapacityEvidence, Evidence
from planner.deploy import configs
from planner.domain.costmodel import (
    hbm_kv_capacity_tokens,
    kv_bytes_per_token,
    kv_bytes_per_token_engine,
)
from planner.domain.hardware import GPU, Model, get_gpu, get_model

GIB = 1024**3
LATEST_VLLM = "0.33.0"
# Assumption: native CPU buffer = 2× the engine's HBM KV when the working set is unknown. The
# GKE tests ran 1 TiB CPU beside 640 GiB HBM (≈ 430 GiB of it KV for a 70B bf16 model),
# a 1.6–2.4× ratio [source: gke-tiered-kv-2025]; NVIDIA Dynamo's KVBM guide asks for at least
# 1× [source: nvidia-dynamo-kvbm-config].
NATIVE_TO_HBM_KV = 2.0
DEFAULT_HEADROOM = 0.2  # engines sized for the peak + 20 % (DECIDER.md, Sizing)
CROSS_NODE_MIN = 0.1  # share of cross-engine reuse on other nodes that justifies a shared L2
PLACEHOLDERS: Mapping[str, Mapping[str, object]] = {
    "fs": {"base_path": "/mnt/nvme/lmcache-l2"},
    "mooncake_store": {
        "master_server_addr": "MOONCAKE_MASTER:50051",
        "metadata_server": "http://MOONCAKE_MASTER:8080/metadata",
        "local_hostname": "$(HOST_IP)",
        "protocol": "tcp",
    },
    "resp": {"host": "VALKEY_HOST", "port": 6379},
    "s3": {"s3_endpoint": "s3://BUCKET", "s3_region": "REGION"},
}
K8S_NOTES = (
    "Kubernetes: one LMCache server per node (DaemonSet) shared by the node's vLLM pods; the "
    "default pattern needs hostNetwork and a /dev/shm host mount, which the baseline and "
    "restricted Pod Security Standards forbid. --isolated-ipc on the server plus "
    "lmcache.mp.isolated_ipc on the client removes the /dev/shm need, not hostNetwork. In a pod, "
    "set HOST_IP from status.hostIP: Kubernetes expands $(HOST_IP) in container args."
)


@dataclass(frozen=True, slots=True)
class EngineSizing:
    needed: int
    lo: int
    hi: int
    current: int | None
    headroom: float
    peak: float
    peak_lo: float
    peak_hi: float
    capacity_per_engine: float
    unit: str
    basis: str
    needed_with_offload: int | None = None
    demand_basis: str = ""  # which forecast the peak comes from and why (Evidence)
    # The bill (decision's mode): engines with offload at the capacity ratio's interval ends
    # (few engines = the ratio's upper end), the GPU-hours a day saved at the point estimate and
    # at the ends, and what the ratio rests on. None: no capacity ratio that can tell.
    with_offload_range: tuple[int, int] | None = None
    gpu_hours_saved_per_day: float | None = None
    gpu_hours_saved_range: tuple[float, float | None] | None = None
    capacity_ratio: str = ""


@dataclass(frozen=True, slots=True)
class L2Choice:
    kind: str  # fs | mooncake_store | resp | valkey | s3
    scope: str  # node | cluster
    spec: str  # the --l2-adapter JSON
    reason: str


@dataclass(frozen=True, slots=True)
class Sizing:
    mode: str
    engines: EngineSizing | None
    native_cpu_gib: float | None  # per engine, total over its TP ranks
    l1_size_gib: float | None  # per node (one LMCache server per node)
    l1_basis: str
    eviction_watermark: float | None
    l2: L2Choice | None
    configs: Mapping[str, str]
    notes: tuple[str, ...]
    unknowns: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["configs"] = dict(self.configs)
        d["notes"], d["unknown"] = list(self.notes), list(d.pop("unknowns"))
        return d


def _engines(
    ev: Evidence, decision: Decision, headroom: float, unknown: list[str]
) -> EngineSizing | None:
    peak = ev.demand_peak
    if peak is None:
        unknown.append("demand_peak (forecast) for engine sizing")
        return None
    found = engine_capacity(ev)
    if found is None:
        unknown.append("engine_capacity (or demand_now, engines and kv_util_p50)")
        return None
    capacity, basis = found
    needed = _count(peak.estimate, capacity, headroom)
    fit = {"native": ev.native_capacity, "lmcache": ev.lmcache_capacity}.get(decision.mode)
    b = engine_bill(peak.estimate, capacity, headroom, fit, ev.tp)
    return EngineSizing(
        needed,
        _count(peak.lo, capacity, headroom),
        _count(peak.hi, capacity, headroom),
        ev.engines,
        headroom,
        peak.estimate,
        peak.lo,
        peak.hi,
        capacity,
        ev.demand_unit,
        basis,
        None if b is None else b.with_offload,
        ev.demand_basis,
        None if b is None else b.with_offload_range,
        None if b is None else b.gpu_hours_saved_per_day,
        None if b is None else b.gpu_hours_saved_range,
        "" if b is None else b.rests_on,
    )


def engine_capacity(ev: Evidence) -> tuple[float, str] | None:
    """(demand one engine without offload carries, its basis) in the demand's unit, or None."""
    if ev.engine_capacity is not None:
        return ev.engine_capacity, "engine_capacity (measured)"
    util = ev.kv_util_p50
    if ev.demand_now and ev.engines and util:
        # Assumption: demand grows in proportion to KV use, so one engine at 100 % KV
        # carries demand_now / engines / p50 KV use.
        return ev.demand_now / ev.engines / util, "demand_now / engines / kv_util_p50"
    return None


def _count(demand: float, cap: float, headroom: float) -> int:
    return max(1, math.ceil(demand * (1 + headroom) / cap - 1e-9))


@dataclass(frozen=True, slots=True)
class Bill:
    """Engines for a demand peak with and without one offload mode, and the GPU-hours saved."""

    needed: int  # without offload
    with_offload: int  # at the capacity ratio's estimate
    with_offload_range: tuple[int, int]  # (fewest, most): the ratio's upper and lower ends
    gpu_hours_saved_per_day: float
    gpu_hours_saved_range: tuple[float, float | None]  # None: a lower-bound ratio, no upper
    rests_on: str


def engine_bill(
    peak: float, capacity: float, headroom: float, fit: CapacityEvidence | None, tp: int | None
) -> Bill | None:
    """The bill of ``fit``'s mode at ``peak`` demand (capacity per engine without offload,
    in the peak's unit), or None without a capacity ratio that can tell."""
    if fit is None or not fit.can_tell or fit.ratio is None or fit.ratio.lo <= 0:
        return None
    r = fit.ratio
    needed = _count(peak, capacity, headroom)
    with_offload = _count(peak, capacity * r.estimate, headroom)
    most = _count(peak, capacity * r.lo, headroom)  # the ratio's lower end: more engines
    fewest = with_offload if fit.lower_bound else _count(peak, capacity * r.hi, headroom)
    per_day = 24.0 * (tp or 1)
    hi = None if fit.lower_bound else (needed - fewest) * per_day
    saved = (needed - with_offload) * per_day
    rests = f"{fit.provenance} capacity ratio {fit.text()}"
    return Bill(needed, with_offload, (fewest, most), saved, ((needed - most) * per_day, hi), rests)


def l1_from_curve(
    curve: tuple[tuple[float, float], ...], target: float | None
) -> tuple[float, float]:
    """(GiB, target) : the smallest L1 whose hit rate reaches `target` on the fitted curve,
    interpolated linearly; target None = 95 % of the curve's plateau (its highest hit rate).
    A target above the plateau returns the largest measured size."""
    points = sorted(curve)
    if not points:
        raise ConfigError("l1_hit_curve is empty")
    running, monotone = 0.0, []
    for size, rate in points:
        running = max(running, rate)  # a hit-rate curve cannot fall with more cache
        monotone.append((size, running))
    goal = 0.95 * monotone[-1][1] if target is None else target
    for i, (size, rate) in enumerate(monotone):
        if rate >= goal:
            if i == 0:
                return size, goal
            s0, r0 = monotone[i - 1]
            return s0 + (size - s0) * (goal - r0) / (rate - r0), goal
    return monotone[-1][0], goal


def _resolve(ev: Evidence, unknown: list[str]) -> tuple[Model | None, GPU | None]:
    try:
        model = get_model(ev.model) if ev.model else None
        gpu = get_gpu(ev.gpu) if ev.gpu else None
    except ConfigError as exc:
        unknown.append(f"hardware: {exc}")
        return None, None
    if model is None or gpu is None or ev.tp is None:
        unknown.append("model/gpu/tp (KV bytes per token, HBM KV per engine)")
        return None, None
    return model, gpu


def _l2(
    ev: Evidence,
    decision: Decision,
    *,
    capped: bool,
    params: Mapping[str, object] | None,
    notes: list[str],
    unknown: list[str],
) -> L2Choice | None:
    if decision.l2_ok is False:
        notes.append("no L2: the L2 tier reloads slower than re-prefill (rule R3_slow_tier)")
        return None
    nodes = ev.nodes or 1
    if nodes > 1 and ev.cross_node_reuse is None:
        unknown.append("cross_node_reuse (node-local or shared L2)")
    cluster = nodes > 1 and (ev.cross_node_reuse or 0) >= CROSS_NODE_MIN
    name = (ev.l2_tier or "").lower()
    if "s3" in name or "object" in name:
        kind = "s3"
    elif "valkey" in name or "redis" in name or "remote-lmcache" in name:
        kind = "resp"
    elif "mooncake" in name:
        kind = "mooncake_store"
    elif "ceph" in name or (name and not cluster):
        kind = "fs"  # a CephFS mount is shared; local NVMe is node-local
    else:
        kind = "mooncake_store" if cluster else "fs"
    if cluster and kind == "fs" and "ceph" not in name:
        kind = "mooncake_store"
        notes.append(f"L2 tier {ev.l2_tier} is node-local; cross-node reuse needs a shared store")
    if not cluster and not capped:
        return None  # L1 holds the working set and nothing is shared across nodes
    fields = dict(params) if params else dict(PLACEHOLDERS[kind])
    if not params:
        notes.append("replace the UPPERCASE placeholders of the L2 adapter with your endpoints")
    scope = "cluster" if cluster else "node"
    reason = (
        f"{ev.cross_node_reuse:.0%} of cross-engine reuse is on other nodes: a shared {kind} store"
        if cluster
        else f"the working set exceeds the L1 DRAM cap: spill to node-local {kind}"
    )
    return L2Choice(kind, scope, configs.l2_adapter_json(kind, fields), reason)


@dataclass(frozen=True, slots=True)
class _Memory:
    """What the CPU tiers are sized from, in GiB (None: unknown)."""

    kv_gib: float | None  # HBM KV of one engine
    working_gib: float | None  # the working set (the distinct prefixes' KV)
    usable: float | None  # DRAM per node left after the reserve
    per_node: int  # engines per node (1 when unknown)


def size(  # noqa: PLR0913 - keyword-only sizing inputs, each with a default
    evidence: Evidence,
    decision: Decision,
    *,
    headroom: float = DEFAULT_HEADROOM,
    target_hit_rate: float | None = None,
    eviction_watermark: float = configs.LMCACHE_WATERMARK,
    dram_reserve_fraction: float = 0.2,
    lmcache_host: str = "localhost",
    lmcache_port: int = configs.LMCACHE_PORT,
    l2_params: Mapping[str, object] | None = None,
    isolated_ipc: bool = False,
) -> Sizing:
    """Numbers and configs for decision.mode (see the module docstring)."""
    if not 0 <= headroom < 10:
        raise ConfigError(f"headroom must be in [0, 10), got {headroom!r}")
    if not 0 <= dram_reserve_fraction < 1:
        raise ConfigError(f"dram_reserve_fraction must be in [0, 1), got {dram_reserve_fraction}")
    ev, mode = evidence, decision.mode
    unknown: list[str] = []
    notes: list[str] = []
    engines = _engines(ev, decision, headroom, unknown)
    if mode == "none":
        return Sizing(mode, engines, None, None, "", None, None, {}, (), tuple(unknown))
    model, gpu = _resolve(ev, unknown)
    mem = _memory(ev, model, gpu, dram_reserve_fraction, unknown)
    native_gib = None
    if mode in ("native", "both"):
        if mem.kv_gib is None:
            return _without_hardware(mode, engines, notes, unknown)
        native_gib = _native_gib(
            ev, mode, mem, kv_gib=mem.kv_gib, eviction_watermark=eviction_watermark, notes=notes
        )
    l1_gib, basis, capped = None, "", False
    if mode in ("lmcache", "both"):
        l1 = _l1(ev, mem, native_gib, target_hit_rate, eviction_watermark)
        if l1 is None:
            return _without_hardware(mode, engines, notes, unknown)
        l1_gib, basis, capped = l1
    l2 = (
        _l2(ev, decision, capped=capped, params=l2_params, notes=notes, unknown=unknown)
        if l1_gib is not None
        else None
    )
    lmcache = _LMCacheServer(lmcache_host, lmcache_port, eviction_watermark, isolated_ipc)
    out = _configs(
        ev, mode, model, native_gib=native_gib, l1_gib=l1_gib, l2=l2, lmcache=lmcache,
        notes=notes, unknown=unknown,
    )  # fmt: skip
    return Sizing(
        mode,
        engines,
        native_gib,
        l1_gib,
        basis,
        eviction_watermark if l1_gib else None,
        l2,
        out,
        tuple(notes),
        tuple(unknown),
    )


def _memory(
    ev: Evidence,
    model: Model | None,
    gpu: GPU | None,
    dram_reserve_fraction: float,
    unknown: list[str],
) -> _Memory:
    """An engine's HBM KV, the working set and the usable DRAM per node, as far as known;
    ``unknown`` says what is not."""
    tp, per_node = ev.tp or 1, ev.engines_per_node or 1
    if ev.engines_per_node is None:
        unknown.append("engines_per_node (1 assumed)")
    kv_gib = kv_engine = None
    if model is not None and gpu is not None:
        kv_engine = kv_bytes_per_token_engine(model)
        kv_gib = hbm_kv_capacity_tokens(model, gpu, tp) * kv_bytes_per_token(model, tp) * tp / GIB
    working_gib = None
    if ev.distinct_prefix_tokens is not None and kv_engine is not None:
        working_gib = ev.distinct_prefix_tokens * kv_engine / GIB
    elif ev.distinct_prefix_tokens is None:
        unknown.append("distinct_prefix_tokens (working set)")
    usable = None
    if ev.cpu_dram_per_node_gib is None:
        unknown.append("cpu_dram_per_node_gib (no DRAM cap applied)")
    else:
        usable = ev.cpu_dram_per_node_gib * (1 - dram_reserve_fraction)
    return _Memory(kv_gib, working_gib, usable, per_node)


def _native_gib(
    ev: Evidence,
    mode: str,
    mem: _Memory,
    *,
    kv_gib: float,
    eviction_watermark: float,
    notes: list[str],
) -> float:
    """The native CPU buffer per engine: the engines' reuse-curve knee, else the working
    set at the watermark (at least the HBM KV), capped by its share of the DRAM."""
    if ev.cpu_tier_native_gib:
        # the knee of the engines' own reuse curve (planner/plan/tier.py)
        need = ev.cpu_tier_native_gib
        notes.append(
            f"native CPU buffer from the engines' reuse curve: {need:.0f} GiB, the size past "
            "which more CPU adds little (the plan's 'What a CPU tier would buy')"
        )
    else:
        working_gib = mem.working_gib
        need = max(
            kv_gib,
            working_gib / eviction_watermark if working_gib else NATIVE_TO_HBM_KV * kv_gib,
        )
    usable, per_node = mem.usable, mem.per_node
    share = usable / per_node / (2 if mode == "both" else 1) if usable is not None else None
    native_gib = float(math.floor(min(need, share) if share is not None else need))
    if share is not None and share < kv_gib:
        notes.append(
            f"DRAM allows {share:.0f} GiB per engine, less than its HBM KV ({kv_gib:.0f} GiB)"
        )
    return native_gib


def _l1(
    ev: Evidence,
    mem: _Memory,
    native_gib: float | None,
    target_hit_rate: float | None,
    eviction_watermark: float,
) -> tuple[float, str, bool] | None:
    """(GiB, basis, capped by DRAM) of the LMCache L1 per node: from the hit-rate curve,
    else the reuse curve, the working set or the node's HBM KV; None when none is known."""
    working_gib, kv_gib, per_node = mem.working_gib, mem.kv_gib, mem.per_node
    safety = 1 / eviction_watermark  # the working set sits at the eviction trigger
    if ev.l1_hit_curve:
        curve_gib, goal = l1_from_curve(ev.l1_hit_curve, target_hit_rate)
        need, basis = curve_gib, f"hit-rate curve: {goal:.0%} hit rate"
    elif ev.cpu_tier_pool_gib:
        need = ev.cpu_tier_pool_gib * safety
        basis = f"the engines' reuse curve: {ev.cpu_tier_pool_gib:.0f} GiB / watermark"
    elif working_gib is not None:
        need, basis = working_gib * safety, f"working set {working_gib:.1f} GiB / watermark"
    elif kv_gib is not None:
        need, basis = per_node * kv_gib, "HBM KV of the node's engines (KVBM: CPU >= device)"
    else:
        return None
    usable = mem.usable
    cap = usable - per_node * (native_gib or 0) if usable is not None else None
    capped = cap is not None and need > cap
    l1_gib = float(math.ceil(min(need, cap) if cap is not None else need))
    if capped:
        basis += f", capped by DRAM ({cap:.0f} GiB usable)"
    if l1_gib < 1:
        raise ConfigError(f"no DRAM left for the LMCache L1 ({cap} GiB usable)")
    return l1_gib, basis, capped


@dataclass(frozen=True, slots=True)
class _LMCacheServer:
    """Where the LMCache server listens and how it runs (the configs' options)."""

    host: str
    port: int
    eviction_watermark: float
    isolated_ipc: bool


def _configs(  # noqa: PLR0913 - the sizing's parts, passed through once
    ev: Evidence,
    mode: str,
    model: Model | None,
    *,
    native_gib: float | None,
    l1_gib: float | None,
    l2: L2Choice | None,
    lmcache: _LMCacheServer,
    notes: list[str],
    unknown: list[str],
) -> dict[str, str]:
    """The vLLM (and LMCache server) command lines of ``mode`` at these sizes; none, with
    a note, for a vLLM version they do not support."""
    tp = ev.tp or 1
    version = ev.vllm_version or LATEST_VLLM
    if ev.vllm_version is None:
        unknown.append(f"vllm_version ({LATEST_VLLM} assumed for the configs)")
    host, port, ipc = lmcache.host, lmcache.port, lmcache.isolated_ipc
    out: dict[str, str] = {}
    try:
        per_gpu = kv_bytes_per_token(model, tp) if model is not None else None
        if mode == "native" and native_gib is not None:
            out["vllm"] = configs.vllm_native_offload_args(
                version, native_gib, kv_bytes_per_token_per_gpu=per_gpu, tp=tp
            )
        if l1_gib is not None:
            out["lmcache_server"] = configs.lmcache_server_command(
                l1_gib,
                host=None if host in ("localhost", "127.0.0.1") else "0.0.0.0",
                port=port,
                eviction_trigger_watermark=lmcache.eviction_watermark,
                l2_adapters=[l2.spec] if l2 else [],
                isolated_ipc=ipc,
            )
            if mode == "both" and native_gib is not None:
                out["vllm"] = configs.vllm_both_args(
                    version, native_gib, host, port, kv_bytes_per_token_per_gpu=per_gpu, tp=tp,
                    isolated_ipc=ipc,
                )  # fmt: skip
            else:
                out["vllm"] = configs.vllm_lmcache_mp_args(
                    version, host, port, world_size=tp, isolated_ipc=ipc
                )
            notes.append(K8S_NOTES)
    except ConfigError as exc:
        notes.append(f"no configs: {exc}")
        unknown.append("a supported vllm_version (0.11–0.33)")
    return out


def _without_hardware(
    mode: str, engines: EngineSizing | None, notes: list[str], unknown: list[str]
) -> Sizing:
    notes.append("no DRAM sizing or configs without model/gpu/tp or a working set")
    return Sizing(mode, engines, None, None, "", None, None, {}, tuple(notes), tuple(unknown))
