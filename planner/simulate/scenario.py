"""Scenario files: the cluster, its offload set-up, the workload, duration and seed.

`load_scenario(path)` / `parse_scenario(mapping)` validate everything (unknown keys and
impossible values raise ConfigError naming the dotted key) and resolve the hardware through
planner.domain.hardware / planner.domain.costmodel. Every default below is documented with its
source in planner/simulate/PARAMETERS.md; `Scenario.params` lists each value used and its origin.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from core.errors import ConfigError
from planner.domain import costmodel
from planner.domain.hardware import GPU, Model, get_gpu, get_model, with_kv_dtype
from planner.simulate.connector_spec import (
    LMCacheSpec,
    NativeSpec,
    parse_lmcache,
    parse_native,
)
from planner.simulate.router_spec import ScorerSpec, parse_scorer
from planner.simulate.spec import Param, Section
from planner.simulate.switchback import Schedule, SwitchbackSpec, parse_switchback
from planner.simulate.workload_spec import WorkloadSpec, parse_workload

GB = 1e9
# vLLM's OpenAI server takes its batch limits from the GPU it runs on (EngineArgs.
# _set_default_args in 0.10, get_batch_defaults later) [source: vllm-engine-config]: large
# limits from 70 GiB of device memory up, except on A100s (vLLM PR 17885 measured them slower).
LARGE_GPU_BYTES = 70 * costmodel.GIB
LARGE_BATCH_DEFAULTS = (1024, 8192)  # (max_num_seqs, max_num_batched_tokens)
SMALL_BATCH_DEFAULTS = (256, 2048)


def vllm_batch_defaults(gpu: GPU) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) vLLM's OpenAI server picks on `gpu` when the
    flags are not given: H100, H200 and other >= 70 GiB GPUs but the A100 get 1024 and 8192,
    the rest 256 and 2048."""
    if gpu.hbm_bytes >= LARGE_GPU_BYTES and "a100" not in gpu.name:
        return LARGE_BATCH_DEFAULTS
    return SMALL_BATCH_DEFAULTS


OFFLOAD_MODES = ("none", "native", "lmcache")
ROUTERS = ("round_robin", "least_loaded", "prefix_affinity", "scorer")
SCOPES = ("engine", "node", "cluster")
# The scenario's top-level keys; a bare sweep key outside them names a cluster or workload key.
TOP_LEVEL_KEYS = frozenset(
    {"cluster", "engine", "workload", "duration_s", "seed", "warmup_s", "name"}
)
# `engine`: options of every engine's vLLM server that do not shape the cluster
ENGINE_KEYS = frozenset({"kv_cache_metrics", "kv_cache_metrics_sample"})
CLUSTER_KEYS = frozenset(
    {
        "nodes",
        "gpus_per_node",
        "gpu",
        "model",
        "tensor_parallel",
        "gpu_memory_utilization",
        "offload",
        "cpu_cache_gb",
        "engines_offload",
        "lmcache_scope",
        "max_num_seqs",
        "max_num_batched_tokens",
        "max_model_len",
        "block_size",
        "num_gpu_blocks",
        "kv_cache_dtype",
        "mfu",
        "hbm_efficiency",
        "pcie_gbps",
        "step_overhead_s",
        "activation_reserve_gb",
        "router",
        "scorer",
        "resume_after_load",
        "enable_prefix_caching",
        "native",
        "lmcache",
        "switchback",
        "load_shares",
    }
)

# Sources of the defaults (PARAMETERS.md repeats them with the reasoning).
SRC_VLLM_BATCH = (
    "default: vLLM's OpenAI server for this GPU (>= 70 GiB and not an A100: max_num_seqs "
    "1024, max_num_batched_tokens 8192; else 256 and 2048) [source: vllm-engine-config]"
)
SRC_VLLM_CACHE = (
    "default: vLLM CacheConfig (block_size 16, gpu_memory_utilization 0.9) "
    "[source: vllm-engine-config]"
)
SRC_MFU = "default: costmodel.DEFAULT_MFU (assumption: prefill MFU 40-60 % prior)"
SRC_HBM = "default: costmodel.DEFAULT_HBM_EFFICIENCY (assumption: decode at ~0.7 of HBM bw)"
SRC_OVERHEAD = "default: costmodel.DEFAULT_STEP_OVERHEAD_S (assumption: fit from ITL)"
SRC_RESERVE = "default: costmodel.DEFAULT_ACTIVATION_RESERVE_BYTES (assumption, 2 GiB)"
SRC_SCOPE = "default: one LMCache server per node (K8s DaemonSet) [source: lmcache-mp-docs]"
SRC_KV_METRICS = (
    "default: vLLM --kv-cache-metrics off, --kv-cache-metrics-sample 0.01 (0 < rate <= 1) "
    "[source: vllm-kv-cache-metrics]"
)
SRC_CPU = "default: assumption (100 GB host DRAM per engine / pool)"
SRC_RESUME = (
    "default: vLLM v1 Scheduler.schedule() appends a request whose async KV load finished "
    "to `running` (FCFS preemption pops the last)"
)
RESUME_ORDERS = ("append", "in_place")


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    nodes: int
    gpus_per_node: int
    gpu: GPU
    model: Model
    tensor_parallel: int
    gpu_memory_utilization: float
    offload: str
    cpu_cache_bytes: float
    engines_offload: tuple[str, ...]  # one mode per engine
    lmcache_scope: str
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    num_gpu_blocks: int
    mfu: float
    hbm_efficiency: float
    pcie_Bps: float  # noqa: N815 - one way, per GPU
    step_overhead_s: float
    router: str
    enable_prefix_caching: bool
    native: NativeSpec
    lmcache: LMCacheSpec
    kv_bytes_per_token_gpu: float  # on one GPU of the TP group
    kv_bytes_per_token_engine: float  # unique bytes the engine holds (what a tier stores)
    max_model_len: int  # longest request (prompt + output) the frontend accepts
    # where a request whose async KV load finished enters the running queue: "append" (vLLM:
    # behind everything admitted while it loaded, so the first preemption victim) or
    # "in_place" (a what-if: the place it would have had, admitted when its load began)
    resume_after_load: str = "append"
    # router "scorer": its weights and prefix indexes (router_spec.py)
    scorer: ScorerSpec = field(default_factory=ScorerSpec)
    # canary engines whose offload is switched on and off in periods (switchback.py); their
    # engines_offload entries are the mode of period 0
    switchback: SwitchbackSpec | None = None
    # router round_robin: a weighted split, one weight per engine (None: equal turns)
    load_shares: tuple[float, ...] | None = None
    # vLLM --kv-cache-metrics / --kv-cache-metrics-sample (scenario key `engine`): the KV
    # residency histograms, a sampled fraction of the allocated blocks (residency.py)
    kv_cache_metrics: bool = False
    kv_cache_metrics_sample: float = 0.01

    @property
    def engines_per_node(self) -> int:
        return self.gpus_per_node // self.tensor_parallel

    @property
    def num_engines(self) -> int:
        return self.nodes * self.engines_per_node


@dataclass(frozen=True, slots=True)
class Scenario:
    cluster: ClusterSpec
    workload: WorkloadSpec
    duration_s: float
    warmup_s: float
    seed: int
    name: str
    raw: Mapping[str, Any]
    params: tuple[Param, ...]


def read_scenario_file(path: str | Path) -> dict[str, Any]:
    """Read a scenario YAML file into its raw mapping (not validated yet)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read scenario: {exc.strerror or exc}") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: top level must be a mapping")
    return raw


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario YAML file."""
    p = Path(path)
    return parse_scenario(read_scenario_file(p), where=str(p), base_dir=p.parent)


def parse_scenario(raw: object, where: str = "scenario", base_dir: Path | None = None) -> Scenario:
    """Validate a scenario mapping (as read from YAML)."""
    params: list[Param] = []
    top = Section(raw, "", where, params)
    cluster = _parse_cluster(top.section("cluster"))
    cluster = _parse_engine(top.section("engine"), cluster)
    workload = parse_workload(top.section("workload"), base_dir)
    duration = top.number("duration_s", 600.0, low=0.0, low_open=True, source="default: 600 s")
    warmup = top.number("warmup_s", 0.0, low=0.0, source="default: no warm-up")
    if warmup >= duration:
        raise top.fail("warmup_s", f"must be < duration_s ({duration:g}), got {warmup:g}")
    seed = top.integer("seed", 1, low=0, source="default: 1")
    name = top.string("name", Path(where).stem if where != "scenario" else "scenario")
    top.finish()
    assert isinstance(raw, Mapping)
    if cluster.switchback is not None:
        cluster = _start_switchback(cluster, seed, params)
    return Scenario(cluster, workload, duration, warmup, seed, name, raw, tuple(params))


def _parse_cluster(sec: Section) -> ClusterSpec:
    nodes, gpn, gpu, model, tp = _hardware(sec)
    try:
        kv_gpu = costmodel.kv_bytes_per_token(model, tp)
    except ConfigError as exc:
        raise sec.fail("tensor_parallel", str(exc)) from exc
    util, block, num_blocks = _kv_blocks(sec, model, gpu, tp)
    max_seqs, budget = _batch_limits(sec, gpu)
    max_len = _max_model_len(sec, model, num_blocks * block)
    mfu, hbm_eff, pcie, overhead = _speeds(sec, gpu)
    router = sec.choice("router", "round_robin", ROUTERS, source="default: round_robin")
    scorer = parse_scorer(sec, router)
    resume = sec.choice("resume_after_load", "append", RESUME_ORDERS, source=SRC_RESUME)
    prefix = sec.boolean("enable_prefix_caching", True, source="default: vLLM v1 enables it")
    n_engines = nodes * (gpn // tp)
    offload, per_engine, switchback, cpu_gb = _offload(sec, n_engines)
    scope = sec.choice("lmcache_scope", "node", SCOPES, source=SRC_SCOPE)
    native = parse_native(sec.section("native"))
    lmc = parse_lmcache(sec.section("lmcache"))
    shares = _load_shares(sec, router, n_engines)
    sec.finish()
    return ClusterSpec(
        nodes=nodes,
        gpus_per_node=gpn,
        gpu=gpu,
        model=model,
        tensor_parallel=tp,
        gpu_memory_utilization=util,
        offload=offload,
        cpu_cache_bytes=cpu_gb * GB,
        engines_offload=per_engine,
        lmcache_scope=scope,
        max_num_seqs=max_seqs,
        max_num_batched_tokens=budget,
        block_size=block,
        num_gpu_blocks=int(num_blocks),
        mfu=mfu,
        hbm_efficiency=hbm_eff,
        pcie_Bps=pcie,
        step_overhead_s=overhead,
        router=router,
        enable_prefix_caching=prefix,
        native=native,
        lmcache=lmc,
        kv_bytes_per_token_gpu=kv_gpu,
        kv_bytes_per_token_engine=costmodel.kv_bytes_per_token_engine(model),
        max_model_len=max_len,
        resume_after_load=resume,
        scorer=scorer,
        switchback=switchback,
        load_shares=shares,
    )


def _hardware(sec: Section) -> tuple[int, int, GPU, Model, int]:
    """(nodes, gpus_per_node, gpu, model with its KV dtype, tensor_parallel)."""
    nodes = sec.integer("nodes", 1, low=1, high=4096, source="default: 1 node")
    gpn = sec.integer("gpus_per_node", 8, low=1, high=64, source="default: 8 GPUs per node")
    gpu_name = sec.string("gpu", "h100-80gb", source="default: H100 SXM5 80 GB")
    model_name = sec.string("model", "llama-3.1-8b", source="default: Llama-3.1-8B")
    kv_dtype = sec.choice(
        "kv_cache_dtype",
        "auto",
        ("auto", "bf16", "fp16", "fp8"),
        source="default: vLLM --kv-cache-dtype auto",
    )
    try:
        gpu = get_gpu(gpu_name)
    except ConfigError as exc:
        raise sec.fail("gpu", str(exc)) from exc
    try:
        model = with_kv_dtype(get_model(model_name), kv_dtype)
    except ConfigError as exc:
        raise sec.fail("model", str(exc)) from exc
    tp = sec.integer("tensor_parallel", 1, low=1, source="default: TP 1")
    if tp > gpn:
        raise sec.fail("tensor_parallel", f"{tp} is larger than gpus_per_node ({gpn})")
    if gpn % tp:
        raise sec.fail("tensor_parallel", f"{tp} does not divide gpus_per_node ({gpn})")
    return nodes, gpn, gpu, model, tp


def _kv_blocks(sec: Section, model: Model, gpu: GPU, tp: int) -> tuple[float, int, int]:
    """(gpu_memory_utilization, block_size, KV blocks per engine): the blocks given, else
    what HBM x utilization leaves after the weights and the activation reserve."""
    util = sec.number(
        "gpu_memory_utilization", 0.9, low=0.0, low_open=True, high=1.0, source=SRC_VLLM_CACHE
    )
    reserve = sec.number(
        "activation_reserve_gb",
        costmodel.DEFAULT_ACTIVATION_RESERVE_BYTES / GB,
        low=0.0,
        source=SRC_RESERVE,
    )
    block = sec.integer("block_size", 16, low=1, high=256, source=SRC_VLLM_CACHE)
    blocks_given = sec.optional_integer(
        "num_gpu_blocks",
        source="derived: HBM x utilization - weights - reserve, / KV bytes per token",
    )
    try:
        capacity = costmodel.hbm_kv_capacity_tokens(model, gpu, tp, util, reserve * GB)
    except ConfigError as exc:
        raise sec.fail("gpu_memory_utilization", str(exc)) from exc
    num_blocks = blocks_given if blocks_given is not None else capacity // block
    if num_blocks < 1:
        raise sec.fail("gpu_memory_utilization", f"leaves no KV block for {model.name}")
    return util, block, num_blocks


def _batch_limits(sec: Section, gpu: GPU) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens), by default vLLM's for ``gpu``."""
    seqs_default, budget_default = vllm_batch_defaults(gpu)
    max_seqs = sec.integer("max_num_seqs", seqs_default, low=1, high=65536, source=SRC_VLLM_BATCH)
    budget = sec.integer("max_num_batched_tokens", budget_default, low=1, source=SRC_VLLM_BATCH)
    if budget < max_seqs:
        raise sec.fail(
            "max_num_batched_tokens",
            f"{budget} is smaller than max_num_seqs ({max_seqs}); vLLM rejects it",
        )
    return max_seqs, budget


def _speeds(sec: Section, gpu: GPU) -> tuple[float, float, float, float]:
    """(mfu, hbm_efficiency, PCIe bytes/s, step_overhead_s) of the cost model."""
    mfu = sec.number("mfu", costmodel.DEFAULT_MFU, low=0.0, low_open=True, high=1.0, source=SRC_MFU)
    hbm_eff = sec.number(
        "hbm_efficiency",
        costmodel.DEFAULT_HBM_EFFICIENCY,
        low=0.0,
        low_open=True,
        high=1.0,
        source=SRC_HBM,
    )
    pcie = (
        sec.number(
            "pcie_gbps",
            gpu.pcie_Bps / GB,
            low=0.0,
            low_open=True,
            source=f"default: {gpu.name} pcie (hardware catalogue)",
        )
        * GB
    )
    overhead = sec.number(
        "step_overhead_s", costmodel.DEFAULT_STEP_OVERHEAD_S, low=0.0, source=SRC_OVERHEAD
    )
    return mfu, hbm_eff, pcie, overhead


def _offload(
    sec: Section, n_engines: int
) -> tuple[str, tuple[str, ...], SwitchbackSpec | None, float]:
    """(offload, each engine's mode, the switchback, cpu_cache_gb): a CPU cache is needed
    once an engine offloads."""
    offload = sec.choice("offload", "none", OFFLOAD_MODES, source="default: no offload")
    per_engine = _engines_offload(sec, offload, n_engines)
    switchback = parse_switchback(sec, per_engine, lmcache_scope_given=sec.has("lmcache_scope"))
    any_offload = any(m != "none" for m in per_engine) or switchback is not None
    cpu_gb = sec.number("cpu_cache_gb", 100.0 if any_offload else 0.0, low=0.0, source=SRC_CPU)
    if any_offload and cpu_gb <= 0:
        raise sec.fail("cpu_cache_gb", "must be > 0 when an engine offloads")
    return offload, per_engine, switchback, cpu_gb


def _parse_engine(sec: Section, cluster: ClusterSpec) -> ClusterSpec:
    """`engine`: vLLM server options every engine shares (the KV residency metrics)."""
    metrics = sec.boolean("kv_cache_metrics", False, source=SRC_KV_METRICS)
    # vLLM's ObservabilityConfig: Field(default=0.01, gt=0, le=1)
    sample = sec.number(
        "kv_cache_metrics_sample", 0.01, low=0.0, low_open=True, high=1.0, source=SRC_KV_METRICS
    )
    sec.finish()
    return replace(cluster, kv_cache_metrics=metrics, kv_cache_metrics_sample=sample)


def _max_model_len(sec: Section, model: Model, kv_tokens: int) -> int:
    """vLLM's --max-model-len: by default the model's context length (config.json
    max_position_embeddings); a larger value is refused (vLLM wants
    VLLM_ALLOW_LONG_MAX_MODEL_LEN). A model without a known context defaults to the KV
    capacity. vLLM also refuses to start when one max_model_len request does not fit the KV
    cache; the simulator instead refuses such requests at the engine (an `abort`)."""
    if model.max_context is None:
        return sec.integer(
            "max_model_len", kv_tokens, low=1, source="default: KV capacity (no model context)"
        )
    return sec.integer(
        "max_model_len",
        model.max_context,
        low=1,
        high=model.max_context,
        source=f"default: {model.name} context length (config.json max_position_embeddings)",
    )


def _engines_offload(sec: Section, offload: str, n_engines: int) -> tuple[str, ...]:
    value = sec.raw("engines_offload")
    if value is None:
        return (offload,) * n_engines
    if not isinstance(value, list) or len(value) != n_engines:
        raise sec.fail("engines_offload", f"must be a list of {n_engines} modes (one per engine)")
    out = []
    for i, mode in enumerate(value):
        if not isinstance(mode, str) or mode.lower() not in OFFLOAD_MODES:
            raise sec.fail(
                f"engines_offload[{i}]", f"must be one of {', '.join(OFFLOAD_MODES)}, got {mode!r}"
            )
        out.append(mode.lower())
    sec.params.append(Param(sec.key("engines_offload"), list(out), "scenario"))
    return tuple(out)


def _start_switchback(cluster: ClusterSpec, seed: int, params: list[Param]) -> ClusterSpec:
    """The switchback's seed (default: the scenario's) and the canaries' mode at t = 0."""
    sb = cluster.switchback
    assert sb is not None
    if sb.seed is None:
        sb = replace(sb, seed=seed)
        params.append(Param("cluster.switchback.seed", seed, "default: the scenario's seed"))
    first = Schedule(sb).mode(0)
    modes = tuple(first if i in sb.engines else m for i, m in enumerate(cluster.engines_offload))
    return replace(cluster, switchback=sb, engines_offload=modes)


def _load_shares(sec: Section, router: str, n_engines: int) -> tuple[float, ...] | None:
    """cluster.load_shares: a weight per engine for round_robin (recorded only when given)."""
    value = sec.raw("load_shares")
    if value is None:
        return None
    if router != "round_robin":
        raise sec.fail("load_shares", f"applies only with router: round_robin (router is {router})")
    if not isinstance(value, list) or len(value) != n_engines:
        raise sec.fail("load_shares", f"must be a list of {n_engines} weights (one per engine)")
    out: list[float] = []
    for i, w in enumerate(value):
        if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w < 0:
            raise sec.fail(f"load_shares[{i}]", f"must be a finite number >= 0, got {w!r}")
        out.append(float(w))
    if not sum(out) > 0:
        raise sec.fail("load_shares", "the weights are all 0: no engine would get a request")
    sec.params.append(Param(sec.key("load_shares"), list(out), "scenario"))
    return tuple(out)


def set_dotted(raw: Mapping[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A deep copy of `raw` with `dotted` (a.b.c) set to `value`.

    A path whose first part is not a top-level section is looked up under `cluster`, then
    `workload` (so `gpu_memory_utilization` means `cluster.gpu_memory_utilization`).
    """
    out: dict[str, Any] = copy.deepcopy(dict(raw))
    parts = [p for p in dotted.split(".") if p]
    if not parts:
        raise ConfigError(f"sweep key {dotted!r} is empty")
    if parts[0] not in TOP_LEVEL_KEYS:
        parts = [_section_of(parts[0]), *parts]
    node: dict[str, Any] = out
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = {}
        if not isinstance(child, dict):
            raise ConfigError(f"sweep key {dotted!r}: {part!r} is not a mapping")
        node[part] = child = dict(child)
        node = child
    node[parts[-1]] = value
    return out


def resolve_dotted(dotted: str) -> str:
    """The full dotted key a (possibly bare) sweep key refers to."""
    parts = [p for p in dotted.split(".") if p]
    if parts and parts[0] not in TOP_LEVEL_KEYS:
        return f"{_section_of(parts[0])}." + ".".join(parts)
    return ".".join(parts)


def _section_of(key: str) -> str:
    """The section a bare key belongs to: cluster, engine, or else workload."""
    if key in CLUSTER_KEYS:
        return "cluster"
    return "engine" if key in ENGINE_KEYS else "workload"
