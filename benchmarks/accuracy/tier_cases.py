"""Frozen cases of the CPU-tier accuracy study (benchmarks/accuracy/tier_study.py).

This module — the cases, their seeds, the CPU sizes, the truth's and the scoring's rules —
was committed on its own, before the study's first run on the ``study`` split; changing any
of it makes a new study. The ``dev`` split (other seeds) was used only to try the harness
out (timing, the histograms' population) while the rules were written.

The question (the plan's ``cpu_tier`` section, planner/plan/tier.py): on a cluster with no
offload deployed, from vLLM's sampled KV residency histograms (``--kv-cache-metrics``), what
prefix-cache hit ratio would a native CPU tier of 0.5×, 1×, 2× and 4× the engine's HBM KV
size give, and how many re-prefill tokens/s would it avoid? Each case is one simulated
cluster (planner/simulate) with every engine at ``offload: none`` and the KV cache metrics
on, its workload drawn from ``random.Random(f"{MASTER_SEED}:{split}:{name}")``; what varies
is what decides the answer:

* the reusable KV working set per engine against HBM: below it (``null``: a tier adds ~0;
  the evictions are unique questions churning HBM), ~2×, ~4× and ~10× HBM (``doc``:
  long shared documents asked about at random);
* the reuse popularity's skew (Zipf s 1.0–1.2 against ~uniform);
* the model and its HBM (Qwen3-32B TP2; Llama-3.1-70B TP2 on H200: 3–4× the KV tokens);
* the load (10–20 % and 85–95 % of the saturated rate against 35–65 %);
* a multi-turn (session) workload (prefix affinity: a session stays on its engine; think
  times of 5–30 s, an agent's or a fast chat's: on the dev split, 20–90 s left every turn
  evicted before the next, so vLLM recorded no reuse gap at all and the section could not
  tell, while the truth gained nothing even at 4× HBM) and a shared-document (RAG)
  workload;
* a diurnal load (the model assumes a stationary stream);
* 1, 2 or 4 simulated hours of history (drawn per case).

Load: ``level`` × R_SAT, R_SAT the cluster's saturated request rate with no offload (a
closed loop, benchmarks/accuracy/verdict_truth.py ``probe_clients``; a multi-turn probe
runs without think time).

Truth (benchmarks/accuracy/tier_truth.py): the same scenario — cluster, seed, arrivals —
run once without offload and once per size with every engine running vLLM's native CPU
offload of that size (``cluster.cpu_cache_gb`` is per engine for native, in decimal GB: the
size in GiB × 2**30 / 1e9), what ``kvscope simulate --compare none,native --sweep
cluster.cpu_cache_gb=…`` runs. Measured over the telemetry's period [WARMUP_S, end]:

* hit ratio = (prefix-cache hits + connector hits) / prefix-cache queries, tokens summed
  over engines (the compare table's ``prefix_hit_rate + external_hit_rate``: both share
  the query denominator);
* avoided re-prefill tokens/s = prefix-hit tokens/s (HBM + connector) with the tier minus
  the HBM prefix-hit tokens/s of the run without it.

Scoring (per case and size; a cannot-tell is never a hit):

* hit ratio within ±HIT_PP points; avoided tokens within ±AVOIDED_REL of the truth, or
  within FLOOR_PP points of the lookup rate (in tokens/s) when that is larger — a truth
  near zero (a tier no larger than HBM) has no relative error to speak of;
* the model-based range covers the truth (strictly, and within ±FLOOR_PP points: two runs
  of one cluster differ by that much, and a point range [x, x] cannot hold a run's noise).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from core.errors import ConfigError
from planner.simulate.scenario import parse_scenario

MASTER_SEED = 2026121701  # the study split's seeds; fixed before its first run
DEV_SEED = 2026121700  # the dev split's (harness shake-out only)
SPLITS = ("study", "dev")

# -- what the study asks and measures ------------------------------------------------------
MULTIPLES = (0.5, 1.0, 2.0, 4.0)  # CPU tier sizes, × the engine's HBM KV (the section's rows)
SAMPLE_RATE = 0.01  # vLLM's --kv-cache-metrics-sample default
HOURS = (1.0, 2.0, 4.0)  # history length (simulated hours), drawn per case
WARMUP_S = 600.0  # telemetry windows and truth counters start here
DIURNAL_AMPLITUDE = 0.6  # the diurnal case: rate from 0.4 to 1.6 × its mean, one cycle
LOAD_MID = (0.35, 0.65)  # offered rate / R_SAT
LOAD_LOW = (0.10, 0.20)
LOAD_HIGH = (0.85, 0.95)
# -- scoring -------------------------------------------------------------------------------
HIT_PP = 5.0  # hit ratio: within ± this many points
AVOIDED_REL = 0.10  # avoided re-prefill tokens/s: within ± this share of the truth …
FLOOR_PP = 0.5  # … or ± this many points of the lookup rate; also the coverage tolerance

# (model, tensor_parallel, gpu, gpu_memory_utilization range): small HBM (50k–70k KV tokens
# per engine: the working sets stay small enough to simulate hours in seconds), a larger
# model on the same KV tokens, a 70B on H200 with ~3.5× the KV tokens
_SMALL = ("llama-3.1-8b", 1, "h100-80gb", (0.28, 0.34))
_MID = ("qwen3-32b", 2, "h100-80gb", (0.48, 0.55))
_LARGE = ("llama-3.1-70b", 2, "h200-141gb", (0.65, 0.75))


@dataclass(frozen=True, slots=True)
class Case:
    """One cluster without offload: its scenario without arrivals, the history's length,
    the offered load (× R_SAT) and its shape."""

    name: str
    split: str
    design: str  # what the case varies, in words
    kind: str  # null | doc | session | rag
    raw: dict[str, Any]  # scenario mapping: cluster + engine + workload (no arrivals), seed
    hours: float
    level: float  # offered request rate / R_SAT
    arrival: str  # poisson | diurnal
    working_set: float  # drawn reusable KV per engine / HBM KV (doc cases; 0: not drawn)
    seed: int

    @property
    def engines(self) -> int:
        c = self.raw["cluster"]
        return int(c["nodes"] * c["gpus_per_node"] // c["tensor_parallel"])


@dataclass(frozen=True, slots=True)
class _Spec:
    kind: str  # null | doc | session | rag
    design: str
    hardware: tuple[str, int, str, tuple[float, float]] = _SMALL
    working_set: tuple[float, float] = (0.0, 0.0)  # doc: reusable KV / HBM KV per engine
    zipf: tuple[float, float] = (0.4, 0.7)
    load: tuple[float, float] = LOAD_MID
    arrival: str = "poisson"
    router: str = "round_robin"


# The frozen list.
_SPECS: tuple[_Spec, ...] = (
    _Spec("null", "reusable set ~0.1x HBM, unique questions churn HBM: a tier adds ~0"),
    _Spec("doc", "shared documents, working set ~2x HBM", working_set=(1.5, 2.5)),
    _Spec("doc", "shared documents, working set ~4x HBM", working_set=(3.5, 5.0)),
    _Spec("doc", "shared documents, working set ~10x HBM", working_set=(8.0, 12.0)),
    _Spec("doc", "~4x HBM, skewed popularity (Zipf 1.0-1.2)", working_set=(3.5, 5.0),
          zipf=(1.0, 1.2)),
    _Spec("doc", "~4x HBM, ~uniform popularity (Zipf 0-0.2)", working_set=(3.5, 5.0),
          zipf=(0.0, 0.2)),
    _Spec("doc", "~3x HBM, Qwen3-32B TP2", _MID, working_set=(2.5, 4.0)),
    _Spec("doc", "~3x HBM, Llama-3.1-70B TP2 on H200 (3.5x the KV tokens)", _LARGE,
          working_set=(2.5, 4.0)),
    _Spec("doc", "~3x HBM, low load (10-20 % of saturation)", working_set=(2.5, 4.0),
          load=LOAD_LOW),
    _Spec("doc", "~3x HBM, high load (85-95 % of saturation)", working_set=(2.5, 4.0),
          load=LOAD_HIGH),
    _Spec("doc", "~3x HBM, diurnal load (one cycle, 0.4-1.6x the mean)", working_set=(2.5, 4.0),
          arrival="diurnal"),
    _Spec("session", "multi-turn sessions, prefix affinity", router="prefix_affinity"),
    _Spec("rag", "RAG: 2-4 documents a request from a Zipf corpus", zipf=(0.7, 1.0)),
)  # fmt: skip


def _ln(mean: float, sigma: float) -> dict[str, Any]:
    return {"dist": "lognormal", "mean": round(mean), "sigma": sigma}


def _workload(spec: _Spec, kv_tokens: int, rng: random.Random) -> tuple[dict[str, Any], float]:
    """The workload mapping (no arrivals) and the drawn working set (× HBM KV, doc only)."""
    if spec.kind == "null":  # a few short shared prefixes, long unique questions
        return {
            "kind": "shared_prefix",
            "groups": rng.randint(4, 8),
            "prompts_per_group": 1_000_000,
            "popularity": "zipf",
            "zipf_s": round(rng.uniform(*spec.zipf), 2),
            "system_prompt_tokens": rng.randint(500, 1500),
            "question_tokens": _ln(rng.uniform(1500, 3000), 0.5),
            "output_tokens": _ln(rng.uniform(100, 300), 0.6),
        }, 0.0
    if spec.kind == "doc":  # long shared documents; under round robin every engine sees all
        ws = round(rng.uniform(*spec.working_set), 2)
        doc = rng.randint(4000, 8000)
        return {
            "kind": "shared_prefix",
            "groups": max(2, round(ws * kv_tokens / doc)),
            "prompts_per_group": 1_000_000,
            "popularity": "zipf",
            "zipf_s": round(rng.uniform(*spec.zipf), 2),
            "system_prompt_tokens": doc,
            "question_tokens": _ln(rng.uniform(100, 400), 0.5),
            "output_tokens": _ln(rng.uniform(100, 300), 0.6),
        }, ws
    if spec.kind == "session":  # every turn re-sends the history after a think time
        return {
            "kind": "multi_turn",
            "turns": rng.randint(4, 8),
            "think_time_s": round(rng.uniform(5.0, 30.0), 1),
            "system_prompt_tokens": rng.randint(500, 2000),
            "question_tokens": _ln(rng.uniform(200, 600), 0.6),
            "output_tokens": _ln(rng.uniform(150, 400), 0.6),
        }, 0.0
    if spec.kind == "rag":
        return {
            "kind": "rag",
            "documents": rng.randint(200, 600),
            "doc_tokens": rng.randint(1000, 3000),
            "docs_per_request": rng.randint(2, 4),
            "zipf_s": round(rng.uniform(*spec.zipf), 2),
            "system_prompt_tokens": rng.randint(200, 800),
            "question_tokens": _ln(rng.uniform(50, 200), 0.5),
            "output_tokens": _ln(rng.uniform(100, 300), 0.6),
        }, 0.0
    raise ConfigError(f"tier study: unknown case kind {spec.kind!r}")


def kv_tokens_of(cluster: dict[str, Any]) -> int:
    """HBM KV tokens per engine of a case's cluster mapping (the simulator's num_gpu_blocks
    × block_size)."""
    probe = {"cluster": cluster, "workload": {"kind": "synthetic", "qps": 1, "prompt_tokens": 1}}
    c = parse_scenario(probe, where="tier study").cluster
    return int(c.num_gpu_blocks * c.block_size)


def _case(split: str, index: int, spec: _Spec) -> Case:
    base = MASTER_SEED if split == "study" else DEV_SEED
    name = f"{spec.kind}-{index:02d}"
    rng = random.Random(f"{base}:{split}:{name}")
    model, tp, gpu, (lo, hi) = spec.hardware
    cluster: dict[str, Any] = {
        "nodes": 1,
        "gpus_per_node": 2 * tp,
        "gpu": gpu,
        "model": model,
        "tensor_parallel": tp,
        "gpu_memory_utilization": round(rng.uniform(lo, hi), 3),
        "offload": "none",
        "router": spec.router,
    }
    workload, ws = _workload(spec, kv_tokens_of(cluster), rng)
    seed = rng.randrange(1, 2**31)
    raw = {
        "name": name,
        "cluster": cluster,
        "engine": {"kv_cache_metrics": True, "kv_cache_metrics_sample": SAMPLE_RATE},
        "workload": workload,
        "seed": seed,
    }
    return Case(
        name=name, split=split, design=spec.design, kind=spec.kind, raw=raw,
        hours=rng.choice(HOURS), level=round(rng.uniform(*spec.load), 3), arrival=spec.arrival,
        working_set=ws, seed=seed,
    )  # fmt: skip


def cases(split: str = "study") -> tuple[Case, ...]:
    """Every case of ``split``, in the frozen order."""
    if split not in SPLITS:
        raise ConfigError(f"tier study split must be one of {', '.join(SPLITS)}, got {split!r}")
    return tuple(_case(split, i, s) for i, s in enumerate(_SPECS))
