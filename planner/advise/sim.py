"""The simulation half of `kvscope advise`: the scenario a what-if becomes, one seeded run
per offload mode with per-engine KV use sampled through it, and the per-mode figures.

The runs go through planner/simulate's public API (parse_scenario, Simulation.advance_to,
engine_snapshots, results.summarize); nothing here changes the simulator.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.advise.question import WhatIf
from planner.domain import costmodel
from planner.domain.hardware import get_gpu, get_model

# The band on a simulated relative throughput gain g: ±(a + b·|g|), one per regime ("fits":
# the KV working set fits HBM + the CPU tier; "spills": it does not), read from sim_band.json,
# which `benchmarks/calibrate_sim.py --write-band` writes from its table: the simulator's
# largest in-sample miss on published throughput changes (GKE Tests 2-3
# [source: gke-tiered-kv-2025], llm-d tiered prefix cache [source: llm-d-tiered-prefix-cache];
# a = the largest miss at published gains <= 50 %, b the least slope covering the larger
# ones). It covers those rows by construction and has no coverage level; loso_* is the same
# derivation left one publication out. tests/planner/test_sim_band.py checks the file against
# the table. Beyond those clusters it is an assumption.
BAND_FILE = Path(__file__).resolve().parent / "sim_band.json"
BAND_KIND = "largest_in_sample_miss"
BAND_SOURCE = "benchmarks/calibrate_sim.py"
REGIME_BASIS = {
    "fits": "the working set fits HBM + the CPU tier",
    "spills": "the working set is larger than HBM + the CPU tier (GKE Test 3's regime)",
}


@dataclass(frozen=True, slots=True)
class SimBand:
    """One regime's band from sim_band.json: ±(absolute + relative·|gain|), the simulator's
    largest in-sample miss over `rows` published throughput changes (`row_set`); loso_*: the
    same band rebuilt from the other publications' rows, checked on each held-out one's rows
    (None when the rows come from one publication)."""

    regime: str
    absolute: float
    relative: float
    rows: int
    row_set: str
    identity_rows_excluded: int
    publications: int
    loso_rows: int
    loso_rows_outside: int | None
    loso_excess_pp: float | None

    def halfwidth(self, gain: float) -> float:
        return self.absolute + self.relative * abs(gain)

    def around(self, gain: float) -> dict[str, Any]:
        """The band around one simulated gain, for JSON."""
        half = self.halfwidth(gain)
        return {
            "lo": gain - half,
            "hi": gain + half,
            "kind": BAND_KIND,
            "rows": self.rows,
            "regime": self.regime,
            "source": BAND_SOURCE,
        }

    def to_dict(self) -> dict[str, Any]:
        """advise's JSON `simulated.gain_band`."""
        return {
            "kind": BAND_KIND,
            "absolute": self.absolute,
            "relative": self.relative,
            "regime": self.regime,
            "basis": REGIME_BASIS[self.regime],
            "rows": self.rows,
            "row_set": self.row_set,
            "identity_rows_excluded": self.identity_rows_excluded,
            "publications": self.publications,
            "loso_rows": self.loso_rows,
            "loso_rows_outside": self.loso_rows_outside,
            "loso_excess_pp": self.loso_excess_pp,
            "source": BAND_SOURCE,
        }


def _load_bands() -> dict[str, SimBand]:
    raw = json.loads(BAND_FILE.read_text())
    return {
        regime: SimBand(
            regime,
            float(b["absolute"]),
            float(b["relative"]),
            int(b["rows"]),
            str(b["row_set"]),
            int(b["identity_rows_excluded"]),
            int(b["publications"]),
            int(b["loso_rows"]),
            None if b["loso_rows_outside"] is None else int(b["loso_rows_outside"]),
            None if b["loso_excess_pp"] is None else float(b["loso_excess_pp"]),
        )
        for regime, b in raw.items()
        if isinstance(b, dict)
    }


BANDS = _load_bands()


def band_halfwidth(gain: float, regime: str = "fits") -> float:
    """Half-width of `regime`'s band (largest in-sample miss) around a simulated gain."""
    return BANDS[regime].halfwidth(gain)


def working_set_regime(raw: dict[str, Any]) -> str:
    """ "spills" when the scenario's shared-prefix working set is larger than HBM KV plus the
    CPU tier (the simulator's default 100 GB a node when --cpu-gb is not given), else
    "fits": the regime whose band applies."""
    wl, cl = raw["workload"], raw["cluster"]
    if wl.get("kind") != "shared_prefix":
        return "fits"
    model = get_model(cl["model"])
    per_token = costmodel.kv_bytes_per_token_engine(model)
    engines = cl["nodes"] * cl["gpus_per_node"] // cl["tensor_parallel"]
    hbm = engines * costmodel.hbm_kv_capacity_tokens(
        model, get_gpu(cl["gpu"]), cl["tensor_parallel"]
    )
    cpu_gb = raw.get("_cpu_gb", {}).get("lmcache", DEFAULT_CPU_GB)
    cpu = cl["nodes"] * cpu_gb * 1e9 / per_token
    return "spills" if wl["groups"] * wl["system_prompt_tokens"] > hbm + cpu else "fits"


# Simulated requests per mode at most: keeps one advise call to a few seconds of wall time
# (~1 s per 2,000 requests of an 8B model on one core, measured with this simulator).
MAX_REQUESTS = 3000
# The same question under each other router (routing decides whether a prefix recurs on the
# engine that holds it) runs shorter: at most this many requests per mode, so the three
# alternatives x three modes cost about as much as the assumed router's three runs.
ALT_MAX_REQUESTS = 1000
MIN_DURATION_S = 30.0
WARMUP_FRACTION = 0.2  # the first 20 % of the run fills the caches and is not measured
SAMPLES = 120  # KV-use samples per run
GPUS_PER_NODE = 8  # assumption: 8-GPU nodes (H100/H200 HGX), the simulator's default
DRAM_RESERVE = 0.2  # sizing.size's default reserve for OS, vLLM processes and page cache
DEFAULT_CPU_GB = 100.0  # the simulator's cluster.cpu_cache_gb default (planner/simulate)
MODES = ("none", "native", "lmcache")
SIM_NOTE = (
    "simulated, not measured: planner/simulate with its defaults (MFU 50 % prior, an assumption); "
    "gains carry the simulator's error (gain_band: the largest in-sample miss of the simulator "
    "on published throughput changes in the working set's regime, benchmarks/calibrate_sim.py; "
    "no coverage level) and one seed's noise; an open loop at the given "
    "QPS shows throughput gains only when the cluster without offload cannot keep up — "
    "otherwise see the TTFT and prefill-compute rows"
)


def layout(engines: int, tp: int) -> tuple[int, int]:
    """(nodes, GPUs per node): as many engines per 8-GPU node as divide ``engines`` evenly."""
    per_node_max = max(1, GPUS_PER_NODE // tp)
    per_node = max(d for d in range(1, per_node_max + 1) if engines % d == 0)
    return engines // per_node, per_node * tp


def scenario_of(
    w: WhatIf, router: str | None = None, max_requests: int = MAX_REQUESTS
) -> tuple[dict[str, Any], list[str]]:
    """The simulator scenario of a what-if (offload set per run) and the notes it needs;
    `router` defaults to the what-if's assumed one, `max_requests` caps the run."""
    notes: list[str] = []
    nodes, gpn = layout(w.engines, w.tp)
    per_node = gpn // w.tp
    duration = w.duration_s
    if w.qps * duration > max_requests / (1 - WARMUP_FRACTION):
        duration = max(MIN_DURATION_S, max_requests / (1 - WARMUP_FRACTION) / w.qps)
        notes.append(
            f"simulated {duration:.0f} s instead of {w.duration_s:g} s to stay within "
            f"~{max_requests} requests per mode (a few seconds of wall time)"
        )
    router = router or w.assumed_router
    cluster: dict[str, Any] = {
        "nodes": nodes,
        "gpus_per_node": gpn,
        "gpu": w.gpu,
        "model": w.model,
        "tensor_parallel": w.tp,
        "router": router,
    }
    if router == "scorer":
        cluster["scorer"] = w.scorer_config()
    shared = round(w.prompt_tokens * w.prefix_share)
    shared = min(shared, w.prompt_tokens - 1)
    requests = max(1, math.ceil(w.qps * duration))
    workload: dict[str, Any] = {"qps": w.qps, "output_tokens": w.output_tokens, "repeat": True}
    if shared < 1:
        workload |= {"kind": "synthetic", "prompt_tokens": w.prompt_tokens}
    else:
        groups = max(1, round((w.prefix_tokens or shared) / shared))
        workload |= {
            "kind": "shared_prefix",
            "groups": groups,
            "system_prompt_tokens": shared,
            "question_tokens": w.prompt_tokens - shared,
            "prompts_per_group": max(1, min(1000, math.ceil(requests / groups))),
        }
        if w.prefix_tokens is None:
            notes.append(f"--prefix-tokens not given: one shared prefix of {shared} tokens")
    raw = {
        "name": "advise",
        "cluster": cluster,
        "workload": workload,
        "duration_s": duration,
        "warmup_s": WARMUP_FRACTION * duration,
        "seed": w.seed,
    }
    if w.cpu_gb is not None:
        usable = w.cpu_gb * (1 - DRAM_RESERVE)
        raw["_cpu_gb"] = {"native": usable / per_node, "lmcache": usable}
    else:
        notes.append(
            "--cpu-gb not given: the simulator's 100 GB per engine (native) / per node "
            "pool (lmcache) assumption"
        )
    return raw, notes


def _run_mode(raw: dict[str, Any], mode: str) -> tuple[dict[str, Any], list[float], list[float]]:
    """One simulation: its summary, per-engine KV-use samples and cluster KV-token samples."""
    from planner.simulate.cluster import Simulation  # noqa: PLC0415 - start-up: the simulator (and numpy) load when advise simulates, not on the API's start-up (api.app imports planner.advise)
    from planner.simulate.results import summarize  # noqa: PLC0415 - start-up: the simulator (and numpy) load when advise simulates, not on the API's start-up (api.app imports planner.advise)
    from planner.simulate.scenario import parse_scenario  # noqa: PLC0415 - start-up: the simulator (and numpy) load when advise simulates, not on the API's start-up (api.app imports planner.advise)

    run = {k: v for k, v in raw.items() if not k.startswith("_")}
    run["cluster"] = {**raw["cluster"], "offload": mode}
    if mode != "none" and "_cpu_gb" in raw:
        run["cluster"]["cpu_cache_gb"] = raw["_cpu_gb"][mode]
    sc = parse_scenario(run, where="advise scenario")
    sim = Simulation(sc)
    util: list[float] = []
    tokens: list[float] = []
    step = sc.duration_s / SAMPLES
    for i in range(1, SAMPLES + 1):
        t = i * step
        sim.advance_to(t, settle=True)
        if t < sc.warmup_s:
            continue
        snaps = sim.engine_snapshots()
        util += [s.gauges["kv_cache_usage_ratio"] for s in snaps]
        tokens.append(
            sum(
                s.gauges["kv_cache_usage_ratio"] * s.facts["num_gpu_blocks"] * s.facts["block_size"]
                for s in snaps
            )
        )
    sim.advance_to(sc.duration_s)
    result = summarize(sim)
    summary = dict(result.summary)
    summary["engine_kv_tokens"] = sc.cluster.num_gpu_blocks * sc.cluster.block_size
    return summary, util, tokens


def simulate_modes(
    raw: dict[str, Any], progress: Callable[[str], None] | None = None
) -> dict[str, tuple[dict[str, Any], list[float], list[float]]]:
    """Run the scenario once per mode, same seed and requests."""
    out = {}
    router = raw["cluster"]["router"]
    for mode in MODES:
        if progress:
            progress(f"kvscope advise: simulating router={router} offload={mode} …")
        out[mode] = _run_mode(raw, mode)
    return out


def quantile(values: list[float], q: float) -> float | None:
    import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off the API's start-up (api.app imports planner.advise)

    return float(np.quantile(values, q)) if values else None


def simulated_section(
    runs: dict[str, tuple[dict[str, Any], list[float], list[float]]],
    qps: float,
    regime: str = "fits",
) -> dict[str, Any]:
    """Per-mode figures and the gains against none."""
    base = runs["none"][0]
    base_c = base["prefill_tokens_computed"]
    modes: dict[str, Any] = {}
    for mode, (s, util, _) in runs.items():

        def rel(key: str, s: dict[str, Any] = s) -> float | None:
            a, b = s.get(key), base.get(key)
            return a / b - 1 if isinstance(a, int | float) and b else None

        window = s["measured_window_s"] or 1.0
        modes[mode] = {
            "total_tokens_per_s": s["total_tokens_per_s"],
            "ttft_mean_s": s["ttft_mean_s"],
            "ttft_p90_s": s.get("ttft_p90_s"),
            "preemptions": s["preemptions"],
            "completed_requests": s["completed_requests"],
            "offered_requests": qps * window,
            "prefix_hit_rate": s["prefix_hit_rate"],
            "external_hit_rate": s["external_hit_rate"],
            "kv_util_p50": quantile(util, 0.5),
            "kv_util_p95": quantile(util, 0.95),
            "prefill_tokens_computed": s["prefill_tokens_computed"],
            "reprefill_tokens": s["reprefill_tokens"],
            "throughput_gain": rel("total_tokens_per_s"),
            "throughput_gain_band": None,
            "ttft_change": rel("ttft_mean_s"),
            "prefill_compute_saved": (base_c - s["prefill_tokens_computed"]) / base_c
            if base_c
            else None,
            "wall_s": s.get("wall_s"),
        }
    band = BANDS[regime]
    for mode, row in modes.items():
        g = row["throughput_gain"]
        if mode != "none" and isinstance(g, int | float) and math.isfinite(g):
            row["throughput_gain_band"] = band.around(g)
    keeps_up = base["completed_requests"] >= 0.95 * qps * (base["measured_window_s"] or 1.0)
    return {
        "modes": modes,
        "none_keeps_up": keeps_up,
        "gain_band": band.to_dict(),
        "note": SIM_NOTE,
    }
