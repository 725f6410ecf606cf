"""Frozen cases of the verdict accuracy study (benchmarks/accuracy/verdict_study.py).

This module — the classes, the cases, their seeds, the truth thresholds and the SLO and load
rules — was committed on its own, before the study's first run on the ``study`` split;
changing any of it makes a new study. The ``dev`` split (other seeds) was used to try the
harness out while the rules were written. The ``replica`` split draws every case again with
its own seeds (the same specs, rules and truth; committed before its first run): ten null
comparisons cannot tell a 5 % claim rate from 10 %, nor ten helps cases 85 % coverage from
80 %, so the study's rates are read over both splits.

Each case is one simulated cluster (planner/simulate): its engines, their offload (a mix,
as an operator trying offload runs it), its router, a workload with nothing fixed but the
scenario's shape (parameters drawn from ``random.Random(f"{MASTER_SEED}:{split}:{name}")``)
and the telemetry's length and peak load. Classes:

* ``null`` — offload cannot help: (a) ``fits``: KV fits in HBM (gpu_memory_utilization
  0.85–0.9, short prompts, ``max_num_seqs`` 64 so even a full batch fits), (b)
  ``noreuse``: unique prompts under KV pressure (a one-block shared prefix, questions of
  2–5k tokens that never repeat, short outputs); 2 + 2 engines round robin, prefix
  affinity (Zipf groups: unequal load), LMCache on 2 nodes, and a 1-engine canary;
* ``helps`` — long shared prefixes (4–8k tokens, Zipf) under KV pressure, as demo.yaml:
  round robin, unequal load shares, prefix affinity and the llm-d scorer; 2 + 2 and 3 + 3
  engines for native; LMCache with 2 pools (2 nodes) and with 1 pool;
* ``canary`` — 1 engine with native offload among 3 without (static: the verdict must say
  it cannot tell and propose an experiment);
* ``switchback`` — 1 engine switched on and off in 30-minute periods (cluster.switchback)
  for 6 hours; evaluated on its first 2, 4 and 6 hours.

The truth (benchmarks/accuracy/verdict_truth.py) is frozen here too: ``R_SAT`` is the
none arm's saturated request rate (a closed loop), the capacity truth is measured at
``OVERLOAD`` × R_SAT, the SLO is ``SLO_MULTIPLE`` × the none arm's TTFT p90 at
``SLO_LOW_LOAD`` × R_SAT, and a mode's truth is "helps" above ``HELPS_ABOVE`` and "null"
within ``NULL_WITHIN`` of 1.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from core.errors import ConfigError

MASTER_SEED = 2026120123  # the study split's seeds; fixed before its first run
DEV_SEED = 2026120100  # the dev split's (harness shake-out only)
REPLICA_SEED = 2026120404  # the replica split's; fixed before its first run
SPLITS = ("study", "dev", "replica")
SEEDS = {"study": MASTER_SEED, "dev": DEV_SEED, "replica": REPLICA_SEED}
CLASSES = ("null", "helps", "canary", "switchback")

# -- the truth's rules (verdict_truth.py) ------------------------------------------------
OVERLOAD = 1.5  # capacity truth: constant offered rate = OVERLOAD × R_SAT
SLO_LOW_LOAD = 0.25  # the SLO's reference: none arm's TTFT p90 at this × R_SAT
SLO_MULTIPLE = 4.0  # SLO = this × that p90 (rounded to 2 significant digits), on TTFT p90
SLO_QUANTILE = "p90"
HELPS_ABOVE = 1.05  # truth ratio above: the mode helps
NULL_WITHIN = 0.03  # |truth ratio − 1| within: null
# -- the telemetry's shape (verdict_study.py) --------------------------------------------
DIURNAL_AMPLITUDE = 0.9  # rate from 0.1 to 1.9 × its mean
PEAK_RANGE = (1.1, 1.6)  # diurnal peak / R_SAT
HOURS = (2.0, 3.0, 4.0)  # telemetry length (simulated hours), drawn per case
SWITCHBACK_HOURS = 6.0
SWITCHBACK_PERIOD_H = 3.0  # two diurnal cycles in the 6 hours
SWITCHBACK_PERIOD_S = 1800.0
SWITCHBACK_EVAL_HOURS = (2.0, 4.0, 6.0)
WARMUP_S = 300.0  # windows before this are dropped (a collector's cold start is not history)

# (model, tensor_parallel, gpu, gpu_memory_utilization): under KV pressure 50k–80k KV
# tokens per engine; when KV fits, larger models (an 8B engine serving short prompts runs
# ~30 requests/s: too many events for the study's budget) with 300k–440k tokens
_HARDWARE = (
    ("llama-3.1-8b", 1, "h100-80gb", (0.29, 0.33)),
    ("qwen3-32b", 2, "h100-80gb", (0.49, 0.53)),
)
_HARDWARE_FITS = (
    ("llama-3.1-70b", 4, "h100-80gb", (0.85, 0.9)),
    ("llama-3.1-70b", 2, "h200-141gb", (0.85, 0.9)),
)


@dataclass(frozen=True, slots=True)
class Case:
    """One cluster: its scenario without arrivals, the modes its verdict is scored on and
    the telemetry's length and peak (``peak`` × R_SAT at the diurnal maximum)."""

    name: str
    split: str
    cls: str  # null | helps | canary | switchback
    design: str  # what the case varies, in words
    workload_kind: str  # fits | noreuse | prefix
    raw: dict[str, Any]  # scenario mapping: cluster + workload (no arrivals), seed
    modes: tuple[str, ...]  # offload modes the verdict is scored on
    hours: float
    period_h: float  # diurnal period
    peak: float
    seed: int
    expect_cannot_tell: tuple[str, ...] = ()  # modes with < 2 units: must say cannot tell

    @property
    def engines(self) -> int:
        c = self.raw["cluster"]
        return int(c["nodes"] * c["gpus_per_node"] // c["tensor_parallel"])


def _ln(mean: float, sigma: float) -> dict[str, Any]:
    return {"dist": "lognormal", "mean": round(mean), "sigma": sigma}


def _workload(kind: str, rng: random.Random) -> dict[str, Any]:
    if kind == "prefix":  # long shared prefixes, as demo.yaml
        return {
            "kind": "shared_prefix",
            "groups": rng.randint(48, 96),
            "prompts_per_group": 16,
            "popularity": "zipf",
            "zipf_s": round(rng.uniform(0.6, 1.1), 2),
            "system_prompt_tokens": rng.randint(4000, 8000),
            "question_tokens": _ln(rng.uniform(400, 900), 0.6),
            "output_tokens": _ln(rng.uniform(150, 400), 0.8),
        }
    if kind == "fits":  # few short prefixes, short prompts: everything stays in HBM
        return {
            "kind": "shared_prefix",
            "groups": rng.randint(4, 16),
            "prompts_per_group": 1_000_000,
            "popularity": "zipf",
            "zipf_s": round(rng.uniform(0.6, 1.1), 2),
            "system_prompt_tokens": rng.randint(200, 800),
            "question_tokens": _ln(rng.uniform(100, 400), 0.6),
            "output_tokens": _ln(rng.uniform(300, 600), 0.6),
        }
    if kind == "noreuse":  # a one-block shared prefix (routing key only), unique questions
        return {
            "kind": "shared_prefix",
            "groups": rng.randint(8, 32),
            "prompts_per_group": 1_000_000,
            "popularity": "zipf",
            "zipf_s": round(rng.uniform(0.6, 1.1), 2),
            "system_prompt_tokens": 16,
            "question_tokens": _ln(rng.uniform(2000, 5000), 0.5),
            "output_tokens": _ln(rng.uniform(50, 150), 0.6),
        }
    raise ConfigError(f"verdict study: unknown workload kind {kind!r}")


@dataclass(frozen=True, slots=True)
class _Spec:
    """A case before its draws: class, workload kind, layout and router."""

    cls: str
    kind: str  # fits | noreuse | prefix
    layout: tuple[tuple[str, ...], ...]  # per node: each engine's offload
    router: str = "round_robin"
    shares: bool = False  # unequal load_shares (round robin)
    switchback: bool = False  # engine 0 switched on/off (native)
    design: str = ""


# The frozen list. Layouts are per node; an LMCache pool is per node (lmcache_scope: node).
_NN = (("none", "none", "native", "native"),)  # 2 + 2 native on one node
_NX = (("none", "native", "none", "native"),)  # the same, interleaved
_NX3 = (("none", "native", "none", "native", "none", "native"),)  # 3 + 3 native
_OFF4 = (("none",) * 4,)  # a switchback's canary (engine 0) and 3 controls
_SPECS: tuple[_Spec, ...] = (
    # null: offload cannot help
    _Spec("null", "fits", _NN, design="2+2 native, round robin"),
    _Spec("null", "noreuse", _NN, design="2+2 native, round robin"),
    _Spec("null", "fits", _NX, "prefix_affinity", design="2+2 native, prefix affinity"),
    _Spec("null", "noreuse", _NX, "prefix_affinity", design="2+2 native, prefix affinity"),
    _Spec("null", "fits", (("none", "lmcache"),) * 2, design="2+2 LMCache, 2 nodes (2 pools)"),
    _Spec("null", "noreuse", (("none", "lmcache"),) * 2, design="2+2 LMCache, 2 nodes (2 pools)"),
    _Spec("null", "fits", (("native", "none", "none", "none"),), design="1-engine canary"),
    _Spec("null", "noreuse", (("none", "none", "none", "native"),), shares=True,
          design="1-engine canary, unequal load shares"),
    # helps: long shared prefixes under KV pressure
    _Spec("helps", "prefix", _NN, design="2+2 native, round robin"),
    _Spec("helps", "prefix", _NX3, design="3+3 native, round robin"),
    _Spec("helps", "prefix", _NX, shares=True, design="2+2 native, unequal load shares"),
    _Spec("helps", "prefix", _NX3, "prefix_affinity", design="3+3 native, prefix affinity"),
    _Spec("helps", "prefix", _NX, "scorer", design="2+2 native, llm-d scorer"),
    _Spec("helps", "prefix", _NX3, "scorer", design="3+3 native, llm-d scorer"),
    _Spec("helps", "prefix", (("none", "none", "lmcache", "lmcache"),) * 2,
          design="4 none + 2 LMCache pools (2 nodes x 2 engines)"),
    _Spec("helps", "prefix", (_NN[0], ("none", "none", "lmcache", "lmcache")),
          design="demo layout: 2+2 native, 1 LMCache pool"),
    # canary: one engine with native, static
    _Spec("canary", "prefix", (("native", "none", "none", "none"),), design="round robin"),
    _Spec("canary", "prefix", (("none", "none", "native", "none"),), shares=True,
          design="unequal load shares"),
    _Spec("canary", "prefix", (("none", "native", "none", "none"),), "prefix_affinity",
          design="prefix affinity"),
    _Spec("canary", "prefix", (("none", "none", "none", "native"),), "scorer",
          design="llm-d scorer"),
    # switchback: engine 0 switched native on/off in 30-minute blocks, 6 hours
    _Spec("switchback", "prefix", _OFF4, switchback=True, design="helps workload, round robin"),
    _Spec("switchback", "prefix", _OFF4, switchback=True, design="helps workload, round robin"),
    _Spec("switchback", "prefix", _OFF4, "scorer", switchback=True,
          design="helps workload, llm-d scorer"),
    _Spec("switchback", "fits", _OFF4, switchback=True, design="null workload (KV fits)"),
    _Spec("switchback", "noreuse", _OFF4, switchback=True, design="null workload (no reuse)"),
)  # fmt: skip


def _case(split: str, index: int, spec: _Spec) -> Case:
    base = SEEDS[split]
    name = f"{spec.cls}-{index:02d}-{spec.kind}"
    rng = random.Random(f"{base}:{split}:{name}")
    model, tp, gpu, (lo, hi) = rng.choice(_HARDWARE_FITS if spec.kind == "fits" else _HARDWARE)
    util = round(rng.uniform(lo, hi), 3)
    per_node = len(spec.layout[0])
    if any(len(n) != per_node for n in spec.layout):
        raise ConfigError(f"verdict case {name}: nodes of unequal size")
    offload = [m for node in spec.layout for m in node]
    cluster: dict[str, Any] = {
        "nodes": len(spec.layout),
        "gpus_per_node": per_node * tp,
        "gpu": gpu,
        "model": model,
        "tensor_parallel": tp,
        "gpu_memory_utilization": util,
        "engines_offload": offload,
        "cpu_cache_gb": rng.choice((100, 200)),
        "lmcache_scope": "node",
        "router": spec.router,
    }
    if spec.kind == "fits":
        cluster["max_num_seqs"] = 64
    if spec.shares:
        cluster["load_shares"] = [round(rng.uniform(0.6, 1.4), 2) for _ in offload]
    seed = rng.randrange(1, 2**31)
    if spec.switchback:
        cluster["switchback"] = {"engines": [0], "mode": "native", "block_s": SWITCHBACK_PERIOD_S}
        hours, period = SWITCHBACK_HOURS, SWITCHBACK_PERIOD_H
    else:
        hours = rng.choice(HOURS)
        period = hours
    peak = round(rng.uniform(*PEAK_RANGE), 3)
    used = set(offload) | ({"native"} if spec.switchback else set())
    modes = tuple(m for m in ("native", "lmcache") if m in used)
    units = {m: _units(spec.layout, m) for m in modes}
    raw = {"name": name, "cluster": cluster, "workload": _workload(spec.kind, rng), "seed": seed}
    return Case(
        name=name, split=split, cls=spec.cls, design=spec.design, workload_kind=spec.kind,
        raw=raw, modes=modes, hours=hours, period_h=period, peak=peak, seed=seed,
        expect_cannot_tell=tuple(m for m in modes if units[m] < 2 and not spec.switchback),
    )  # fmt: skip


def _units(layout: tuple[tuple[str, ...], ...], mode: str) -> int:
    """Independent units running ``mode``: engines, or nodes for LMCache (one pool each)."""
    if mode == "lmcache":
        return sum(mode in node for node in layout)
    return sum(m == mode for node in layout for m in node)


def cases(split: str = "study") -> tuple[Case, ...]:
    """Every case of ``split``, in the frozen order."""
    if split not in SPLITS:
        raise ConfigError(f"verdict study split must be one of {', '.join(SPLITS)}, got {split!r}")
    return tuple(_case(split, i, s) for i, s in enumerate(_SPECS))
