"""none / native / lmcache / both for a cluster or model group, with reasons and a score.

The rules (planner/decide/rules.py) run in order over an Evidence record
(planner/decide/evidence.py):
priors from published figures and the cost model vote first, the cluster's own measurements
(idle connectors, the capacity ratio at the SLO) override them, DRAM and LMCache health come last.
planner/decide/DECIDER.md explains the procedure in prose; a test keeps its rule ids and RULE_IDS
identical.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from typing import Any

from core.errors import ConfigError
from planner.decide.evidence import CapacityEvidence, Evidence, ValueCI
from planner.decide.rules import RULE_IDS, apply_rules
from planner.decide.rulestate import HA_ADVICE, Reason, Risk, RuleState, Thresholds
from planner.domain.citations import citation_url
from planner.domain.costmodel import DEFAULT_MFU
from planner.domain.hardware import GPU, Catalog, Model, get_gpu, get_model

__all__ = [
    "RULE_IDS",
    "CapacityEvidence",
    "Decision",
    "Evidence",
    "Reason",
    "Risk",
    "Thresholds",
    "ValueCI",
    "decide",
    "decider_doc",
]

# What the score is, said beside it wherever it is printed: a summary of how the decision was
# reached, not a calibrated probability that it is right (no interval comes with it).
SCORE_IS = (
    "a rule score, not a probability: 0.85 when a measured capacity ratio decided, 0.75 when a "
    "simulated one did, else 0.7, x 0.92 per unknown, x 0.9 for the prefix-hit proxy, x 0.8 "
    "per capacity interval containing 1, clamped to [0.05, 0.95] (planner/decide/DECIDER.md, "
    "Decision score)"
)


@dataclass(frozen=True, slots=True)
class Decision:
    mode: str
    score: float  # the decision score (DECIDER.md "Decision score"): not a probability
    score_label: str
    rests_on: tuple[str, ...]
    reasons: tuple[Reason, ...]
    risks: tuple[Risk, ...]
    unknowns: tuple[str, ...]
    pressure: bool | None = None
    l2_ok: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "score": round(self.score, 3),
            "score_label": self.score_label,
            "score_is": SCORE_IS,
            "rests_on": list(self.rests_on),
            "reasons": [
                {
                    "rule": r.rule_id,
                    "text": r.text,
                    "numbers": dict(r.numbers),
                    "source": r.source,
                    "source_id": r.citation_id,
                    "source_url": citation_url(r.citation_id),
                }
                for r in self.reasons
            ],
            "risks": [{"id": r.risk_id, "text": r.text, "advice": r.advice} for r in self.risks],
            "unknown": list(self.unknowns),
        }


def _resolve(
    ev: Evidence, catalog: Catalog | None, unknowns: list[str]
) -> tuple[Model | None, GPU | None]:
    model: Model | None = None
    gpu: GPU | None = None
    if ev.model is None:
        unknowns.append("model (cost-model priors)")
    else:
        try:
            model = get_model(ev.model, catalog)
        except ConfigError:
            unknowns.append(f"model {ev.model!r} (not in the hardware catalogue)")
    if ev.gpu is None:
        unknowns.append("gpu (cost-model priors)")
    else:
        try:
            gpu = get_gpu(ev.gpu, catalog)
        except ConfigError:
            unknowns.append(f"gpu {ev.gpu!r} (not in the hardware catalogue)")
    return model, gpu


def decide(
    evidence: Evidence, *, thresholds: Thresholds | None = None, catalog: Catalog | None = None
) -> Decision:
    """Apply RULES in order and combine their votes into a mode with its decision score."""
    unknowns: list[str] = []
    model, gpu = _resolve(evidence, catalog, unknowns)
    mfu = evidence.effective_mfu.estimate if evidence.effective_mfu else DEFAULT_MFU
    if evidence.effective_mfu is None:
        unknowns.append(f"effective MFU (prior {DEFAULT_MFU:.0%} used)")
    s = RuleState(
        evidence, thresholds or Thresholds(), model, gpu, evidence.tp, mfu, unknowns=unknowns
    )
    if evidence.tp is None:
        s.unknown("tp (cost-model priors)")
    apply_rules(s)
    native, lmcache = s.votes["native"].on is True, s.votes["lmcache"].on is True
    mode = {(False, False): "none", (True, False): "native", (False, True): "lmcache"}.get(
        (native, lmcache), "both"
    )
    if mode in ("lmcache", "both") and not any(r.risk_id == "lmcache_spof" for r in s.risks):
        s.risks.append(
            Risk(
                "lmcache_spof",
                "each LMCache server is a single point of failure for the engines of its node",
                HA_ADVICE,
            )
        )
    if mode != "none":
        s.risks.append(
            Risk(
                "decode_latency",
                "offload can raise decode latency (llm-d: mean "
                "TPOT +17.2 % with the CPU tier on [source: llm-d-tiered-prefix-cache]) and, "
                "with SSD in the path, TTFT (GKE test 3 [source: gke-tiered-kv-2025])",
                "watch TTFT and ITL separately from throughput",
            )
        )
    # A measured capacity ratio decided: 0.85; a simulated one (kvscope advise): 0.75, between
    # the measurement and the priors (0.7): the simulator's own error on published A/B runs is
    # ~15 pp (DECIDER.md, "Decision score").
    bases = {v.basis for v in s.votes.values() if v.on is not None}
    base = 0.85 if "measured" in bases else 0.75 if "simulated" in bases else 0.7
    score = base * s.penalty * 0.92 ** len(s.unknowns)
    score = min(max(score, 0.05), 0.95)
    label = "high" if score >= 0.75 else "medium" if score >= 0.5 else "low"
    return Decision(
        mode,
        score,
        label,
        tuple(s.rests_on),
        tuple(s.reasons),
        tuple(s.risks),
        tuple(s.unknowns),
        s.pressure,
        s.l2_ok,
    )


@functools.cache
def decider_doc() -> str:
    """planner/decide/DECIDER.md, the decision procedure in prose (`kvscope advise --explain`)."""
    return resources.files("planner.decide").joinpath("DECIDER.md").read_text(encoding="utf-8")
