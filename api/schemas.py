"""The API's request and response models (pydantic stays here, at the edge).

Every field has real bounds and an example. Names of models, GPUs and tiers are checked
exactly against the built-in catalogue (planner/domain/data/hardware.yaml) and listed as an
``enum`` in the OpenAPI document; the catalogue is read when the schema or a request first
needs it, not at import. Bounds beyond the CLI's own checks keep one request cheap: prompt +
output tokens stay within every catalogued model's context (40,960 tokens), a what-if
simulates at most 64 engines and 600 s.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from core.durations import API_PATTERN
from planner import domain
from planner.advise import SCORER_DEFAULTS

JsonObject = dict[str, Any]


def _integral(value: Any) -> Any:
    """JSON Schema's integer includes 8000.0: accept it as 8000 (strict models refuse
    floats for ints, as they refuse "8000" and true, which we want refused)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


JsonInt = Annotated[int, BeforeValidator(_integral)]


def _nullable(schema: dict[str, Any]) -> None:
    """``anyOf: [{type: integer, bounds}, {type: null}]`` -> ``{type: [integer, null],
    bounds}``: one schema, so generators keep the bounds (one did not, under anyOf)."""
    alts = schema.get("anyOf")
    if not isinstance(alts, list) or len(alts) != 2 or {"type": "null"} not in alts:
        return
    (inner,) = [a for a in alts if a != {"type": "null"}]
    del schema["anyOf"]
    schema.update({**inner, "type": [inner["type"], "null"]})


@functools.cache
def catalog_names(kind: Literal["models", "gpus", "tiers"]) -> tuple[str, ...]:
    """Canonical names and aliases of one section of the built-in catalogue, sorted."""
    cat = domain.hardware.builtin_catalog()
    table: Any = getattr(cat, kind)
    names = set(table) | {alias for alias, name in cat.aliases.items() if name in table}
    return tuple(sorted(names))


def _enum_of(kind: Literal["models", "gpus", "tiers"]) -> Callable[[JsonObject], None]:
    def extra(schema: JsonObject) -> None:
        schema["enum"] = list(catalog_names(kind))

    return extra


def _known(kind: Literal["models", "gpus", "tiers"]) -> Callable[[str], str]:
    what = kind.removesuffix("s") if kind != "gpus" else "GPU"

    def check(name: str) -> str:
        if name not in catalog_names(kind):
            known = ", ".join(catalog_names(kind))
            raise ValueError(f"unknown {what} {name!r}; known: {known}")
        return name

    return check


ModelName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=100,
        description="model name in kvscope's catalogue (`kvscope costmodel catalog`)",
        examples=["llama-3.1-8b"],
        json_schema_extra=_enum_of("models"),
    ),
    AfterValidator(_known("models")),
]
GpuName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=100,
        description="GPU name in kvscope's catalogue",
        examples=["h100"],
        json_schema_extra=_enum_of("gpus"),
    ),
    AfterValidator(_known("gpus")),
]
TierName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=100,
        description="storage tier name in kvscope's catalogue",
        examples=["cpu-dram-pcie"],
        json_schema_extra=_enum_of("tiers"),
    ),
    AfterValidator(_known("tiers")),
]
TensorParallel = Annotated[Literal[1, 2, 4, 8], BeforeValidator(_integral)]
KvDtype = Literal["auto", "bf16", "fp8"]
ClusterName = Annotated[
    str, Field(min_length=1, max_length=200, pattern=r"^\S(.*\S)?$", examples=["prod-a"])
]
TargetName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$",
        description="unique target name; it becomes the `source` of its windows",
        examples=["engine-0"],
    ),
]
DURATION_PATTERN = API_PATTERN  # core.durations: the CLI's grammar, bounded
Duration = Annotated[
    str,
    Field(
        pattern=DURATION_PATTERN,
        max_length=5,
        description="a duration: a whole number 1–9999 and a unit s, m, h, d or w",
        examples=["15m"],
    ),
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Request(BaseModel):
    """A request body: unknown keys refused, no coercion ("8" is not 8, true is not 1)."""

    model_config = ConfigDict(extra="forbid", strict=True)


# ------------------------------------------------------------------------------- errors


class ErrorBody(_Model):
    """Every error the API answers: what went wrong and, when one input caused it, which."""

    error: str = Field(examples=["unknown cluster 'prod-x' (GET /v1/clusters lists them)"])
    field: str | None = Field(examples=["cluster"])


# ------------------------------------------------------------------------------- health


class Health(_Model):
    status: Literal["ok"] = Field(examples=["ok"])


class Ready(_Model):
    status: Literal["ready"] = Field(examples=["ready"])
    schema_version: int = Field(ge=1, examples=[2])


# ------------------------------------------------------------------------------- clusters


class ClusterOut(_Model):
    name: str = Field(examples=["prod-a"])
    engines: int = Field(ge=0, examples=[8], description="registered engines")
    targets: int = Field(ge=0, examples=[9], description="registered scrape targets")


class ClustersOut(_Model):
    clusters: list[ClusterOut] = Field(examples=[[{"name": "prod-a", "engines": 8, "targets": 9}]])


class EngineOut(_Model):
    source: str = Field(examples=["engine-0"], description="the scrape source of its windows")
    model: str | None = Field(examples=["llama-3.1-8b"])
    gpu: str | None = Field(examples=["h100"])
    hbm_gb: float | None = Field(examples=[80.0])
    tensor_parallel: int | None = Field(examples=[1])
    offload: str = Field(examples=["native"], description="none, native or lmcache")
    facts: JsonObject = Field(
        examples=[{"num_gpu_blocks": 28000, "block_size": 16,
                   "provenance": {"offload": "exposed: cache_config_info ..."}}],
        description="engine facts (the labels of the engine's cache-config info series); "
        "`provenance` says where each column came from: exposed, configured or assumed",
    )  # fmt: skip
    changes: list[EngineChangeOut] = Field(
        default_factory=list,
        examples=[[{"at": 1764633600.0, "offload": "native", "facts": {"num_cpu_blocks": 90000}}]],
        description="the regimes observed, oldest first: a new one when the offload mode, "
        "model, GPU, TP or KV pool changed (a restart)",
    )


class EngineChangeOut(_Model):
    at: float = Field(examples=[1764633600.0], description="first observed, epoch seconds")
    offload: str = Field(examples=["native"], description="none, native or lmcache")
    facts: JsonObject = Field(examples=[{"num_gpu_blocks": 28000, "num_cpu_blocks": 90000}])


class EnginesOut(_Model):
    cluster: str = Field(examples=["prod-a"])
    engines: list[EngineOut] = Field(
        examples=[
            [
                {
                    "source": "engine-0",
                    "model": "llama-3.1-8b",
                    "gpu": "h100",
                    "hbm_gb": None,
                    "tensor_parallel": 1,
                    "offload": "none",
                    "facts": {},
                    "changes": [],
                }
            ]
        ]
    )


# ------------------------------------------------------------------------------- signals


class SignalValue(_Model):
    value: float | None = Field(examples=[0.83], description="None: not measurable there")
    stat: str = Field(examples=["mean"], description="mean, rate, ratio or p90 of the window")
    unit: str = Field(examples=["ratio"])
    window_start: float = Field(examples=[1764000000.0], description="epoch s")
    window_s: float = Field(examples=[60.0])


class EngineSignals(_Model):
    source: str = Field(examples=["engine-0"])
    offload: str | None = Field(examples=["none"], description="None: not a registered engine")
    window_start: float = Field(examples=[1764000000.0], description="its latest window")
    age_s: float = Field(examples=[75.0], description="now − the end of its latest window")
    tokens_per_s: float | None = Field(
        examples=[5120.0], description="prompt + generation tokens per second"
    )
    signals: dict[str, SignalValue] = Field(
        examples=[
            {
                "kv_cache_usage_ratio": {
                    "value": 0.83,
                    "stat": "mean",
                    "unit": "ratio",
                    "window_start": 1764000000.0,
                    "window_s": 60.0,
                }
            }
        ],
        description="by canonical signal name (core/catalog.py)",
    )


class SignalsOut(_Model):
    cluster: str = Field(examples=["prod-a"])
    since_s: float = Field(examples=[900.0])
    now: float = Field(examples=[1764000135.0])
    engines: list[EngineSignals] = Field(examples=[[]])


# ------------------------------------------------------------------------------- plans

_HEADLINE_EXAMPLE = {"score": 0.55, "capacity_native": 1.2, "p_saturation": 0.2}


class PlanSummary(_Model):
    id: int = Field(examples=[12])
    cluster: str = Field(examples=["prod-a"])
    group: str = Field(examples=[""], description='"" is the whole-cluster plan')
    created_at: float = Field(examples=[1764000000.0])
    age_s: float = Field(examples=[600.0])
    window_from: float = Field(examples=[1763913600.0])
    window_until: float = Field(examples=[1764000000.0])
    horizon_s: float = Field(examples=[604800.0])
    version: str = Field(examples=["0.1.0"])
    mode: str | None = Field(examples=["native"], description="None: decided per group")
    headline: dict[str, float | None] = Field(examples=[_HEADLINE_EXAMPLE])


class PlanOut(PlanSummary):
    document: JsonObject = Field(
        examples=[{"decision": {"mode": "native"}}],
        description="the `kvscope plan --json` object",
    )


class PlansOut(_Model):
    cluster: str = Field(examples=["prod-a"])
    group: str | None = Field(examples=[None], description="None: every group")
    since_s: float | None = Field(examples=[604800.0], description="None: all history")
    plans: list[PlanSummary] = Field(examples=[[]], description="newest first")


class _PlanSection(_Model):
    """A section of the latest stored plan, with the plan's identity and age."""

    cluster: str = Field(examples=["prod-a"])
    group: str = Field(examples=[""])
    plan_id: int = Field(examples=[12])
    created_at: float = Field(examples=[1764000000.0])
    age_s: float = Field(examples=[600.0])


class ForecastOut(_PlanSection):
    forecast: JsonObject = Field(
        examples=[{"kv_demand": {"method": "naive @60s"}}],
        description="the plan's forecast section",
    )


class OffloadOut(_PlanSection):
    offload: JsonObject = Field(
        examples=[
            {
                "slo": {"ttft_s": 2.0, "quantile": "p90"},
                "modes": {"native": {"capacity": {"ratio": 1.2, "lower_bound": False}}},
            }
        ],
        description="the plan's offload section: per mode today / capacity / bill / experiment",
    )


# The cpu_tier section ("What a CPU tier would buy", planner/plan/tier.py). Its parts keep
# keys they do not name (the planner may add figures) and default every field, so the empty
# section of a plan made before it existed is valid too.
_MODEL_BASED = (
    "model-based interval (a bootstrap of vLLM's sampled histogram counts, the tail families "
    "past the HBM eviction time and the HBM reproduction error): not a confidence interval"
)


def _est(estimate: float, lo: float, hi: float) -> JsonObject:
    return {"estimate": estimate, "lo": lo, "hi": hi}


class _SectionPart(BaseModel):
    model_config = ConfigDict(extra="allow")


class TierEstimate(_SectionPart):
    """A modelled figure with its model-based interval (at the section's ``level``)."""

    estimate: float | None = Field(
        None, examples=[0.08], description="the model's figure; null: unknown"
    )
    lo: float | None = Field(None, examples=[0.05], description=f"lower end of the {_MODEL_BASED}")
    hi: float | None = Field(None, examples=[0.11], description=f"upper end of the {_MODEL_BASED}")


class TierRow(_SectionPart):
    """One CPU tier size: what it would buy."""

    label: str = Field(
        "",
        examples=["2× HBM"],
        description='"0.5× HBM", "1× HBM", "2× HBM", "4× HBM" or "recommended"',
    )
    multiple: float | None = Field(
        None, examples=[2.0], description="tier size over the HBM KV size it sits behind"
    )
    gib: float | None = Field(
        None,
        examples=[41.0],
        description="tier size, GiB per engine (native) or per LMCache node pool (lmcache)",
    )
    hit_ratio: TierEstimate | None = Field(
        None,
        examples=[_est(0.49, 0.46, 0.52)],
        description="prefix-cache hit ratio (0–1) of HBM and the tier together",
    )
    extra_hit_ratio: TierEstimate | None = Field(
        None,
        examples=[_est(0.08, 0.05, 0.11)],
        description="hit ratio the tier adds to today's (0.08 = +8 points)",
    )
    avoided_prefill_tokens_per_s: TierEstimate | None = Field(
        None,
        examples=[_est(3100.0, 1950.0, 4300.0)],
        description="prompt tokens/s the cluster's engines would no longer re-prefill "
        "(cluster total)",
    )
    prefill_gpu_seconds_saved_per_hour: TierEstimate | None = Field(
        None,
        examples=[_est(1476.0, 929.0, 2048.0)],
        description="GPU-seconds of prefill those tokens take each hour (cluster total)",
    )
    capacity_ratio: TierEstimate | None = Field(
        None,
        examples=[_est(1.05, 1.03, 1.07)],
        description="modelled capacity at the SLO with the tier over without (1.05 = +5 %): "
        "the share of an engine's GPU time at its measured capacity the avoided prefill frees; "
        "null when no engine's capacity was measured",
    )
    extrapolated: bool | None = Field(
        None,
        examples=[True],
        description="true: rests on reuse past the HBM eviction time, which the histograms "
        "do not see (the tail families extrapolate it)",
    )
    can_tell: bool | None = Field(
        None,
        examples=[True],
        description="false: the model cannot tell (why); the interval still bounds the figure",
    )
    why: str = Field("", examples=["extrapolated past the HBM eviction time"])


class TierRecommended(_SectionPart):
    """The recommended size: the knee of the curve."""

    gib: float | None = Field(
        None,
        examples=[62.0],
        description="GiB per engine (native) or per pool (lmcache); null: none",
    )
    multiple: float | None = Field(None, examples=[3.0], description="that over the HBM KV size")
    why: str = Field("", examples=["the knee: past it each GiB adds less than 10 % of ..."])
    extrapolated: bool | None = Field(None, examples=[True])


class TierCurvePoint(_SectionPart):
    """A point of the hit-ratio curve (the report's plot): tier size -> hit ratio."""

    gib: float | None = Field(None, examples=[41.0], description="tier size, GiB (its scope's)")
    hit_ratio: float | None = Field(None, examples=[0.49], description="HBM + tier, 0–1")
    lo: float | None = Field(None, examples=[0.46], description=f"lower end of the {_MODEL_BASED}")
    hi: float | None = Field(None, examples=[0.52], description=f"upper end of the {_MODEL_BASED}")


class TierMode(_SectionPart):
    """One kind of CPU tier: vLLM native offload (per engine) or an LMCache L1 pool."""

    scope: str = Field(
        "",
        examples=["per engine"],
        description="what a size is of: per engine, or per node pool of N engines",
    )
    lower_bound: bool | None = Field(
        None,
        examples=[False],
        description="true for LMCache pools: reuse across engines is not seen per engine, so "
        "the gains are at least these",
    )
    rows: list[TierRow] = Field(
        default_factory=list,
        examples=[[{"label": "2× HBM", "gib": 41.0}]],
        description="0.5×–4× HBM, then the recommended size when there is one",
    )
    recommended: TierRecommended | None = Field(
        None, examples=[{"gib": 62.0, "multiple": 3.0}], description="null: none"
    )
    curve: list[TierCurvePoint] = Field(
        default_factory=list,
        examples=[[{"gib": 0.0, "hit_ratio": 0.41, "lo": 0.41, "hi": 0.41}]],
        description="the hit ratio from no tier (today) to 4× HBM",
    )


class TierHbm(_SectionPart):
    """Today: HBM only, per engine."""

    gib_per_engine: float | None = Field(None, examples=[20.5], description="HBM KV, GiB")
    blocks_per_engine: int | None = Field(None, examples=[10496], description="HBM KV blocks")
    block_size: int | None = Field(None, examples=[16], description="tokens per KV block")
    hit_ratio_measured: float | None = Field(
        None, examples=[0.41], description="prefix-cache hit ratio vLLM counted"
    )
    hit_ratio_model: float | None = Field(
        None, examples=[0.43], description="the same reproduced by the model from the histograms"
    )
    reproduction_error: float | None = Field(
        None, examples=[0.02], description="model − measured; part of every interval"
    )
    eviction_time_s: float | None = Field(
        None,
        examples=[95.0],
        description="how long an unused block survives in HBM; figures past it are extrapolated",
    )


class CpuTierSection(_SectionPart):
    """What a CPU tier would buy, modelled from vLLM's KV residency histograms
    (``--kv-cache-metrics``) before anything is deployed."""

    can_tell: bool | None = Field(
        None,
        examples=[True],
        description="false: no engine's curve could be fitted (why); absent in the empty "
        "section of a plan made before it existed",
    )
    why: str = Field("", examples=[""], description="why it cannot tell")
    enable: str = Field(
        "",
        examples=["start each vLLM engine with --kv-cache-metrics ..."],
        description="how to get the histograms and what they cost",
    )
    engines: int | None = Field(None, examples=[4], description="engines whose curve was fitted")
    engines_without: list[str] = Field(
        default_factory=list,
        examples=[["engine-4"]],
        description="engines without the histograms, or whose fit failed",
    )
    level: float | None = Field(None, examples=[0.9], description="the intervals' level")
    interval: str = Field(
        "", examples=["model-based 90 % interval: ..."], description="what the intervals are"
    )
    method: str = Field("", examples=["per engine: AET hit-ratio curve ..."])
    assumptions: list[str] = Field(default_factory=list, examples=[["LRU eviction ..."]])
    hbm: TierHbm | None = Field(
        None,
        examples=[{"gib_per_engine": 20.5, "hit_ratio_measured": 0.41}],
        description="today, HBM only; null when it cannot tell",
    )
    native: TierMode | None = Field(
        None,
        examples=[{"scope": "per engine", "lower_bound": False}],
        description="vLLM's native CPU offload, per engine",
    )
    lmcache: TierMode | None = Field(
        None,
        examples=[{"scope": "per node pool of 2 engines", "lower_bound": True}],
        description="an LMCache L1 pool per node (a lower bound)",
    )


class CpuTierOut(_PlanSection):
    cpu_tier: CpuTierSection = Field(
        examples=[{"can_tell": True, "native": {"recommended": {"gib": 62.0}}}],
        description=f"the plan's cpu_tier section; every interval is a {_MODEL_BASED}. Empty "
        "({}) for a plan made before the section existed, or for a plan made per model group: "
        "ask for a group",
    )


class AccuracyOut(_Model):
    cluster: str = Field(examples=["prod-a"])
    summary: JsonObject = Field(examples=[{"plans_scored": 3}])
    outcomes: list[JsonObject] = Field(examples=[[]], description="one per scored plan")


# ------------------------------------------------------------------------------- advise


class ScorerWeightsIn(_Request):
    """`kvscope advise --scorer-weights`: the scorer router's weights (not all 0)."""

    prefix: float = Field(SCORER_DEFAULTS["prefix"], ge=0, le=1000, examples=[3.0])
    kv: float = Field(SCORER_DEFAULTS["kv"], ge=0, le=1000, examples=[2.0])
    queue: float = Field(SCORER_DEFAULTS["queue"], ge=0, le=1000, examples=[2.0])
    no_hit_lru: float = Field(SCORER_DEFAULTS["no_hit_lru"], ge=0, le=1000, examples=[2.0])
    cpu_prefix: float = Field(SCORER_DEFAULTS["cpu_prefix"], ge=0, le=1000, examples=[0.0])


class WhatIfIn(_Request):
    """The workload and deployment of `kvscope advise` (same names, same meaning)."""

    model: ModelName
    gpu: GpuName
    tp: TensorParallel = Field(examples=[1], description="tensor-parallel GPUs per engine")
    prompt_tokens: JsonInt = Field(ge=1, le=32_768, examples=[8000])
    output_tokens: JsonInt = Field(ge=1, le=8_192, examples=[256])
    qps: float = Field(ge=0.001, le=1_000, examples=[8.0], description="requests/s, cluster")
    prefix_share: float = Field(
        ge=0, le=1, examples=[0.75], description="share of each prompt that is a shared prefix"
    )
    engines: JsonInt = Field(1, ge=1, le=64, examples=[4])
    prefix_tokens: (
        Annotated[int, Field(ge=1, le=1_000_000_000), BeforeValidator(_integral)] | None
    ) = Field(
        None,
        examples=[120000],
        description="distinct prefix tokens",
        json_schema_extra=_nullable,
    )
    cpu_gb: float | None = Field(
        None,
        ge=1,
        le=16_384,
        examples=[512.0],
        description="host DRAM per node for KV, GiB",
        json_schema_extra=_nullable,
    )
    vllm_version: str = Field(
        "0.33.0",
        pattern=r"^0\.(1[1-9]|2[0-9]|3[0-3])\.[0-9]{1,3}$",
        examples=["0.33.0"],
        description="vLLM release the configs are for (0.11–0.33)",
    )
    duration_s: float = Field(
        300.0, ge=1, le=600, examples=[60.0], description="simulated seconds per mode"
    )
    seed: JsonInt = Field(0, ge=0, le=2**31 - 1, examples=[0])
    router: Literal["round_robin", "least_loaded", "prefix_affinity", "scorer"] | None = Field(
        None,
        examples=["scorer"],
        description="round_robin (null: the default), least_loaded, prefix_affinity, scorer",
        json_schema_extra=_nullable,
    )
    scorer_weights: ScorerWeightsIn | None = Field(
        None,
        examples=[{"prefix": 3.0, "kv": 2.0, "queue": 2.0}],
        description="the scorer router's weights (prefix, kv, queue); null: llm-d's defaults",
    )
    compare_routers: bool = Field(
        True, examples=[True], description="also answer under every other router"
    )


class AdviceOut(_Model):
    inputs: JsonObject = Field(examples=[{"model": "llama-3.1-8b"}])
    decision: JsonObject = Field(examples=[{"mode": "native", "score": 0.55}])
    simulated: JsonObject = Field(examples=[{"modes": {}}])
    cost_model: JsonObject = Field(examples=[{"kv_bytes_per_token": 131072}])
    sizing: JsonObject = Field(examples=[{"engines": 4}])
    configs: JsonObject = Field(examples=[{"vllm": "--kv-offloading-size 110"}])
    evidence: JsonObject = Field(examples=[{"engines": 4}])
    scenario: JsonObject = Field(examples=[{"name": "advise"}])
    notes: list[str] = Field(examples=[["simulated, not measured"]])
    router: JsonObject = Field(
        examples=[{"assumed": "round_robin", "default": True, "rows": []}],
        description="the router assumed and the headline answer under each router simulated",
    )


# ------------------------------------------------------------------------------- costmodel


class CompareTiersIn(_Request):
    """`kvscope costmodel compare-tiers`: re-read a prompt's KV from each tier or re-prefill."""

    model: ModelName
    tokens: JsonInt = Field(ge=1, le=1_048_576, examples=[4096])
    tiers: list[TierName] | None = Field(
        None, min_length=1, max_length=32, examples=[["ceph-hdd"]], description="None: all"
    )
    gpu: GpuName = "h100"
    tp: TensorParallel = Field(1, examples=[4])
    kv_dtype: Literal["auto", "bf16", "fp8", "both"] = Field("auto", examples=["both"])


class CompareTiersOut(_Model):
    model: str = Field(examples=["llama-3.1-70b-fp8"])
    gpu: str = Field(examples=["h100-80gb"])
    tp: int = Field(examples=[4])
    tokens: int = Field(examples=[4096])
    kv_dtypes: list[str] = Field(examples=[["fp8", "bf16"]])
    tiers: list[str] = Field(examples=[["ceph-hdd"]])
    mfu_range: dict[str, float] = Field(examples=[{"low": 0.2, "high": 0.6}])
    note: str | None = Field(examples=[None])
    comparisons: list[JsonObject] = Field(examples=[[{"kv_dtype": "fp8", "tier": "ceph-hdd"}]])


class SavingsIn(_Request):
    """`kvscope costmodel savings`: what caching a tenant's shared prefix saves."""

    model: ModelName
    gpu: GpuName
    prefix_tokens: JsonInt = Field(ge=1, le=1_048_576, examples=[6000])
    queries_per_hour: float = Field(ge=0, le=10_000_000, examples=[200.0])
    tp: TensorParallel = Field(1, examples=[4])
    tier: TierName = "cpu-dram-pcie"
    gpu_hour_usd: float | None = Field(
        None,
        ge=0,
        le=10_000,
        examples=[3.0],
        description="None: report GPU-seconds only",
        json_schema_extra=_nullable,
    )
    mfu: float = Field(0.5, ge=0.01, le=1, examples=[0.5], description="prefill MFU")
    hit_probability: float = Field(1.0, ge=0, le=1, examples=[0.9])
    cache_lifetime_s: float = Field(3600.0, ge=1, le=31_536_000, examples=[3600.0])
    kv_dtype: KvDtype = Field("auto", examples=["auto"])


class SavingsOut(_Model):
    model: str = Field(examples=["llama-3.1-70b"])
    gpu: str = Field(examples=["h100-80gb"])
    tp: int = Field(examples=[4])
    tier: str = Field(examples=["cpu-dram-pcie"])
    kv_bytes_per_token: float = Field(examples=[327680.0])
    prefix_tokens: int = Field(examples=[6000])
    prefix_kv_bytes: float = Field(examples=[1966080000.0])
    queries_per_hour: float = Field(examples=[200.0])
    hit_probability: float = Field(examples=[1.0])
    cache_lifetime_s: float = Field(examples=[3600.0])
    mfu: float = Field(examples=[0.5])
    prefill_seconds: float = Field(examples=[0.42])
    reload_seconds: float = Field(examples=[0.05])
    reuses_per_hour: float = Field(examples=[199.0])
    saved_gpu_seconds_per_hour: float = Field(examples=[294.5])
    gpu_hour_usd: float | None = Field(examples=[3.0])
    saved_usd_per_hour: float | None = Field(examples=[0.245])
    formula: str = Field(examples=["saved_gpu_seconds_per_hour = …"])
    verdict: str = Field(examples=["caching pays"])
    sources: dict[str, str] = Field(examples=[{"model": "config.json", "gpu": "datasheet"}])
    assumptions: list[str] = Field(examples=[["no eviction within the cache lifetime"]])


# ------------------------------------------------------------------------------- targets


class TargetIn(_Request):
    """A scrape target for the collector (stored in the store's targets table)."""

    name: TargetName
    url: str = Field(
        min_length=8,
        max_length=2000,
        pattern=r"^[hH][tT][tT][pP][sS]?://[^\s]+$",
        examples=["http://10.0.0.5:8000/metrics"],
        description="http(s) URL of its /metrics; private or loopback addresses only in "
        "allowed_target_networks, link-local and metadata addresses never",
    )
    kind: Literal["vllm", "lmcache", "prometheus"] = Field("vllm", examples=["vllm"])
    cluster: ClusterName = "default"


class TargetOut(_Model):
    name: str = Field(examples=["engine-0"])
    url: str = Field(examples=["http://10.0.0.5:8000/metrics"])
    kind: str = Field(examples=["vllm"])
    cluster: str = Field(examples=["prod-a"])


class TargetsOut(_Model):
    targets: list[TargetOut] = Field(
        examples=[
            [
                {
                    "name": "engine-0",
                    "url": "http://10.0.0.5:8000/metrics",
                    "kind": "vllm",
                    "cluster": "prod-a",
                }
            ]
        ]
    )
