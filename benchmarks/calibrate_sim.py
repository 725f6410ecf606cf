"""Calibrate the cluster simulator against published end-to-end results.

    .venv/bin/python benchmarks/calibrate_sim.py            # markdown tables on stdout
    .venv/bin/python benchmarks/calibrate_sim.py --json     # rows, per-metric summary, bands
    .venv/bin/python benchmarks/calibrate_sim.py --write-band  # also rewrite advise's bands

The summary (metric_summary) gives, per metric class, the mean absolute error, the rows with
the sign wrong, the largest-miss band and that band rebuilt leaving one publication out;
identity rows (HBM only vs HBM only, 0 vs 0 by construction) are in none of its figures.

Published rows not in planner/domain/data/sources.yaml's text alone are in
benchmarks/calibration_data.json with their source URL and date.
- llm-d tiered-prefix-cache guide [source: llm-d-tiered-prefix-cache]: 16x H100, 8 servers at
  TP2, Qwen3-32B, 250 groups x 5 prompts, 16,000-token system prompt; HBM only vs CPU tier.
  Simulated as the benchmark ran: inference-perf's 8-stage ramp [source: inference-perf-loadgen]
  (calibration_data.json `load`), llm-d's optimized-baseline picker for HBM only and its
  tier-aware one for the CPU tier (`routers`), 5 seeds (their SD: one run's spread).

Published figures (entries of planner/domain/data/sources.yaml; `kvscope sources <id>`):
- GKE tiered KV cache (Google Cloud / LMCache blog 2025-10-07) [source: gke-tiered-kv-2025]:
  8x H100, Llama-3.3-70B,
  SGLang bench_serving generated-shared-prefix, 20 requests per system prompt, question 256,
  output 512, max concurrency 200, Tests 1-3 (cache 1.1-1.3 / 4.0-4.3 / 12.6-13.7 M tokens);
  best set-up vs HBM only.
- vLLM blog "Inside vLLM's New KV Offloading Connector" (2026-01-08)
  [source: vllm-offloading-connector-2026]: H100, Llama-3.1-8B,
  500 GB DRAM: CPU hit vs recompute TTFT 2-22x lower; 10,000 prefill-only 512-token
  requests with the GPU prefix cache off: throughput up to 9x with CPU hits; the DMA path
  costs ~0.5 % of throughput when nothing hits.

The GKE reproduction: one engine with TP 8 (its KV capacity, ~1.4 M tokens at
gpu_memory_utilization 0.9, matches Test 1's "1.1-1.3 M tokens fit HBM"); the "cache" of a
test counts every KV token of the dataset (the study's example command, 80 groups of a
1,000-token prompt, is 1.31 M tokens, Test 1's top), so groups = cache /
(prefix + 20 x (256 + 512)) with cache 1.2 / 4.15 / 13.15 M; SGLang's generated-shared-prefix
dataset shuffled once and each prompt sent once by 200 closed-loop clients
[source: sglang-bench-serving]; LMCache 0.3.3 in-process with the study's tiers: L1 = the
1 TiB of host DRAM, the local SSD (5 TiB) an L2 at the `local-nvme` tier's figures (the
study published no disk bandwidth), and 0.3.3's store and retrieve
[source: lmcache-0.3.3-source]: decode chunks and unfull chunks stored, GPU->CPU copies
blocking the step, disk hits read through transient L1 buffers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.simulate.cluster import Simulation
from planner.simulate.scenario import parse_scenario

GIB = 1024**3 / 1e9  # GB per GiB
DATA = Path(__file__).resolve().parent / "calibration_data.json"
BAND = Path(__file__).resolve().parents[1] / "planner" / "advise" / "sim_band.json"
# GKE tests: (cache tokens, {prefix: (best set-up, input throughput, mean TTFT, mean E2E)}),
# each change the best set-up's vs HBM only [source: gke-tiered-kv-2025]. Test 1 (fits HBM)
# published no figures, only "HBM-only is best; extra tiers add nothing": its rows say 0.
GKE_TESTS: dict[str, tuple[float, dict[int, tuple[str, float, float, float]]]] = {
    "Test 1": (1.2e6, {p: ("HBM", 0.0, 0.0, 0.0) for p in (1_000, 5_000, 10_000)}),
    "Test 2": (
        4.15e6,
        {
            1_000: ("HBM", 0.0, 0.0, 0.0),
            5_000: ("HBM+CPU", 0.16, -0.18, -0.14),
            10_000: ("HBM+CPU", 0.50, -0.44, -0.33),
            50_000: ("HBM+CPU+SSD", 1.79, -0.68, -0.64),
            100_000: ("HBM+CPU+SSD", 2.64, -0.79, -0.73),
        },
    ),
    "Test 3": (
        13.15e6,
        {
            1_000: ("HBM+CPU", 0.01, 0.05, -0.01),
            5_000: ("HBM+CPU", 0.27, -0.06, -0.21),
            10_000: ("HBM+CPU+SSD", 0.23, 1.21, -0.19),
            50_000: ("HBM+CPU+SSD", 0.69, 0.48, -0.41),
            100_000: ("HBM+CPU+SSD", 1.30, -0.03, -0.57),
        },
    ),
}
GKE_TEST2 = GKE_TESTS["Test 2"][1]
GKE_METRICS = {
    "input throughput": "throughput change",
    "mean TTFT": "TTFT change",
    "mean E2E": "E2E change",
}


def _run(raw: dict[str, Any]) -> Simulation:
    sim = Simulation(parse_scenario(raw, where="calibrate_sim"))
    sim.run()
    return sim


def _summary(raw: dict[str, Any]) -> dict[str, Any]:
    result = Simulation(parse_scenario(raw, where="calibrate_sim")).run()
    return result.summary


# LMCache 0.3.3's in-process connector [source: lmcache-0.3.3-source]: its vLLM v1 adapter
# stores decode chunks whatever save_decode_cache says, save_unfull_chunk defaults to true,
# wait_for_save synchronizes the GPU->CPU copy of every stored chunk, and a retrieve reads a
# disk chunk into a transient buffer of the CPU allocator without keeping it in L1
LMCACHE_033: dict[str, Any] = {
    "save_decode_cache": True,
    "save_unfull_chunk": True,
    "sync_store": True,
    "l2_promote": False,
}


def gke_raw(prefix: int, setup: str, cache_tokens: float = 4.15e6) -> dict[str, Any]:
    offload = "none" if setup == "HBM" else "lmcache"
    lmcache: dict[str, Any] = dict(LMCACHE_033)
    if setup == "HBM+CPU+SSD":
        lmcache["l2"] = {"tier": "local-nvme", "size_gb": 5 * 1024 * GIB}
    return {
        "name": f"gke-{cache_tokens / 1e6:g}M-{prefix // 1000}k-{setup}",
        "cluster": {
            "nodes": 1,
            "gpus_per_node": 8,
            "gpu": "h100-80gb",
            "model": "llama-3.3-70b",
            "tensor_parallel": 8,
            "offload": offload,
            "cpu_cache_gb": 1024 * GIB,
            "lmcache": lmcache,
        },
        "workload": {
            "kind": "shared_prefix",
            "groups": round(cache_tokens / (prefix + 20 * 768)),
            "prompts_per_group": 20,
            "system_prompt_tokens": prefix,
            "question_tokens": 256,
            "output_tokens": 512,
            "concurrency": 200,
        },
        "duration_s": 100_000,
        "seed": 1,
    }


def gke_rows() -> list[dict[str, Any]]:
    rows = []
    for test, (cache, cases) in GKE_TESTS.items():
        for prefix, (best, tput, ttft, e2e) in cases.items():
            base = _summary(gke_raw(prefix, "HBM", cache))
            setup = best if best != "HBM" else "HBM+CPU"
            tier = _summary(gke_raw(prefix, setup, cache))
            sim = {
                "input throughput": tier["input_tokens_per_s"] / base["input_tokens_per_s"] - 1,
                "mean TTFT": tier["ttft_mean_s"] / base["ttft_mean_s"] - 1,
                "mean E2E": tier["e2e_mean_s"] / base["e2e_mean_s"] - 1,
            }
            identity = best == "HBM" and sim["input throughput"] <= 0
            if identity:
                sim = dict.fromkeys(sim, 0.0)  # HBM only is the best set-up, as published
            for figure, published in (
                ("input throughput", tput),
                ("mean TTFT", ttft),
                ("mean E2E", e2e),
            ):
                rows.append(
                    {
                        "source": f"GKE tiered cache, {test}",
                        "publication": "gke-tiered-kv-2025",
                        "metric": GKE_METRICS[figure],
                        "identity": identity,
                        "regime": "spills" if test == "Test 3" else "fits",
                        "case": f"{prefix // 1000}k prefix, {best} vs HBM",
                        "figure": figure,
                        "published": published,
                        "simulated": round(sim[figure], 4),
                        "error_pp": round((sim[figure] - published) * 100, 1),
                        "unit": "change",
                    }
                )
    return rows


LLMD_SEEDS = (1, 2, 3, 4, 5)  # one published run is one Poisson draw: several simulated ones


def _llmd() -> dict[str, Any]:
    return dict(json.loads(DATA.read_text())["llm-d-tiered-prefix-cache"])


def llmd_raw(offload: str, seed: int) -> dict[str, Any]:
    """The guide's cluster under its benchmark's whole 8-stage ramp (calibration_data.json:
    load, routers): HBM only with llm-d's optimized baseline router, or native CPU offload
    with the tier-aware one."""
    data = _llmd()
    load = data["load"]
    router = data["routers"]["baseline" if offload == "none" else "tier"]
    return {
        "name": f"llmd-tiered-{offload}-seed{seed}",
        "cluster": {
            "nodes": 2,
            "gpus_per_node": 8,
            "gpu": "h100-80gb",
            "model": "qwen3-32b",
            "tensor_parallel": 2,
            "router": "scorer",
            "scorer": router["scorer"],
            "offload": offload,
            "cpu_cache_gb": 200 * GIB,
        },
        "workload": {
            "kind": "shared_prefix",
            "groups": 250,
            "prompts_per_group": 5,
            "system_prompt_tokens": 16_000,
            "question_tokens": 256,
            "output_tokens": 256,
            "arrival": load["type"],
            "stages": load["stages"],
            "stage_gap_s": load["interval_s"],
            "stage_dataset": "restart",
        },
        "duration_s": 100_000,
        "seed": seed,
    }


def _stage_means(offload: str) -> dict[float, list[dict[str, Any]]]:
    """Per stage rate, its summary row under every seed."""
    out: dict[float, list[dict[str, Any]]] = {}
    for seed in LLMD_SEEDS:
        for row in _summary(llmd_raw(offload, seed))["stages"]:
            out.setdefault(float(row["qps"]), []).append(row)
    return out


def llmd_rows() -> list[dict[str, Any]]:
    """The guide's four published stages: the throughput change (mean over seeds, and the
    seeds' standard deviation: how far one run of the benchmark strays), the absolute
    throughputs and mean TTFTs."""
    pub_rows = _llmd()["rows"]
    base, tier = _stage_means("none"), _stage_means("native")
    src, pub_id = "llm-d tiered prefix cache", "llm-d-tiered-prefix-cache"
    rows: list[dict[str, Any]] = []

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs)

    for pub in pub_rows:
        qps = float(pub["qps"])
        b, t = base[qps], tier[qps]
        gains = [
            tt["total_tokens_per_s"] / bb["total_tokens_per_s"] - 1
            for bb, tt in zip(b, t, strict=True)
        ]
        gain = mean(gains)
        sd = (sum((g - gain) ** 2 for g in gains) / (len(gains) - 1)) ** 0.5
        published = pub["tier_tok_s"] / pub["base_tok_s"] - 1
        case = f"QPS {qps:g}, HBM+CPU vs HBM"
        rows.append(
            {
                "source": src,
                "publication": pub_id,
                "metric": "throughput change",
                "regime": "fits",
                "case": case,
                "figure": "throughput",
                "published": round(published, 4),
                "simulated": round(gain, 4),
                "error_pp": round((gain - published) * 100, 1),
                "seed_sd_pp": round(sd * 100, 1),
                "unit": "change",
            }
        )
        for figure, metric, runs, key, pub_value in (
            ("HBM-only throughput (tok/s)", "baseline throughput", b, "total_tokens_per_s",
             pub["base_tok_s"]),
            ("HBM+CPU throughput (tok/s)", "tiered throughput", t, "total_tokens_per_s",
             pub["tier_tok_s"]),
            ("HBM-only mean TTFT (s)", "baseline mean TTFT", b, "ttft_mean_s", pub["base_ttft_s"]),
            ("HBM+CPU mean TTFT (s)", "tiered mean TTFT", t, "ttft_mean_s", pub["tier_ttft_s"]),
        ):  # fmt: skip
            rows.append(
                {
                    "source": src,
                    "publication": pub_id,
                    "metric": metric,
                    "case": case,
                    "figure": figure,
                    "published": float(pub_value),
                    "simulated": round(mean([float(r[key]) for r in runs]), 2),
                    "error_pp": None,
                    "unit": "abs",
                }
            )
    return rows


# A row's regime: does the benchmark's KV working set fit HBM + the CPU tier ("fits": GKE
# Tests 1-2, llm-d's 4.64 M tokens against 2.38 M HBM + 6.6 M CPU, the blog's single
# engine) or spill beyond it ("spills": GKE Test 3, 12.6-13.7 M tokens against 1.4 M HBM +
# 3.4 M in 1 TiB of DRAM). advise picks the band of its what-if's regime.
REGIMES = ("fits", "spills")


def _blog_cluster(offload: str, prefix_caching: bool) -> dict[str, Any]:
    return {
        "nodes": 1,
        "gpus_per_node": 1,
        "gpu": "h100-80gb",
        "model": "llama-3.1-8b",
        "offload": offload,
        "cpu_cache_gb": 500,
        "enable_prefix_caching": prefix_caching,
    }


def ttft_ratio(prompt: int) -> float:
    """Recompute TTFT / CPU-hit TTFT of one request (idle engine, GPU prefix cache off)."""
    raw = {
        "cluster": _blog_cluster("native", False),
        "workload": {
            "kind": "shared_prefix",
            "groups": 1,
            "prompts_per_group": 1,
            "system_prompt_tokens": prompt - 1,
            "question_tokens": 1,
            "output_tokens": 1,
            "concurrency": 1,
            "repeat": True,
            "num_requests": 2,
            "think_time_s": 10.0,
        },
        "duration_s": 10_000,
    }
    first, second = _run(raw).completed[:2]
    return (first[1] - first[0]) / (second[1] - second[0])


def prefill_only_speedup(n: int = 5_000) -> float:
    """Throughput of n prefill-only 512-token prompts served from CPU vs recomputed.

    The blog sent 10,000 prompts; at 128 KiB/token they are 671 GB, more than its 500 GB pool,
    and a second pass in the same order would miss everything under LRU, so the "up to 9x"
    (all hits) is reproduced with 5,000 prompts (336 GB) read twice.
    """

    def raw(offload: str, passes: int) -> dict[str, Any]:
        return {
            "cluster": _blog_cluster(offload, False),
            "workload": {
                "kind": "shared_prefix",
                "groups": n,
                "prompts_per_group": 1,
                "system_prompt_tokens": 511,
                "question_tokens": 1,
                "output_tokens": 1,
                "concurrency": 256,
                "order": "grouped",
                "repeat": passes > 1,
                "num_requests": n * passes,
            },
            "duration_s": 100_000,
        }

    cold = _run(raw("none", 1)).completed
    warm = [c for c in _run(raw("native", 2)).completed if c[6] >= n]
    rate_cold = len(cold) / (max(c[2] for c in cold) - min(c[0] for c in cold))
    rate_warm = len(warm) / (max(c[2] for c in warm) - min(c[0] for c in warm))
    return rate_warm / rate_cold


def zero_hit_cost() -> float:
    """Throughput change of native offload when nothing hits (unique 512-token prompts)."""
    wl = {
        "kind": "synthetic",
        "prompt_tokens": 512,
        "output_tokens": 1,
        "concurrency": 256,
        "num_requests": 10_000,
    }
    none = _summary(
        {"cluster": _blog_cluster("none", False), "workload": wl, "duration_s": 100_000}
    )
    native = _summary(
        {"cluster": _blog_cluster("native", False), "workload": wl, "duration_s": 100_000}
    )
    return float(native["total_tokens_per_s"] / none["total_tokens_per_s"] - 1)


def blog_rows() -> list[dict[str, Any]]:
    src, pub = "vLLM offloading-connector blog", "vllm-offloading-connector-2026"
    ratios = {p: ttft_ratio(p) for p in (512, 2048, 8192, 32768, 65536)}
    cost = zero_hit_cost()
    speedup = prefill_only_speedup()
    return [
        {
            "source": src,
            "publication": pub,
            "metric": "TTFT ratio, CPU hit vs recompute",
            "case": "CPU hit vs recompute, 512-token prompt",
            "figure": "TTFT ratio (low end)",
            "published": 2.0,
            "simulated": round(ratios[512], 2),
            "error_pp": None,
            "unit": "x",
        },
        {
            "source": src,
            "publication": pub,
            "metric": "TTFT ratio, CPU hit vs recompute",
            "case": "CPU hit vs recompute, 64k-token prompt",
            "figure": "TTFT ratio (high end)",
            "published": 22.0,
            "simulated": round(ratios[65536], 2),
            "error_pp": None,
            "unit": "x",
        },
        {
            "source": src,
            "publication": pub,
            "metric": "prefill-only throughput ratio",
            "case": "prefill-only 512-token prompts, all CPU hits, no GPU cache",
            "figure": "throughput, CPU hits vs recompute",
            "published": 9.0,
            "simulated": round(speedup, 2),
            "error_pp": None,
            "unit": "x",
        },
        {
            "source": src,
            "publication": pub,
            "metric": "throughput change",
            "case": "DMA offload path, 0 % hit",
            "figure": "throughput change",
            "published": -0.005,
            "simulated": round(cost, 4),
            "error_pp": round((cost + 0.005) * 100, 2),
            "unit": "change",
        },
        {
            "source": src,
            "publication": pub,
            "metric": None,
            "case": "TTFT ratio by prompt (512/2k/8k/32k/64k)",
            "figure": "simulated ratios",
            "published": None,
            "simulated": [round(ratios[p], 1) for p in sorted(ratios)],
            "error_pp": None,
            "unit": "x",
        },
    ]


def _fmt(value: Any, unit: str) -> str:
    if value is None:
        return "–"
    if isinstance(value, list):
        return "/".join(f"{v:g}" for v in value)
    if unit == "change":
        return f"{value:+.1%}"
    if unit == "abs":
        return f"{value:,.2f}"
    return f"{value:.1f}×"


def render(rows: list[dict[str, Any]]) -> str:
    out = [
        "| source | case | figure | published | simulated | error |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        err = "–" if r["error_pp"] is None else f"{r['error_pp']:+.1f} pp"
        if is_identity(r):
            err = "identity (0 vs 0)"
        if r.get("seed_sd_pp") is not None:
            err += f" (seeds ±{r['seed_sd_pp']:.1f})"
        if r["error_pp"] is None and isinstance(r["published"], float) and r["unit"] != "change":
            err = f"{(r['simulated'] / r['published'] - 1):+.0%}"
        out.append(
            f"| {r['source']} | {r['case']} | {r['figure']} | "
            f"{_fmt(r['published'], r['unit'])} | {_fmt(r['simulated'], r['unit'])} | "
            f"{err} |"
        )
    return "\n".join(out)


BAND_KIND = "largest_in_sample_miss"
BAND_SOURCE = "benchmarks/calibrate_sim.py"
# advise's band rows: the published throughput change of a set-up whose tier hits (GKE input
# throughput, llm-d throughput); the blog's 0 %-hit row measures the DMA path's overhead.
BAND_FIGURES = ("input throughput", "throughput")
# The metric classes of the summary table, in its order (a row's `metric`).
METRICS = (
    "throughput change",
    "TTFT change",
    "E2E change",
    "baseline throughput",
    "tiered throughput",
    "baseline mean TTFT",
    "tiered mean TTFT",
    "TTFT ratio, CPU hit vs recompute",
    "prefill-only throughput ratio",
)
_COVERS = 1e-9  # a miss this far over a band's edge still counts as covered (float rounding)


@dataclass(frozen=True, slots=True)
class Loso:
    """Leave one group (a publication, or a GKE test) out: each group's rows checked against
    the band rebuilt (band_terms) from the other groups' rows only."""

    groups: int
    rows: int  # held-out rows checked: every row, once
    outside: int  # rows whose miss exceeded the band rebuilt without their group
    excess: float  # the largest such excess (a fraction: 0.49 = 49 pp); 0 when none

    def to_dict(self) -> dict[str, Any]:
        return {
            "groups": self.groups,
            "rows": self.rows,
            "outside": self.outside,
            "excess": round(self.excess, 4),
        }


def is_identity(row: dict[str, Any]) -> bool:
    """HBM only against HBM only (the published best set-up is HBM only and the simulated
    tier did not beat it): 0 vs 0 by construction, in no headline figure."""
    return bool(row.get("identity"))


def band_terms(pairs: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(a, b) of the band ±(a + b·|g|) over (|published gain|, |miss|) pairs: a = the largest
    miss at gains <= 50 %, b = the least slope that also covers every larger gain's miss;
    rounded as sim_band.json stores them (b upwards, so the band still covers its rows)."""
    a = max([e for g, e in pairs if g <= 0.5], default=0.0)
    b = max([max(0.0, (e - a) / g) for g, e in pairs if g > 0.5], default=0.0)
    return round(a, 4), round(b + 5e-5, 4)


def loso(points: Sequence[tuple[str, float, float]]) -> Loso | None:
    """Leave one group out over (group, |published gain|, |miss|) points: the band of the
    other groups' points against each held-out point. None with fewer than two groups."""
    groups = sorted({grp for grp, _, _ in points})
    if len(groups) < 2:
        return None
    outside, excess = 0, 0.0
    for held in groups:
        a, b = band_terms([(g, e) for grp, g, e in points if grp != held])
        for grp, g, e in points:
            over = e - (a + b * g)
            if grp == held and over > _COVERS:
                outside += 1
                excess = max(excess, over)
    return Loso(len(groups), len(points), outside, excess)


def _row_set(rows: list[dict[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["source"]] = counts.get(r["source"], 0) + 1
    return "; ".join(f"{src} ({n} rows)" for src, n in counts.items())


def gain_band(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """advise's bands ±(a + b·|g|) on a simulated throughput gain g, one per regime, from its
    throughput-delta rows (identity rows left out): band_terms over the rows, and the same
    derivation left one publication out (loso_*). In-sample each covers its rows by
    construction; it carries no coverage level."""
    out: dict[str, Any] = {}
    for regime in REGIMES:
        picked = [
            r for r in rows
            if r["figure"] in BAND_FIGURES and r["error_pp"] is not None
            and r.get("regime", "fits") == regime
        ]  # fmt: skip
        kept = [r for r in picked if not is_identity(r)]
        pairs = [(abs(float(r["published"])), abs(float(r["error_pp"])) / 100) for r in kept]
        a, b = band_terms(pairs)
        held = loso([(r["publication"], g, e) for r, (g, e) in zip(kept, pairs, strict=True)])
        out[regime] = {
            "kind": BAND_KIND,
            "absolute": a,
            "relative": b,
            "rows": len(kept),
            "row_set": _row_set(kept),
            "identity_rows_excluded": len(picked) - len(kept),
            "publications": len({r["publication"] for r in kept}),
            "loso_rows": held.rows if held else 0,
            "loso_rows_outside": held.outside if held else None,
            "loso_excess_pp": round(held.excess * 100, 1) if held else None,
        }
    out["what"] = (
        "±(absolute + relative·|gain|): the simulator's largest in-sample miss on the "
        "published throughput changes of row_set (covers them by construction, no coverage "
        "level); loso_*: the same derivation from the other publications' rows only, checked "
        "on each held-out publication's rows (rows outside it, the largest excess in pp; "
        "null: one publication, nothing to hold out)"
    )
    out["source"] = BAND_SOURCE
    return out


def signed_error(row: dict[str, Any]) -> float:
    """Simulated minus published: in points of change (0.1 = 10 pp) for `change` rows, relative
    (simulated / published − 1) for absolute figures and ratios."""
    if row["unit"] == "change":
        return float(row["error_pp"]) / 100
    return float(row["simulated"]) / float(row["published"]) - 1


def sign_wrong(row: dict[str, Any]) -> bool | None:
    """The simulated change points the other way (ratios: the other side of 1); None for
    absolute figures, which have no direction."""
    pub, sim = float(row["published"]), float(row["simulated"])
    if row["unit"] == "change":
        return pub * sim < 0
    if row["unit"] == "x":
        return (pub - 1) * (sim - 1) < 0
    return None


def _held_out(
    rows: list[dict[str, Any]], pairs: list[tuple[float, float]], key: str
) -> dict[str, Any] | None:
    cv = loso([(r[key], g, e) for r, (g, e) in zip(rows, pairs, strict=True)])
    return cv.to_dict() if cv else None


def metric_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per metric class (identity rows left out of every figure): rows, publications, the mean
    absolute error, the rows with the sign wrong, the in-sample band (band_terms, |g| = the
    published change; absolute figures and ratios: the largest relative miss) and that
    band left one publication out and left one source (GKE test) out."""
    out = []
    for metric in METRICS:
        picked = [r for r in rows if r.get("metric") == metric and r["published"] is not None]
        kept = [r for r in picked if not is_identity(r)]
        change = all(r["unit"] == "change" for r in kept)
        pairs = [
            (abs(float(r["published"])) if change else 0.0, abs(signed_error(r))) for r in kept
        ]
        a, b = band_terms(pairs)
        wrong = [sign_wrong(r) for r in kept]
        out.append(
            {
                "metric": metric,
                "unit": "pp" if change else "relative",
                "rows": len(kept),
                "identity_rows": len(picked) - len(kept),
                "publications": len({r["publication"] for r in kept}),
                "mean_abs_error": round(sum(e for _, e in pairs) / len(pairs), 4)
                if pairs
                else None,
                "sign_wrong": None if None in wrong else sum(map(bool, wrong)),
                "band_absolute": a,
                "band_relative": b if change else None,
                "loso_publication": _held_out(kept, pairs, "publication"),
                "loso_source": _held_out(kept, pairs, "source"),
            }
        )
    return out


def identity_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if is_identity(r)]


def _held_text(cv: dict[str, Any] | None, unit: str, group: str) -> str:
    if cv is None:
        return f"– (one {group})"
    if not cv["outside"]:
        return f"0 of {cv['rows']} outside"
    size = f"{cv['excess'] * 100:.1f} pp" if unit == "pp" else f"{cv['excess']:.0%}"
    return f"{cv['outside']} of {cv['rows']} outside, by up to {size}"


def render_metrics(summary: list[dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    out = [
        "| metric | rows | publications | mean abs error | sign wrong | in-sample band "
        "(largest miss) | leave one publication out | leave one source (GKE test) out |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in summary:
        if m["unit"] == "pp":
            err = f"{m['mean_abs_error'] * 100:.1f} pp"
            band = f"±{m['band_absolute'] * 100:.1f} pp"
            if m["band_relative"] >= 0.005:  # b = 0 is stored as 0.0001 (rounded upwards)
                band = f"±({band[1:]} + {m['band_relative']:.0%} of \\|g\\|)"
        else:
            err = f"{m['mean_abs_error']:.1%}"
            band = f"±{m['band_absolute']:.0%}"
        wrong = "–" if m["sign_wrong"] is None else f"{m['sign_wrong']} of {m['rows']}"
        out.append(
            f"| {m['metric']} | {m['rows']} | {m['publications']} | {err} | {wrong} | {band} | "
            f"{_held_text(m['loso_publication'], m['unit'], 'publication')} | "
            f"{_held_text(m['loso_source'], m['unit'], 'source')} |"
        )
    ident = identity_rows(rows)
    cases: dict[str, list[str]] = {}
    for r in ident:
        case = f"{r['source']}, {r['case'].split(',')[0]}"
        cases.setdefault(case, []).append(r["figure"])
    out.append(
        f"\nIdentity rows, in no figure above ({len(ident)}: the published best set-up is HBM "
        "only and the simulated tier did not beat it, so published and simulated are 0 by "
        "construction): " + "; ".join(f"{c} ({', '.join(f)})" for c, f in cases.items())
    )
    return "\n".join(out)


def band_text(band: dict[str, Any]) -> list[str]:
    lines = []
    for regime in REGIMES:
        b = band[regime]
        if b["loso_excess_pp"] is None:
            held = "left one publication out: not checkable, one publication"
        else:
            held = (
                f"left one publication out: {b['loso_rows_outside']} of {b['loso_rows']} rows "
                f"outside, by up to {b['loso_excess_pp']:.1f} pp"
            )
        lines.append(
            f"advise band ({regime}): ±({b['absolute'] * 100:.1f} pp + {b['relative']:.1%} of "
            f"|gain|), the largest in-sample miss over {b['rows']} rows ({b['row_set']}); {held}"
        )
    return lines


def all_rows() -> list[dict[str, Any]]:
    return gke_rows() + llmd_rows() + blog_rows()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="rows as JSON on stdout")
    parser.add_argument(
        "--write-band", action="store_true", help=f"rewrite {BAND.name} from the table's errors"
    )
    args = parser.parse_args()
    started = time.perf_counter()
    rows = all_rows()
    summary = metric_summary(rows)
    band = gain_band(rows)
    if args.write_band:
        BAND.write_text(json.dumps(band, indent=2) + "\n")
    if args.json:
        print(json.dumps({"rows": rows, "metrics": summary, "band": band}, indent=2))
    else:
        print(render(rows))
        print()
        print(render_metrics(summary, rows))
        print()
        print("\n".join(band_text(band)))
    print(
        f"calibrate_sim: {len(rows)} rows in {time.perf_counter() - started:.1f} s", file=sys.stderr
    )


if __name__ == "__main__":
    main()
