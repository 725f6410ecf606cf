"""The vocabulary of the offload rules: thresholds, votes, reasons, risks and the state.

planner/decide/rules.py holds the rules themselves; planner/decide/decision.py runs them. The
published figures the rules lean on are named here once (SRC_*), each a `Cited` carrying the
id of its entry in planner/domain/data/sources.yaml (title, owner, date, URL, hardware).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from planner.decide.evidence import Evidence, ValueCI
from planner.domain.citations import tag
from planner.domain.hardware import GPU, Model

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class Cited:
    """A published figure's citation: readable text and its registered citation id."""

    text: str
    citation_id: str

    def __str__(self) -> str:
        return f"{self.text} {tag(self.citation_id)}"


SRC_GKE = Cited("GKE tiered KV cache, Google Cloud/LMCache blog 2025-10-07", "gke-tiered-kv-2025")
SRC_VLLM_BLOG = Cited(
    "vLLM blog 'Inside vLLM's New KV Offloading Connector' 2026-01-08",
    "vllm-offloading-connector-2026",
)
SRC_GPUSTACK = Cited(
    "GPUStack LMCache evaluation (RTX 4090), -3 to -15 % at 0 % hit", "gpustack-lmcache-eval-2025"
)
SRC_KVBM = Cited(
    "NVIDIA Dynamo KVBM configuration reference: CPU cache >= device cache",
    "nvidia-dynamo-kvbm-config",
)
SRC_LMCACHE_K8S = Cited("LMCache docs mp/deployment + mp/configuration (0.5.6)", "lmcache-mp-docs")
# Throughput cost of offloading when nothing hits: vLLM's DMA path ~0.5 % (vLLM blog);
# LMCache 3–15 % (GPUStack, RTX 4090). Used when the cluster has not measured its own.
NATIVE_OVERHEAD_PRIOR = ValueCI(0.005, 0.005, 0.06)  # 6 %: the old kernel path, vLLM blog
LMCACHE_OVERHEAD_PRIOR = ValueCI(0.09, 0.03, 0.15)


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Every threshold of the rule table (DECIDER.md justifies each)."""

    no_pressure_util: float = 0.80
    pressure_util: float = 0.90
    preemptions_per_1k: float = 1.0
    short_prompt_tokens: float = 2048
    cross_engine_min: float = 0.15
    local_reuse_min: float = 0.05
    idle_hit_ratio: float = 0.02
    saturation_horizon_s: float = 14 * 86400
    dram_reserve_fraction: float = 0.2
    lmcache_down_fraction: float = 0.5


@dataclass(frozen=True, slots=True)
class Reason:
    rule_id: str
    text: str
    numbers: Mapping[str, float | str]
    source: str
    # The registered citation (planner/domain/citations.py) when `source` cites a publication;
    # None for measurements, the cost model and other unpublished bases.
    citation_id: str | None = None


@dataclass(frozen=True, slots=True)
class Risk:
    risk_id: str
    text: str
    advice: str


@dataclass(slots=True)
class Vote:
    on: bool | None = None
    basis: str = ""  # "prior" | "measured" | "simulated" | "dram" | "health"


@dataclass(slots=True)
class RuleState:
    ev: Evidence
    t: Thresholds
    model: Model | None
    gpu: GPU | None
    tp: int | None
    mfu: float
    votes: dict[str, Vote] = field(default_factory=lambda: {"native": Vote(), "lmcache": Vote()})
    pressure: bool | None = None
    short: bool = False
    l2_ok: bool | None = None
    reasons: list[Reason] = field(default_factory=list)
    risks: list[Risk] = field(default_factory=list)
    unknowns: list[str] = field(default_factory=list)
    rests_on: list[str] = field(default_factory=list)
    penalty: float = 1.0
    rule: str = ""

    def say(self, text: str, numbers: Mapping[str, float | str], source: str | Cited) -> None:
        """Record a Reason under the id of the rule being applied (set by apply_rules); a
        `Cited` source also records its registered id."""
        cid = source.citation_id if isinstance(source, Cited) else None
        self.reasons.append(Reason(self.rule, text, dict(numbers), str(source), cid))

    def unknown(self, what: str) -> None:
        if what not in self.unknowns:
            self.unknowns.append(what)

    def vote(self, mode: str, on: bool, basis: str) -> None:
        self.votes[mode] = Vote(on, basis)

    def rest(self, what: str) -> None:
        if what not in self.rests_on:
            self.rests_on.append(what)

    @property
    def prompt(self) -> float | None:
        """The prompt length the rules compare: the p90 when the histogram resolved it, else
        the exact mean (Σ sum / Σ count), else a censored p90 (a lower bound)."""
        ev = self.ev
        if ev.prompt_tokens_p90 is not None and not ev.prompt_tokens_p90_censored:
            return ev.prompt_tokens_p90
        if ev.prompt_tokens_mean is not None:
            return ev.prompt_tokens_mean
        return ev.prompt_tokens_p90

    @property
    def prompt_label(self) -> str:
        """What `prompt` is, for the reasons' text."""
        ev = self.ev
        if ev.prompt_tokens_p90 is not None and not ev.prompt_tokens_p90_censored:
            return "p90"
        if ev.prompt_tokens_mean is not None:
            return "mean"
        return "p90 lower bound" if ev.prompt_tokens_p90 is not None else "unknown"

    def overhead(self, mode: str) -> ValueCI:
        measured = self.ev.overhead_zero_hit
        if measured is not None and self.ev.current_mode in (mode, "both"):
            return measured
        return NATIVE_OVERHEAD_PRIOR if mode == "native" else LMCACHE_OVERHEAD_PRIOR


def deployed_modes(mode: str | None) -> tuple[str, ...]:
    """The connectors a deployed `current_mode` runs."""
    return {"native": ("native",), "lmcache": ("lmcache",), "both": ("native", "lmcache")}.get(
        mode or "", ()
    )


HA_ADVICE = (
    "run one LMCache server per node (DaemonSet, hostNetwork; --isolated-ipc on both sides "
    "removes the /dev/shm mount) so a failure stays on one node; keep the shared prefixes in an "
    "L2 (mooncake_store / valkey / s3) that outlives a server restart; health-check the HTTP "
    "port and drain the node's engines when it fails. lmcache.mp.server_urls shards ranks, it "
    "does not replicate."
)
