"""Calibrate the cluster simulator against published end-to-end results.

    .venv/bin/python benchmarks/calibrate_sim.py            # markdown table on stdout
    .venv/bin/python benchmarks/calibrate_sim.py --json     # the same rows as JSON
    .venv/bin/python benchmarks/calibrate_sim.py --write-band  # also rewrite advise's bands

Published rows not in planner/model/data/sources.yaml's text alone are in
benchmarks/calibration_data.json with their source URL and date.
- llm-d tiered-prefix-cache guide [source: llm-d-tiered-prefix-cache]: 16x H100, 8 servers at
  TP2, Qwen3-32B, 250 groups x 5 prompts, 16,000-token system prompt; HBM only vs CPU tier.
  Simulated as the benchmark ran: inference-perf's 8-stage ramp [source: inference-perf-loadgen]
  (calibration_data.json `load`), llm-d's optimized-baseline picker for HBM only and its
  tier-aware one for the CPU tier (`routers`), 5 seeds (their SD: one run's spread).

Published figures (entries of planner/model/data/sources.yaml; `kvscope sources <id>`):
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
            if best == "HBM" and sim["input throughput"] <= 0:
                sim = dict.fromkeys(sim, 0.0)  # HBM only is the best set-up, as published
            for figure, published in (
                ("input throughput", tput),
                ("mean TTFT", ttft),
                ("mean E2E", e2e),
            ):
                rows.append(
                    {
                        "source": f"GKE tiered cache, {test}",
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
    src = "llm-d tiered prefix cache"
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
        for figure, runs, key, pub_value in (
            ("HBM-only throughput (tok/s)", b, "total_tokens_per_s", pub["base_tok_s"]),
            ("HBM+CPU throughput (tok/s)", t, "total_tokens_per_s", pub["tier_tok_s"]),
            ("HBM-only mean TTFT (s)", b, "ttft_mean_s", pub["base_ttft_s"]),
            ("HBM+CPU mean TTFT (s)", t, "ttft_mean_s", pub["tier_ttft_s"]),
        ):
            rows.append(
                {
                    "source": src,
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


def gain_band(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """advise's calibration bands ±(a + b·|g|) on a simulated throughput gain g, one per
    regime, from the throughput-delta rows: a = the largest miss among published gains
    <= 50 %, b = the least slope that also covers every larger gain's miss. Each covers its
    rows by construction."""
    out: dict[str, Any] = {}
    for regime in REGIMES:
        pairs = [
            (abs(float(r["published"])), abs(float(r["error_pp"])) / 100)
            for r in rows
            if r["unit"] == "change" and r["figure"] in ("input throughput", "throughput")
            and r["error_pp"] is not None and r.get("regime", "fits") == regime
        ]  # fmt: skip
        a = max([e for g, e in pairs if g <= 0.5], default=0.0)
        b = max([max(0.0, (e - a) / g) for g, e in pairs if g > 0.5], default=0.0)
        out[regime] = {"absolute": round(a, 4), "relative": round(b + 5e-5, 4), "rows": len(pairs)}
    out["source"] = (
        "benchmarks/calibrate_sim.py --write-band (throughput-delta rows: GKE Tests 1-3, "
        "llm-d tiered prefix cache, vLLM offloading-connector blog)"
    )
    return out


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
    src = "vLLM offloading-connector blog"
    ratios = {p: ttft_ratio(p) for p in (512, 2048, 8192, 32768, 65536)}
    cost = zero_hit_cost()
    speedup = prefill_only_speedup()
    return [
        {
            "source": src,
            "case": "CPU hit vs recompute, 512-token prompt",
            "figure": "TTFT ratio (low end)",
            "published": 2.0,
            "simulated": round(ratios[512], 2),
            "error_pp": None,
            "unit": "x",
        },
        {
            "source": src,
            "case": "CPU hit vs recompute, 64k-token prompt",
            "figure": "TTFT ratio (high end)",
            "published": 22.0,
            "simulated": round(ratios[65536], 2),
            "error_pp": None,
            "unit": "x",
        },
        {
            "source": src,
            "case": "prefill-only 512-token prompts, all CPU hits, no GPU cache",
            "figure": "throughput, CPU hits vs recompute",
            "published": 9.0,
            "simulated": round(speedup, 2),
            "error_pp": None,
            "unit": "x",
        },
        {
            "source": src,
            "case": "DMA offload path, 0 % hit",
            "figure": "throughput change",
            "published": -0.005,
            "simulated": round(cost, 4),
            "error_pp": round((cost + 0.005) * 100, 2),
            "unit": "change",
        },
        {
            "source": src,
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


def overall(rows: list[dict[str, Any]]) -> dict[str, float]:
    """One score per kind of row, to compare two versions of the simulator: the mean absolute
    error in percentage points of the `change` rows (GKE Test 2, DMA cost) and the mean
    absolute relative error of the `x` rows with a published figure (blog ratios)."""
    pp = [abs(r["error_pp"]) for r in rows if r["unit"] == "change" and r["error_pp"] is not None]
    rel = [
        abs(r["simulated"] / r["published"] - 1)
        for r in rows
        if r["unit"] in ("x", "abs") and isinstance(r["published"], float)
    ]
    return {
        "change_rows_mean_abs_error_pp": round(sum(pp) / len(pp), 2) if pp else 0.0,
        "ratio_rows_mean_abs_relative_error": round(sum(rel) / len(rel), 4) if rel else 0.0,
    }


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
    score = overall(rows)
    band = gain_band(rows)
    if args.write_band:
        BAND.write_text(json.dumps(band, indent=2) + "\n")
    if args.json:
        print(json.dumps({"rows": rows, "overall": score}, indent=2))
    else:
        print(render(rows))
        print(
            f"\noverall: change rows {score['change_rows_mean_abs_error_pp']:.2f} pp mean "
            f"absolute error; ratio rows {score['ratio_rows_mean_abs_relative_error']:.1%} mean "
            "absolute relative error (ratio and absolute rows)"
        )
        for regime in REGIMES:
            b = band[regime]
            print(
                f"advise band ({regime}): ±({b['absolute']:.1%} + {b['relative']:.0%} of "
                f"|gain|) from {b['rows']} throughput-delta rows"
            )
    print(
        f"calibrate_sim: {len(rows)} rows in {time.perf_counter() - started:.1f} s", file=sys.stderr
    )


if __name__ == "__main__":
    main()
