"""Scenario families of the planner accuracy study, drawn from fixed seeds.

Every case is ONE engine type (model, GPU, TP, KV capacity, offload set-up) and one
workload (prompt mix), drawn at random from a family's ranges by a ``random.Random``
seeded with ``f"{MASTER_SEED}:{split}:{index}"``. The ``dev`` split was used while the
study and the fit were developed (``test``, chat cases only, by the test suite); the
``heldout`` split (other seeds, so other parameter draws, and two families — ``rag`` and
``noreuse`` — that dev never contains) was fixed in this file, with MASTER_SEED and the
number of cases (benchmarks/accuracy_planner.py), before any held-out result was seen.

Families (what gives offload something to do):

* ``chat`` — multi-turn sessions re-sending their history after a think time; at low load
  the histories stay in HBM, at high load they are evicted (or preempted) and re-prefilled
  without offload: the classic load-driven break-even.
* ``prefix`` — shared system prompts / tenants with Zipf popularity; the tail of the prefix
  set is evicted as running requests pin more KV.
* ``rag`` — a question over documents of a Zipf-popular corpus (held-out only).
* ``noreuse`` — independent prompts: offload has nothing to reuse and only costs
  (no break-even; the fit must not invent one) (held-out only).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from core.errors import ConfigError
from planner.domain import costmodel
from planner.domain.hardware import get_gpu, get_model

# Fixed before the held-out cases were run; changing it makes a new held-out set.
MASTER_SEED = 20251129  # dev and test splits (and held-out set 1, seen on 2025-11-29)
# Held-out sets, each fixed before its first run and retired once seen:
# set 1 = MASTER_SEED (seen 2025-11-29: the linear, unweighted gain model);
# set 2 = 20261129 (seen 2026-11-29: log scale, request weights, CR2, knots by plain
#   leave-one-engine-out CV, first root — README reports it);
# set 3 = 20261130, fixed 2026-11-30 after the knot floor and the steep-root rule were
#   settled on the dev and test splits, before any of its cases was run (seen that day);
# set 4 = 2026113004, fixed 2026-11-30 after the one-sided bound verdict (positive_above /
#   negative_below) was added, before any of its cases was run.
HELDOUT_SETS = {1: MASTER_SEED, 2: 20261129, 3: 20261130, 4: 2026113004}
HELDOUT_SET = 4  # the current one
SPLITS = ("dev", "heldout", "test")
DEV_FAMILIES = ("chat", "prefix")
HELDOUT_FAMILIES = ("chat", "prefix", "rag", "noreuse")
TEST_FAMILIES = ("chat",)  # tests/planner/test_accuracy.py: the family with a break-even

# (model, tensor_parallel, gpu). Small models on one GPU make many more engine steps (and
# requests) per simulated second; the study's 20-minute budget leaves them out.
_HARDWARE = (
    ("llama-3.1-70b", 4, "h100-80gb"),
    ("llama-3.1-70b", 2, "h200-141gb"),
    ("qwen3-32b", 2, "h100-80gb"),
)
# gpu_memory_utilization ranges giving ~60k-300k KV tokens per engine on the hardware above
_GPU_UTIL = {
    ("llama-3.1-70b", "h100-80gb"): (0.52, 0.72),
    ("llama-3.1-70b", "h200-141gb"): (0.62, 0.82),
    ("qwen3-32b", "h100-80gb"): (0.52, 0.72),
}


@dataclass(frozen=True, slots=True)
class Draw:
    """One case: a one-engine scenario (no arrivals yet) and the modes compared with none."""

    name: str
    split: str
    family: str
    raw: dict[str, Any]  # scenario mapping: cluster (one engine) + workload without arrivals
    modes: tuple[str, ...]  # offload modes compared with "none"
    seed: int
    turns: int  # requests per arrival (multi-turn sessions), 1 otherwise

    @property
    def rate_unit(self) -> str:
        return "sessions/s" if self.turns > 1 else "requests/s"


def _ln(mean: float, sigma: float) -> dict[str, Any]:
    return {"dist": "lognormal", "mean": round(mean), "sigma": sigma}


def _chat(rng: random.Random) -> tuple[dict[str, Any], tuple[str, ...], int]:
    turns = rng.randint(4, 10)
    wl = {
        "kind": "multi_turn",
        "turns": turns,
        "think_time_s": round(rng.uniform(5.0, 40.0), 1),
        "system_prompt_tokens": rng.choice((0, 500, 1000, 2000)),
        "question_tokens": _ln(rng.uniform(100, 500), 0.6),
        "output_tokens": _ln(rng.uniform(100, 400), 0.6),
    }
    return wl, ("native",), turns


def _prefix(rng: random.Random, kv_tokens: float) -> tuple[dict[str, Any], tuple[str, ...], int]:
    prefix = rng.randint(2000, 8000)
    groups = max(4, round(rng.uniform(0.4, 1.6) * kv_tokens / prefix))
    wl = {
        "kind": "shared_prefix",
        "groups": groups,
        "prompts_per_group": 1_000_000,  # questions never repeat: reuse is the prefix only
        "popularity": "zipf",
        "zipf_s": round(rng.uniform(0.5, 1.1), 2),
        "system_prompt_tokens": prefix,
        "question_tokens": _ln(rng.uniform(100, 600), 0.6),
        "output_tokens": _ln(rng.uniform(100, 300), 0.6),
    }
    modes = ("native", "lmcache") if rng.random() < 0.5 else ("native",)
    return wl, modes, 1


def _rag(rng: random.Random, kv_tokens: float) -> tuple[dict[str, Any], tuple[str, ...], int]:
    doc = rng.randint(400, 2000)
    wl = {
        "kind": "rag",
        "documents": max(50, round(rng.uniform(0.5, 3.0) * kv_tokens / doc)),
        "doc_tokens": doc,
        "docs_per_request": rng.choice((1, 2, 3)),
        "zipf_s": round(rng.uniform(0.8, 1.2), 2),
        "system_prompt_tokens": rng.choice((0, 500)),
        "question_tokens": _ln(rng.uniform(50, 300), 0.6),
        "output_tokens": _ln(rng.uniform(50, 300), 0.6),
    }
    modes = ("native", "lmcache") if rng.random() < 0.5 else ("native",)
    return wl, modes, 1


def _noreuse(rng: random.Random) -> tuple[dict[str, Any], tuple[str, ...], int]:
    lo = rng.randint(200, 1500)
    wl = {
        "kind": "synthetic",
        "prompt_tokens": {"dist": "uniform", "min": lo, "max": lo + rng.randint(500, 3000)},
        "output_tokens": _ln(rng.uniform(50, 400), 0.6),
    }
    return wl, ("native", "lmcache"), 1


def families(split: str) -> tuple[str, ...]:
    if split not in SPLITS:
        raise ConfigError(f"accuracy split must be one of {', '.join(SPLITS)}, got {split!r}")
    return {"dev": DEV_FAMILIES, "heldout": HELDOUT_FAMILIES, "test": TEST_FAMILIES}[split]


def draw(split: str, index: int, heldout_set: int = HELDOUT_SET) -> Draw:
    """Case ``index`` of ``split`` (families in turn; parameters from the case's own RNG);
    ``heldout_set`` picks an earlier held-out set (HELDOUT_SETS) to re-run it."""
    fams = families(split)
    family = fams[index % len(fams)]
    if heldout_set not in HELDOUT_SETS:
        raise ConfigError(f"held-out set {heldout_set!r}: choose one of {sorted(HELDOUT_SETS)}")
    seed = HELDOUT_SETS[heldout_set] if split == "heldout" else MASTER_SEED
    rng = random.Random(f"{seed}:{split}:{index}")
    model, tp, gpu = rng.choice(_HARDWARE)
    lo, hi = _GPU_UTIL[(model, gpu)]
    util = round(rng.uniform(lo, hi), 3)

    kv_tokens = costmodel.hbm_kv_capacity_tokens(
        get_model(model), get_gpu(gpu), tp, util, costmodel.DEFAULT_ACTIVATION_RESERVE_BYTES
    )
    if family == "chat":
        wl, modes, turns = _chat(rng)
    elif family == "prefix":
        wl, modes, turns = _prefix(rng, kv_tokens)
    elif family == "rag":
        wl, modes, turns = _rag(rng, kv_tokens)
    else:
        wl, modes, turns = _noreuse(rng)
    name = f"{split}-{index:02d}-{family}"
    raw = {
        "name": name,
        "cluster": {
            "nodes": 1,
            "gpus_per_node": tp,
            "gpu": gpu,
            "model": model,
            "tensor_parallel": tp,
            "gpu_memory_utilization": util,
            "cpu_cache_gb": rng.choice((100, 200, 400)),
            "lmcache_scope": "engine",
        },
        "workload": wl,
    }
    return Draw(name, split, family, raw, modes, rng.randrange(1, 2**31), turns)
